"""Every stack of the default deployment is created in moto's CloudFormation with every resource,
then read back with boto3: what AWS would actually hold, not just what the template says."""

from __future__ import annotations

import pytest

import contract

from moto_cfn import MotoCloudFormation


@pytest.fixture(scope="module")
def deployed(default_synth):
    with MotoCloudFormation() as cfn:
        cfn.deploy(default_synth)
        yield cfn, default_synth


def logical_of(synth, stack_id: str, type_: str) -> str:
    (logical_id, _), = synth.resources(stack_id, type_).items()
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
    data = ec2.describe_launch_template_versions(LaunchTemplateId=lt_id)[
        "LaunchTemplateVersions"][-1]["LaunchTemplateData"]
    interfaces = data["NetworkInterfaces"]
    assert [(i["NetworkCardIndex"], i["DeviceIndex"], i["InterfaceType"]) for i in interfaces] == \
        [(0, 0, "efa")] + [(card, 1, "efa") for card in range(1, 8)]
    assert all(i["Groups"] == [sg_id] for i in interfaces)
    assert "SecurityGroupIds" not in data
    assert data["Placement"] == {"GroupName": pg_name}
    assert data["MetadataOptions"]["HttpTokens"] == "required"
    assert data["ImageId"] == cfn.ami_id     # resolved from the Neuron AMI SSM parameter
    assert data["InstanceType"] == "trn1.32xlarge"
    root = data["BlockDeviceMappings"][0]["Ebs"]
    assert (root["Encrypted"], root["VolumeType"]) == (True, "gp3")


def test_unit_security_group_reads_back_self_referencing_plus_router_on_node_port(deployed):
    cfn, synth = deployed
    cell, network = synth.deployment.cells[0], synth.deployment.network
    sg_id = cfn.physical_id(cell.stack_name, logical_of(synth, "Cell-0", "AWS::EC2::SecurityGroup"))
    router_sg_id = cfn.physical_id(network.stack_name, network.get_logical_id(
        network.router_security_group.node.default_child))
    sg = cfn.client("ec2").describe_security_groups(GroupIds=[sg_id])["SecurityGroups"][0]
    rules = sorted((p["IpProtocol"], p.get("FromPort"), p.get("ToPort"),
                    [g["GroupId"] for g in p["UserIdGroupPairs"]], p["IpRanges"])
                   for p in sg["IpPermissions"])
    assert rules == [("-1", None, None, [sg_id], []),
                     ("tcp", contract.NODE_API_PORT, contract.NODE_API_PORT, [router_sg_id], [])]


def test_asg_reads_back_in_exactly_one_private_subnet_of_the_network(deployed):
    cfn, synth = deployed
    cell = synth.deployment.cells[0]
    asg_name = cfn.physical_id(cell.stack_name,
                               logical_of(synth, "Cell-0", "AWS::AutoScaling::AutoScalingGroup"))
    asg = cfn.client("autoscaling").describe_auto_scaling_groups(
        AutoScalingGroupNames=[asg_name])["AutoScalingGroups"][0]
    subnet_ids = asg["VPCZoneIdentifier"].split(",")
    assert len(subnet_ids) == 1
    network = synth.deployment.network
    private_logical = network.get_logical_id(network.vpc.private_subnets[0].node.default_child)
    assert subnet_ids[0] == cfn.physical_id(network.stack_name, private_logical)
    subnet = cfn.client("ec2").describe_subnets(SubnetIds=subnet_ids)["Subnets"][0]
    assert subnet["MapPublicIpOnLaunch"] is False
    # surge rollout (default): room for the new revision beside the old one.
    assert (asg["MinSize"], asg["MaxSize"]) == (2, 4)
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
    assert devices == [f"/dev/neuron{i}" for i in range(16)] + \
        [f"/dev/infiniband/uverbs{i}" for i in range(8)]
    assert container["linuxParameters"]["capabilities"]["add"] == ["IPC_LOCK"]
    assert container["ulimits"] == [{"name": "memlock", "softLimit": -1, "hardLimit": -1}]
    assert container["command"] == ["node"]


def test_cluster_reads_back_with_the_unit_capacity_provider_bound_to_its_asg(deployed):
    cfn, synth = deployed
    cell = synth.deployment.cells[0]
    ecs = cfn.client("ecs")
    cluster_name = cfn.physical_id(cell.stack_name, logical_of(synth, "Cell-0", "AWS::ECS::Cluster"))
    cp_name = cfn.physical_id(cell.stack_name,
                              logical_of(synth, "Cell-0", "AWS::ECS::CapacityProvider"))
    cluster = ecs.describe_clusters(clusters=[cluster_name])["clusters"][0]
    assert cluster["capacityProviders"] == [cp_name]
    (provider,) = ecs.describe_capacity_providers(capacityProviders=[cp_name])["capacityProviders"]
    asg_name = cfn.physical_id(cell.stack_name,
                               logical_of(synth, "Cell-0", "AWS::AutoScaling::AutoScalingGroup"))
    assert provider["autoScalingGroupProvider"]["autoScalingGroupArn"].endswith(
        f"autoScalingGroupName/{asg_name}")
    services = ecs.describe_services(cluster=cluster_name, services=ecs.list_services(
        cluster=cluster_name)["serviceArns"])["services"]
    assert [s["desiredCount"] for s in services] == [2]
