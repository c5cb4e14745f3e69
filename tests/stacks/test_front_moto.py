"""Layer 2: the front-door stacks reach CREATE_COMPLETE in moto's CloudFormation with every resource
created, and what matters reads back through the service APIs.

moto lacks CloudFormation models for Cloud Map, some SG/SNS/S3 policy types and Application Auto
Scaling; the stand-ins below (and moto_cfn's) create them, calling moto's backends where moto has one
so boto3 reads them back.
"""

from __future__ import annotations

import contextlib
from typing import Any
from unittest import mock

import pytest

import contract
from front_app import NAMESPACE, UNITS_PER_CELL, template
from moto_cfn import MotoCloudFormation, StandIn

STACKS = ("TestVpc", "Discovery", "Front", "Observability", "Router")


def _servicediscovery(account_id: str, region_name: str):
    from moto.servicediscovery.models import servicediscovery_backends
    return servicediscovery_backends[account_id][region_name]


class HttpNamespace(StandIn):
    TYPE = "AWS::ServiceDiscovery::HttpNamespace"
    REQUIRED = ("Name",)
    ATTRIBUTES = ("Id", "Arn")

    def create(self) -> None:
        backend = _servicediscovery(self.account_id, self.region_name)
        backend.create_http_namespace(name=self.properties["Name"], creator_request_id=self.name,
                                      description=self.properties.get("Description", ""), tags=[])
        (self.namespace,) = [n for n in backend.list_namespaces() if n.name == self.properties["Name"]]

    @property
    def physical_resource_id(self) -> str:
        return self.namespace.id

    def attribute(self, attr: str) -> Any:
        return self.namespace.id if attr == "Id" else self.namespace.arn


class CloudMapService(StandIn):
    TYPE = "AWS::ServiceDiscovery::Service"
    REQUIRED = ("Name", "NamespaceId")
    ATTRIBUTES = ("Id", "Arn", "Name")

    def create(self) -> None:
        p = self.properties
        self.service = _servicediscovery(self.account_id, self.region_name).create_service(
            name=p["Name"], namespace_id=p["NamespaceId"], creator_request_id=self.name,
            description=p.get("Description", ""), dns_config=p.get("DnsConfig"),
            health_check_config=None,
            health_check_custom_config={"FailureThreshold": p["HealthCheckCustomConfig"]["FailureThreshold"]}
            if "HealthCheckCustomConfig" in p else None,
            tags=[], service_type="HTTP",
        )

    @property
    def physical_resource_id(self) -> str:
        return self.service.id

    def attribute(self, attr: str) -> Any:
        return {"Id": self.service.id, "Arn": self.service.arn, "Name": self.service.name}[attr]


class SecurityGroupEgress(StandIn):
    """Authorizes the egress rule in moto's EC2 backend, so describe_security_groups shows it."""

    TYPE = "AWS::EC2::SecurityGroupEgress"
    REQUIRED = ("GroupId", "IpProtocol")

    def create(self) -> None:
        import boto3
        p = self.properties
        permission = {"IpProtocol": p["IpProtocol"], "FromPort": p["FromPort"], "ToPort": p["ToPort"]}
        if "DestinationSecurityGroupId" in p:
            permission["UserIdGroupPairs"] = [{"GroupId": p["DestinationSecurityGroupId"]}]
        else:
            permission["IpRanges"] = [{"CidrIp": p["CidrIp"]}]
        boto3.client("ec2", region_name=self.region_name, aws_access_key_id="testing",
                     aws_secret_access_key="testing").authorize_security_group_egress(
            GroupId=p["GroupId"], IpPermissions=[permission])


class MetricAlarm(StandIn):
    """Creates the alarm, metric-math queries included, in moto's CloudWatch backend."""

    TYPE = "AWS::CloudWatch::Alarm"
    REQUIRED = ("ComparisonOperator", "EvaluationPeriods", "Threshold")
    ATTRIBUTES = ("Arn",)

    def create(self) -> None:
        from moto.cloudwatch.models import (Dimension, Metric, MetricDataQuery, MetricStat,
                                            cloudwatch_backends)
        p = self.properties

        def query(q: dict) -> MetricDataQuery:
            stat = q.get("MetricStat")
            return MetricDataQuery(
                query_id=q["Id"], label=q.get("Label"), period=None,
                return_data=q.get("ReturnData", True), expression=q.get("Expression"),
                metric_stat=MetricStat(
                    metric=Metric(stat["Metric"]["MetricName"], stat["Metric"]["Namespace"],
                                  [Dimension(d["Name"], d["Value"])
                                   for d in stat["Metric"].get("Dimensions", [])]),
                    period=stat["Period"], stat=stat["Stat"], unit=None) if stat else None)

        self.name = p.get("AlarmName") or self.name
        self._arn = cloudwatch_backends[self.account_id][self.region_name].put_metric_alarm(
            name=self.name, namespace=p.get("Namespace"), metric_name=p.get("MetricName"),
            metric_data_queries=[query(q) for q in p.get("Metrics", [])] or None,
            comparison_operator=p["ComparisonOperator"],
            evaluation_periods=int(p["EvaluationPeriods"]),
            datapoints_to_alarm=p.get("DatapointsToAlarm"), period=p.get("Period"),
            threshold=p["Threshold"], statistic=p.get("Statistic"),
            extended_statistic=p.get("ExtendedStatistic"), description=p.get("AlarmDescription"),
            dimensions=p.get("Dimensions", []), alarm_actions=p.get("AlarmActions", []),
            ok_actions=p.get("OKActions", []), insufficient_data_actions=[], unit=None,
            actions_enabled=True, treat_missing_data=p.get("TreatMissingData"),
            evaluate_low_sample_count_percentile=None, threshold_metric_id=None, rule=None,
            tags=[]).alarm_arn

    def attribute(self, attr: str) -> Any:
        return self._arn


def _policy(type_: str, required: tuple[str, ...]) -> type[StandIn]:
    return type(type_.replace("::", ""), (StandIn,), {"TYPE": type_, "REQUIRED": required})


EXTRA_STAND_INS = [
    HttpNamespace, CloudMapService, SecurityGroupEgress, MetricAlarm,
    _policy("AWS::S3::BucketPolicy", ("Bucket", "PolicyDocument")),
    _policy("AWS::SNS::TopicPolicy", ("Topics", "PolicyDocument")),
    _policy("AWS::SNS::Subscription", ("TopicArn", "Protocol", "Endpoint")),
]


def _full_name(arn: str, kind: str) -> str:
    """What CloudFormation's *FullName attributes return: the ARN's resource part."""
    return arn.split(f":{kind}/", 1)[1] if kind == "loadbalancer" else f"{kind}/" + arn.split(f":{kind}/", 1)[1]


@contextlib.contextmanager
def _elbv2_full_name_attributes():
    """moto 5.2.5 answers neither LoadBalancerFullName nor any target-group GetAtt; the router's
    autoscaling metric dimensions need both (they are the real attributes, derived like AWS)."""
    from moto.elbv2.models import FakeLoadBalancer, FakeTargetGroup

    lb_get = FakeLoadBalancer.get_cfn_attribute

    def lb_attribute(self, name):
        return _full_name(self.arn, "loadbalancer") if name == "LoadBalancerFullName" else lb_get(self, name)

    def tg_attribute(self, name):
        return {"TargetGroupFullName": _full_name(self.arn, "targetgroup"),
                "TargetGroupName": self.name, "TargetGroupArn": self.arn}[name]

    with mock.patch.object(FakeLoadBalancer, "get_cfn_attribute", lb_attribute), \
            mock.patch.object(FakeTargetGroup, "get_cfn_attribute", tg_attribute, create=True), \
            mock.patch.object(FakeTargetGroup, "has_cfn_attr", classmethod(
                lambda cls, attr: attr in ("TargetGroupFullName", "TargetGroupName", "TargetGroupArn")),
                create=True):
        yield


@pytest.fixture(scope="module")
def deployed():
    with MotoCloudFormation(extra_stand_ins=EXTRA_STAND_INS) as cfn, _elbv2_full_name_attributes():
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
        # default); the 30 s deregistration delay is asserted on the template in test_front.py.


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
                # allow-all egress; the exact egress rules are asserted on the template instead.
                continue
            for r in p.get("IpRanges", []):
                out.add((p["FromPort"], r["CidrIp"]))
            for r in p.get("UserIdGroupPairs", []):
                out.add((p["FromPort"], groups[r["GroupId"]]["Description"].split(":")[0]))
        return out

    assert rules(alb["IpPermissions"]) == {(443, "0.0.0.0/0"), (80, "0.0.0.0/0"),
                                           (contract.ROUTER_TEST_PORT, "10.40.0.0/16")}
    assert rules(alb["IpPermissionsEgress"]) == {(contract.ROUTER_PORT, "flotilla router tasks")}
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
