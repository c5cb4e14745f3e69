"""Layer 2: the front-door stacks reach CREATE_COMPLETE in moto's CloudFormation with every resource
created, and what matters reads back through the service APIs.

moto lacks CloudFormation models for Cloud Map, some SG/SNS/S3 policy types, metric-math alarms and
Application Auto Scaling; moto_cfn's stand-ins create them, calling moto's backends where moto has
one, so boto3 reads them back.
"""

from __future__ import annotations

import pytest

import contract
from front_app import NAMESPACE, UNITS_PER_CELL, template
from moto_cfn import MotoCloudFormation
from stacks.network import VPC_CIDR

STACKS = ("Network", "Discovery", "Front", "Observability", "Router")


@pytest.fixture(scope="module")
def deployed():
    with MotoCloudFormation() as cfn:
        # moto's ELB checks that the listener's certificate exists in ACM, like AWS does.
        arn = cfn.client("acm").request_certificate(DomainName="llm.example.com")["CertificateArn"]
        for name in STACKS:
            cfn.create_stack(name, template(name, certificate_arn=arn))
        cfn.certificate_arn = arn
        yield cfn


@pytest.mark.parametrize("stack", STACKS)
def test_stack_is_create_complete_with_every_template_resource_created(deployed, stack):
    cfn = deployed.client("cloudformation")
    assert cfn.describe_stacks(StackName=stack)["Stacks"][0]["StackStatus"] == "CREATE_COMPLETE"
    resources = template(stack, certificate_arn=deployed.certificate_arn)["Resources"]
    created = deployed.created_resources(stack)
    assert set(created) == set(resources), sorted(set(resources) - set(created))
    for logical, summary in created.items():
        assert summary["ResourceType"] == resources[logical]["Type"], logical


def test_target_groups_read_back_with_the_router_health_check(deployed):
    elbv2 = deployed.client("elbv2")
    groups = elbv2.describe_target_groups()["TargetGroups"]
    assert len(groups) == 2
    for g in groups:
        assert (g["Port"], g["TargetType"], g["HealthCheckPath"]) == (
            contract.ROUTER_PORT, "ip", contract.ROUTER_HEALTH_PATH)
        assert (g["HealthCheckIntervalSeconds"], g["HealthCheckTimeoutSeconds"]) == (10, 5)
        assert (g["HealthyThresholdCount"], g["UnhealthyThresholdCount"]) == (2, 3)
        # moto 5.2.5 drops TargetGroupAttributes from CloudFormation (it reports the 300 s
        # default); the 60 s deregistration delay is asserted on the template in test_front.py.


def test_listeners_and_weighted_rules_read_back(deployed):
    elbv2 = deployed.client("elbv2")
    (alb,) = elbv2.describe_load_balancers()["LoadBalancers"]
    assert alb["Scheme"] == "internet-facing"
    listeners = {l["Port"]: l for l in elbv2.describe_listeners(
        LoadBalancerArn=alb["LoadBalancerArn"])["Listeners"]}
    assert set(listeners) == {443, 80, contract.ROUTER_TEST_PORT}
    assert listeners[443]["Protocol"] == "HTTPS"
    groups = {g["TargetGroupArn"]: g["TargetGroupName"] for g in
              elbv2.describe_target_groups()["TargetGroups"]}
    for port in (443, contract.ROUTER_TEST_PORT):
        rules = [r for r in elbv2.describe_rules(ListenerArn=listeners[port]["ListenerArn"])["Rules"]
                 if not r["IsDefault"]]
        (rule,) = rules
        weights = sorted(tg["Weight"] for tg in rule["Actions"][0]["ForwardConfig"]["TargetGroups"])
        assert weights == [0, 100]
        assert {tg["TargetGroupArn"] for tg in rule["Actions"][0]["ForwardConfig"]["TargetGroups"]} \
            == set(groups)


def test_security_groups_read_back_with_exactly_the_request_path_rules(deployed):
    ec2 = deployed.client("ec2")
    groups = {g["GroupId"]: g for g in ec2.describe_security_groups()["SecurityGroups"]}
    by_desc = {g["Description"].split(":")[0]: g for g in groups.values()}
    alb, router = by_desc["flotilla ALB"], by_desc["flotilla router tasks"]

    def rules(perms):
        out = set()
        for p in perms:
            if p["IpProtocol"] == "-1":
                # moto ignores a template's inline SecurityGroupEgress and keeps EC2's default
                # allow-all egress, so egress (all inline here) is asserted on the template only.
                continue
            for r in p.get("IpRanges", []):
                out.add((p["FromPort"], r["CidrIp"]))
            for r in p.get("UserIdGroupPairs", []):
                out.add((p["FromPort"], groups[r["GroupId"]]["Description"].split(":")[0]))
        return out

    assert rules(alb["IpPermissions"]) == {(443, "0.0.0.0/0"), (80, "0.0.0.0/0"),
                                           (contract.ROUTER_TEST_PORT, VPC_CIDR)}
    assert rules(router["IpPermissions"]) == {(contract.ROUTER_PORT, "flotilla ALB")}


def test_router_service_and_task_definition_read_back(deployed):
    ecs = deployed.client("ecs")
    (cluster,) = ecs.list_clusters()["clusterArns"]
    (service_arn,) = ecs.list_services(cluster=cluster)["serviceArns"]
    (service,) = ecs.describe_services(cluster=cluster, services=[service_arn])["services"]
    assert service["desiredCount"] == 2
    task = ecs.describe_task_definition(taskDefinition=service["taskDefinition"])["taskDefinition"]
    (container,) = task["containerDefinitions"]
    assert container["command"] == contract.ROUTER_COMMAND
    env = {e["name"]: e["value"] for e in container["environment"]}
    assert env[contract.ENV_DISCOVERY] == "cloudmap"
    assert env[contract.ENV_CLOUDMAP_NAMESPACE] == NAMESPACE
    # (moto keeps neither NetworkMode nor RequiresCompatibilities from CloudFormation: the
    # template tests assert awsvpc/Fargate.)


def test_cloud_map_namespace_and_units_service_read_back(deployed):
    sd = deployed.client("servicediscovery")
    (ns,) = sd.list_namespaces()["Namespaces"]
    assert (ns["Name"], ns["Type"]) == (NAMESPACE, "HTTP")
    (svc,) = sd.list_services()["Services"]
    assert svc["Name"] == "units"
    assert sd.get_service(Id=svc["Id"])["Service"]["NamespaceId"] == ns["Id"]


def test_alarms_read_back_with_sns_actions(deployed):
    cw = deployed.client("cloudwatch")
    alarms = cw.describe_alarms()["MetricAlarms"]
    assert len(alarms) == 4 + len(UNITS_PER_CELL)
    (topic,) = deployed.client("sns").list_topics()["Topics"]
    for alarm in alarms:
        assert alarm["AlarmActions"] == [topic["TopicArn"]]
