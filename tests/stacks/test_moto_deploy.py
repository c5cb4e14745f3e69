"""Every stack of the default deployment, with and without a certificate, is created in moto's
CloudFormation with every resource, then read back with boto3: what AWS would actually hold, not
just what the template says.

moto lacks CloudFormation models for Cloud Map, some SG/SNS/S3 policy types, metric-math alarms and
Application Auto Scaling; moto_cfn's stand-ins create them, calling moto's backends where moto has
one, so boto3 reads them back.
"""

from __future__ import annotations

import pytest
from moto_cfn import MotoCloudFormation

import contract
from stacks.discovery import HTTP_PORT, HTTPS_PORT
from stacks.front import PARKED_PORT
from stacks.network import VPC_CIDR


@pytest.fixture(scope="module")
def deployed(deployment_synth):
    with MotoCloudFormation() as cfn:
        cfn.deploy(deployment_synth)
        yield cfn, deployment_synth


def logical_of(synth, stack_id: str, type_: str) -> str:
    ((logical_id, _),) = synth.resources(stack_id, type_).items()
    return logical_id


def test_every_stack_reaches_create_complete_with_every_resource_created(deployed):
    cfn, synth = deployed
    cfn.assert_every_resource_created(synth)


def test_launch_template_reads_back_with_efa_interfaces_placement_and_imdsv2(deployed):
    cfn, synth = deployed
    cell = synth.deployment.cells[0]
    lt_id = cfn.physical_id(cell.stack_name, logical_of(synth, "Cell-0", "AWS::EC2::LaunchTemplate"))
    pg_name = cfn.physical_id(cell.stack_name, logical_of(synth, "Cell-0", "AWS::EC2::PlacementGroup"))
    sg_id = cfn.physical_id(cell.stack_name, logical_of(synth, "Cell-0", "AWS::EC2::SecurityGroup"))
    ec2 = cfn.client("ec2")
    data = ec2.describe_launch_template_versions(LaunchTemplateId=lt_id)["LaunchTemplateVersions"][-1][
        "LaunchTemplateData"
    ]
    interfaces = data["NetworkInterfaces"]
    assert [(i["NetworkCardIndex"], i["DeviceIndex"], i["InterfaceType"]) for i in interfaces] == [(0, 0, "efa")] + [
        (card, 1, "efa") for card in range(1, 8)
    ]
    assert all(i["Groups"] == [sg_id] for i in interfaces)
    assert "SecurityGroupIds" not in data
    assert data["Placement"] == {"GroupName": pg_name}
    assert data["MetadataOptions"]["HttpTokens"] == "required"
    assert data["ImageId"] == cfn.ami_id  # resolved from the Neuron AMI SSM parameter
    assert data["InstanceType"] == "trn1.32xlarge"
    root = data["BlockDeviceMappings"][0]["Ebs"]
    assert (root["Encrypted"], root["VolumeType"]) == (True, "gp3")


def test_unit_security_group_reads_back_self_referencing_plus_router_on_node_port(deployed):
    cfn, synth = deployed
    cell, network = synth.deployment.cells[0], synth.deployment.network
    sg_id = cfn.physical_id(cell.stack_name, logical_of(synth, "Cell-0", "AWS::EC2::SecurityGroup"))
    router_sg_id = cfn.physical_id(
        network.stack_name, network.get_logical_id(network.router_security_group.node.default_child)
    )
    sg = cfn.client("ec2").describe_security_groups(GroupIds=[sg_id])["SecurityGroups"][0]
    rules = sorted(
        (
            p["IpProtocol"],
            p.get("FromPort"),
            p.get("ToPort"),
            [g["GroupId"] for g in p["UserIdGroupPairs"]],
            p["IpRanges"],
        )
        for p in sg["IpPermissions"]
    )
    assert rules == [
        ("-1", None, None, [sg_id], []),
        ("tcp", contract.NODE_API_PORT, contract.NODE_API_PORT, [router_sg_id], []),
    ]


def test_asg_reads_back_in_exactly_one_private_subnet_of_the_network(deployed):
    cfn, synth = deployed
    cell = synth.deployment.cells[0]
    asg_name = cfn.physical_id(cell.stack_name, logical_of(synth, "Cell-0", "AWS::AutoScaling::AutoScalingGroup"))
    asg = cfn.client("autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=[asg_name])["AutoScalingGroups"][
        0
    ]
    subnet_ids = asg["VPCZoneIdentifier"].split(",")
    assert len(subnet_ids) == 1
    network = synth.deployment.network
    private_logical = network.get_logical_id(network.vpc.private_subnets[0].node.default_child)
    assert subnet_ids[0] == cfn.physical_id(network.stack_name, private_logical)
    subnet = cfn.client("ec2").describe_subnets(SubnetIds=subnet_ids)["Subnets"][0]
    assert subnet["MapPublicIpOnLaunch"] is False
    # surge rollout (default): room for the new revision beside the old one.
    assert (asg["MinSize"], asg["MaxSize"]) == (0, 2)  # one node, and room for one more during a surge
    assert asg["NewInstancesProtectedFromScaleIn"] is True


def test_task_definition_reads_back_with_devices_memlock_and_ipc_lock(deployed):
    # moto keeps a CloudFormation task definition's containers but drops task-level settings
    # (network mode, roles): those are asserted on the template in test_cell_stack.py.
    cfn, synth = deployed
    cell = synth.deployment.cells[0]
    arn = cfn.physical_id(cell.stack_name, logical_of(synth, "Cell-0", "AWS::ECS::TaskDefinition"))
    task = cfn.client("ecs").describe_task_definition(taskDefinition=arn)["taskDefinition"]
    (container,) = task["containerDefinitions"]
    devices = [d["hostPath"] for d in container["linuxParameters"]["devices"]]
    assert devices == [f"/dev/neuron{i}" for i in range(16)] + [f"/dev/infiniband/uverbs{i}" for i in range(8)]
    assert container["linuxParameters"]["capabilities"]["add"] == ["IPC_LOCK"]
    assert container["ulimits"] == [{"name": "memlock", "softLimit": -1, "hardLimit": -1}]
    assert container["command"] == ["node"]


def test_cluster_reads_back_with_the_unit_capacity_provider_bound_to_its_asg(deployed):
    cfn, synth = deployed
    cell = synth.deployment.cells[0]
    ecs = cfn.client("ecs")
    cluster_name = cfn.physical_id(cell.stack_name, logical_of(synth, "Cell-0", "AWS::ECS::Cluster"))
    cp_name = cfn.physical_id(cell.stack_name, logical_of(synth, "Cell-0", "AWS::ECS::CapacityProvider"))
    cluster = ecs.describe_clusters(clusters=[cluster_name])["clusters"][0]
    assert cluster["capacityProviders"] == [cp_name]
    (provider,) = ecs.describe_capacity_providers(capacityProviders=[cp_name])["capacityProviders"]
    asg_name = cfn.physical_id(cell.stack_name, logical_of(synth, "Cell-0", "AWS::AutoScaling::AutoScalingGroup"))
    assert provider["autoScalingGroupProvider"]["autoScalingGroupArn"].endswith(f"autoScalingGroupName/{asg_name}")
    services = ecs.describe_services(
        cluster=cluster_name, services=ecs.list_services(cluster=cluster_name)["serviceArns"]
    )["services"]
    assert [s["desiredCount"] for s in services] == [1]  # one task per node; the default unit has one


# --- the front door: ALB, target groups, router service, Cloud Map, alarms ------------------------


def listener_ports(synth) -> tuple[int, ...]:
    """Production listener first, then the redirect listener: 443 and 80 (redirecting) with a
    certificate, 80 and the parked port (unreachable) without."""
    return (HTTPS_PORT, HTTP_PORT) if synth.deployment.config.certificate_arn else (HTTP_PORT, PARKED_PORT)


def test_target_groups_read_back_with_the_router_health_check(deployed):
    cfn, _ = deployed
    groups = cfn.client("elbv2").describe_target_groups()["TargetGroups"]
    assert len(groups) == 2
    for g in groups:
        assert (g["Port"], g["TargetType"], g["HealthCheckPath"]) == (
            contract.ROUTER_PORT,
            "ip",
            contract.ROUTER_HEALTH_PATH,
        )
        assert (g["HealthCheckIntervalSeconds"], g["HealthCheckTimeoutSeconds"]) == (10, 5)
        assert (g["HealthyThresholdCount"], g["UnhealthyThresholdCount"]) == (2, 3)
        # moto 5.2.5 drops TargetGroupAttributes from CloudFormation (it reports the 300 s
        # default); the 60 s deregistration delay is asserted on the template in test_front.py.


def test_listeners_and_weighted_rules_read_back(deployed):
    cfn, synth = deployed
    elbv2 = cfn.client("elbv2")
    (alb,) = elbv2.describe_load_balancers()["LoadBalancers"]
    assert alb["Scheme"] == synth.deployment.config.front.scheme
    listeners = {
        lst["Port"]: lst for lst in elbv2.describe_listeners(LoadBalancerArn=alb["LoadBalancerArn"])["Listeners"]
    }
    assert set(listeners) == set(listener_ports(synth))
    production = listener_ports(synth)[0]
    if production == HTTPS_PORT:
        assert listeners[HTTPS_PORT]["Protocol"] == "HTTPS"
        assert listeners[HTTPS_PORT]["Certificates"] == [{"CertificateArn": cfn.certificate_arn}]
        (redirect,) = listeners[HTTP_PORT]["DefaultActions"]
        assert redirect["Type"] == "redirect"
        assert (redirect["RedirectConfig"]["Protocol"], redirect["RedirectConfig"]["Port"]) == (
            "HTTPS",
            str(HTTPS_PORT),
        )
    else:
        assert listeners[HTTP_PORT]["Protocol"] == "HTTP"
    groups = {g["TargetGroupArn"] for g in elbv2.describe_target_groups()["TargetGroups"]}
    (rule,) = [
        r for r in elbv2.describe_rules(ListenerArn=listeners[production]["ListenerArn"])["Rules"] if not r["IsDefault"]
    ]
    forward = rule["Actions"][0]["ForwardConfig"]["TargetGroups"]
    assert sorted(tg["Weight"] for tg in forward) == [0, 100]
    assert {tg["TargetGroupArn"] for tg in forward} == groups


def test_front_door_security_groups_read_back_with_exactly_the_request_path_rules(deployed):
    cfn, synth = deployed
    ec2 = cfn.client("ec2")
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

    front = synth.deployment.config.front
    # internet-facing: the named clients only; internal: the VPC calls it
    clients = set(front.client_cidrs) if front.scheme == "internet-facing" else {VPC_CIDR}
    # Both client ports with or without a certificate (test_aws_rules.py says why).
    assert rules(alb["IpPermissions"]) == {(port, cidr) for port in (HTTPS_PORT, HTTP_PORT) for cidr in clients}
    assert rules(router["IpPermissions"]) == {(contract.ROUTER_PORT, "flotilla ALB")}


def test_router_service_and_task_definition_read_back(deployed):
    cfn, synth = deployed
    ecs = cfn.client("ecs")
    cluster = cfn.physical_id(synth.deployment.router.stack_name, logical_of(synth, "Router", "AWS::ECS::Cluster"))
    (service_arn,) = ecs.list_services(cluster=cluster)["serviceArns"]
    (service,) = ecs.describe_services(cluster=cluster, services=[service_arn])["services"]
    # The template states no DesiredCount (a deploy would write it back over autoscaling,
    # tests/stacks/test_updates.py); Application Auto Scaling brings the service to its minimum, which
    # moto does not run: it reads back ECS's own start, here 0.
    assert service["desiredCount"] in (0, 1)
    task = ecs.describe_task_definition(taskDefinition=service["taskDefinition"])["taskDefinition"]
    (container,) = task["containerDefinitions"]
    assert container["command"] == contract.ROUTER_COMMAND
    env = {e["name"]: e["value"] for e in container["environment"]}
    assert env[contract.ENV_DISCOVERY] == "cloudmap"
    assert env[contract.ENV_CLOUDMAP_NAMESPACE] == "flotilla.internal"
    # (moto keeps neither NetworkMode nor RequiresCompatibilities from CloudFormation: the
    # template tests assert awsvpc/Fargate.)


def test_cloud_map_namespace_and_units_service_read_back(deployed):
    cfn, _ = deployed
    sd = cfn.client("servicediscovery")
    (ns,) = sd.list_namespaces()["Namespaces"]
    assert (ns["Name"], ns["Type"]) == ("flotilla.internal", "HTTP")
    (svc,) = sd.list_services()["Services"]
    assert svc["Name"] == "units-cell0"  # one service per cell; the default deployment has one cell
    assert sd.get_service(Id=svc["Id"])["Service"]["NamespaceId"] == ns["Id"]


def test_alarms_read_back_with_sns_actions(deployed):
    cfn, synth = deployed
    alarms = cfn.client("cloudwatch").describe_alarms()["MetricAlarms"]
    # six for the front door (three of them the router's deployment alarms), and one ready-units
    # alarm per cell
    assert len(alarms) == 6 + len(synth.deployment.cells)
    (topic,) = cfn.client("sns").list_topics()["Topics"]
    for alarm in alarms:
        assert alarm["AlarmActions"] == [topic["TopicArn"]]
