"""Cell-<n> stacks: what each Trainium unit must get (placement, EFA, devices, capacity), asserted on the
synthesized templates of the default deployment, a trn1n deployment and the 20,480-chip fleet."""

from __future__ import annotations

import pytest
from aws_cdk.assertions import Match, Template

import contract
from stacks.config import CELL_FIXED_RESOURCES, MAX_RESOURCES_PER_STACK, UNIT_RESOURCES, estimate_cell_resources

NEURON_AMI_PARAMETER = (  # stacks/unit.py pins this Neuron ECS AMI release (docs/hardware.md)
    "/aws/service/ecs/optimized-ami/amazon-linux-2023/neuron/al2023-ami-ecs-neuron-hvm-2023.0.20260403-kernel-6.1-x86_64/image_id"
)


@pytest.fixture(scope="module")
def cell(default_synth) -> Template:
    return Template.from_json(default_synth.template("Cell-0"))


def only(resources: dict) -> dict:
    assert len(resources) == 1, list(resources)
    return next(iter(resources.values()))


def launch_template_data(synth, stack_id="Cell-0") -> dict:
    return only(synth.resources(stack_id, "AWS::EC2::LaunchTemplate"))["Properties"]["LaunchTemplateData"]


def node_container(synth, stack_id="Cell-0") -> dict:
    task = only(synth.resources(stack_id, "AWS::ECS::TaskDefinition"))["Properties"]
    return only({c["Name"]: c for c in task["ContainerDefinitions"]})


def test_each_unit_gets_a_cluster_placement_group(cell):
    cell.resource_count_is("AWS::EC2::PlacementGroup", 1)
    cell.has_resource_properties("AWS::EC2::PlacementGroup", {"Strategy": "cluster"})


def test_launch_template_places_instances_in_the_unit_placement_group(default_synth):
    data = launch_template_data(default_synth)
    ((pg_logical, _),) = default_synth.resources("Cell-0", "AWS::EC2::PlacementGroup").items()
    assert data["Placement"] == {"GroupName": {"Ref": pg_logical}}


def test_launch_template_uses_the_neuron_ecs_ami_ssm_parameter(default_synth):
    data = launch_template_data(default_synth)
    param = data["ImageId"]["Ref"]
    parameters = default_synth.template("Cell-0")["Parameters"]
    assert parameters[param] == {
        "Type": "AWS::SSM::Parameter::Value<AWS::EC2::Image::Id>",
        "Default": NEURON_AMI_PARAMETER,
    }


def test_launch_template_requires_imdsv2_with_hop_limit_one(cell):
    cell.has_resource_properties(
        "AWS::EC2::LaunchTemplate",
        {
            "LaunchTemplateData": Match.object_like(
                {"MetadataOptions": {"HttpTokens": "required", "HttpPutResponseHopLimit": 1}}
            )
        },
    )


def test_launch_template_root_volume_is_encrypted_gp3(cell):
    cell.has_resource_properties(
        "AWS::EC2::LaunchTemplate",
        {
            "LaunchTemplateData": Match.object_like(
                {
                    "BlockDeviceMappings": [
                        {
                            "DeviceName": "/dev/xvda",
                            "Ebs": {
                                "Encrypted": True,
                                "VolumeType": "gp3",
                                "VolumeSize": 128,  # OS and images; models on the instance store
                                "DeleteOnTermination": True,
                            },
                        }
                    ]
                }
            )
        },
    )


@pytest.mark.parametrize(
    "synth_fixture,instance_type,efa_count",
    [("default_synth", "trn1.32xlarge", 8), ("trn1n_synth", "trn1n.32xlarge", 16)],
)
def test_launch_template_has_one_efa_interface_per_efa_card(request, synth_fixture, instance_type, efa_count):
    synth = request.getfixturevalue(synth_fixture)
    data = launch_template_data(synth)
    ((sg_logical, _),) = synth.resources("Cell-0", "AWS::EC2::SecurityGroup").items()
    assert data["InstanceType"] == instance_type
    interfaces = data["NetworkInterfaces"]
    assert [i["NetworkCardIndex"] for i in interfaces] == list(range(efa_count))
    assert [i["DeviceIndex"] for i in interfaces] == [0] + [1] * (efa_count - 1)
    assert {i["InterfaceType"] for i in interfaces} == {"efa"}
    assert all(i["Groups"] == [{"Fn::GetAtt": [sg_logical, "GroupId"]}] for i in interfaces)
    # No public address: EC2 never auto-assigns one with several interfaces, and the key would
    # make EC2 reject the launch.
    assert not any("AssociatePublicIpAddress" in i for i in interfaces)
    # Security groups live on the interfaces; EC2 rejects both.
    assert "SecurityGroupIds" not in data


def test_unit_security_group_admits_itself_fully_and_the_router_on_the_node_port(default_synth):
    sgs = default_synth.resources("Cell-0", "AWS::EC2::SecurityGroup")
    ((sg_logical, sg),) = sgs.items()
    assert "SecurityGroupIngress" not in sg["Properties"]
    network = default_synth.deployment.network
    router_sg = network.get_logical_id(network.router_security_group.node.default_child)
    ingress = sorted(
        (i["Properties"] for i in default_synth.resources("Cell-0", "AWS::EC2::SecurityGroupIngress").values()),
        key=lambda p: p["IpProtocol"],
    )
    assert ingress == [
        {
            "Description": "EFA requires all traffic from members of the same security group",
            "GroupId": {"Fn::GetAtt": [sg_logical, "GroupId"]},
            "IpProtocol": "-1",
            "SourceSecurityGroupId": {"Fn::GetAtt": [sg_logical, "GroupId"]},
        },
        {
            "Description": "Router to the node API (requests, health, load)",
            "GroupId": {"Fn::GetAtt": [sg_logical, "GroupId"]},
            "IpProtocol": "tcp",
            "FromPort": contract.NODE_API_PORT,
            "ToPort": contract.NODE_API_PORT,
            "SourceSecurityGroupId": {"Fn::ImportValue": ingress[1]["SourceSecurityGroupId"]["Fn::ImportValue"]},
        },
    ]
    assert router_sg in ingress[1]["SourceSecurityGroupId"]["Fn::ImportValue"]


def test_asg_spans_exactly_one_private_subnet_starts_empty_and_holds_nodes_per_unit(default_synth):
    asg = only(default_synth.resources("Cell-0", "AWS::AutoScaling::AutoScalingGroup"))["Properties"]
    assert len(asg["VPCZoneIdentifier"]) == 1
    export = asg["VPCZoneIdentifier"][0]["Fn::ImportValue"]
    assert "PrivateSubnet1" in export  # unit 0 -> AZ slot 0
    # Created empty (the unit's tasks bring it up through the capacity provider, so a unit short of
    # capacity never holds its stack); surge (default): room for the new revision's node beside
    # the old one during a rollout.
    assert (asg["MinSize"], asg["MaxSize"]) == ("0", "2")
    assert "DesiredCapacity" not in asg  # owned by the capacity provider's managed scaling
    assert asg["NewInstancesProtectedFromScaleIn"] is True


def test_units_rotate_over_the_three_private_subnets(fleet_synth):
    asgs = fleet_synth.resources("Cell-0", "AWS::AutoScaling::AutoScalingGroup")
    ordered = sorted(asgs.items(), key=lambda kv: int(kv[0].split("Unit")[1].split("Asg")[0]))
    subnets = [v["Properties"]["VPCZoneIdentifier"][0]["Fn::ImportValue"] for _, v in ordered]
    slots = [next(n for n in (1, 2, 3) if f"PrivateSubnet{n}" in s) for s in subnets]
    assert slots == [1, 2, 3] * 6 + [1, 2]


def test_replace_rollout_caps_the_asg_at_nodes_and_stops_the_old_tasks_first(tmp_path):
    from synth_helpers import LLAMA_70B, config_with, synthesize

    synth = synthesize(config_with(unit_rollout="replace", nodes_per_unit=2, model=LLAMA_70B), tmp_path)
    asg = only(synth.resources("Cell-0", "AWS::AutoScaling::AutoScalingGroup"))["Properties"]
    assert (asg["MinSize"], asg["MaxSize"]) == ("0", "2")
    service = only(synth.resources("Cell-0", "AWS::ECS::Service"))["Properties"]
    # The whole unit switches revision together (a unit never mixes revisions).
    assert service["DeploymentConfiguration"]["MinimumHealthyPercent"] == 0
    assert service["DeploymentConfiguration"]["MaximumPercent"] == 100


def test_capacity_provider_uses_managed_scaling_and_is_associated_with_the_cluster(default_synth):
    cps = default_synth.resources("Cell-0", "AWS::ECS::CapacityProvider")
    ((cp_logical, cp),) = cps.items()
    ((asg_logical, _),) = default_synth.resources("Cell-0", "AWS::AutoScaling::AutoScalingGroup").items()
    assert cp["Properties"]["AutoScalingGroupProvider"] == {
        "AutoScalingGroupArn": {"Ref": asg_logical},
        "ManagedDraining": "ENABLED",
        "ManagedScaling": {"Status": "ENABLED", "TargetCapacity": 100, "InstanceWarmupPeriod": 600},
        "ManagedTerminationProtection": "ENABLED",
    }
    assoc = only(default_synth.resources("Cell-0", "AWS::ECS::ClusterCapacityProviderAssociations"))
    assert assoc["Properties"]["CapacityProviders"] == [{"Ref": cp_logical}]


def test_service_runs_one_task_per_node_on_distinct_instances_via_the_capacity_provider(trn1n_synth):
    services = trn1n_synth.resources("Cell-0", "AWS::ECS::Service")
    ((_, service),) = services.items()
    props = service["Properties"]
    cp_logical = next(iter(trn1n_synth.resources("Cell-0", "AWS::ECS::CapacityProvider")))
    assoc_logical = next(iter(trn1n_synth.resources("Cell-0", "AWS::ECS::ClusterCapacityProviderAssociations")))
    assert props["DesiredCount"] == 2  # its unit of 2 nodes
    assert props["CapacityProviderStrategy"] == [{"CapacityProvider": {"Ref": cp_logical}, "Weight": 1}]
    assert "LaunchType" not in props
    assert props["PlacementConstraints"] == [{"Type": "distinctInstance"}]
    # The association must exist before a service may use its capacity provider.
    assert assoc_logical in service["DependsOn"]
    # surge rollout (default): the new revision forms beside the old one, then the old drains.
    assert props["DeploymentConfiguration"]["MinimumHealthyPercent"] == 100
    assert props["DeploymentConfiguration"]["MaximumPercent"] == 200
    assert props["DeploymentConfiguration"]["DeploymentCircuitBreaker"] == {"Enable": True, "Rollback": True}


def test_task_definition_uses_host_networking_on_ec2(cell):
    cell.has_resource_properties(
        "AWS::ECS::TaskDefinition", {"NetworkMode": "host", "RequiresCompatibilities": ["EC2"]}
    )


def test_task_maps_all_sixteen_neuron_devices_and_the_efa_verbs_devices(default_synth):
    devices = node_container(default_synth)["LinuxParameters"]["Devices"]
    paths = [d["HostPath"] for d in devices]
    assert paths == [f"/dev/neuron{i}" for i in range(16)] + [f"/dev/infiniband/uverbs{i}" for i in range(8)]
    assert all(d["ContainerPath"] == d["HostPath"] for d in devices)
    assert all(d["Permissions"] == ["read", "write"] for d in devices)


def test_task_has_unlimited_memlock_and_ipc_lock(default_synth):
    container = node_container(default_synth)
    assert container["Ulimits"] == [{"Name": "memlock", "SoftLimit": -1, "HardLimit": -1}]
    assert container["LinuxParameters"]["Capabilities"] == {"Add": ["IPC_LOCK"]}
    assert "Privileged" not in container


def test_container_health_check_asks_started_then_alive_never_ready(default_synth):
    check = node_container(default_synth)["HealthCheck"]
    assert check["Command"][0] == "CMD-SHELL"
    # /health/container: fails until the unit was ready once (a rollout must not count a loading
    # task as healthy), then alive. Never /health/ready: a re-forming unit's members must survive.
    url = f"http://127.0.0.1:{contract.NODE_API_PORT}{contract.NODE_CONTAINER_HEALTH_PATH}"
    assert url in check["Command"][1]
    assert contract.NODE_READY_PATH not in check["Command"][1]
    assert contract.NODE_LIVE_PATH not in check["Command"][1]
    assert (check["Interval"], check["Timeout"], check["Retries"], check["StartPeriod"]) == (30, 5, 3, 300)


def test_container_runs_the_node_command_with_its_unit_identity(default_synth):
    container = node_container(default_synth)
    assert container["Command"] == contract.NODE_COMMAND
    env = {e["Name"]: e["Value"] for e in container["Environment"]}
    assert env[contract.ENV_ROLE] == "node"
    assert env[contract.ENV_UNIT_ID] == "cell0-unit0"
    assert env[contract.ENV_CELL_ID] == "cell0"
    assert env[contract.ENV_NODES_PER_UNIT] == "1"
    assert env[contract.ENV_RENDEZVOUS] == "ecs"
    assert env[contract.ENV_REVISION] == "1"
    assert env[contract.ENV_MODEL_URI] == "s3://flotilla-models-example/llama-3.1-8b-instruct/"
    assert env[contract.ENV_MODEL_NAME] == "llama-3.1-8b-instruct"
    assert container["StopTimeout"] == 120
    assert int(env[contract.ENV_DRAIN_TIMEOUT]) < container["StopTimeout"]


def test_container_logs_to_cloudwatch_with_retention(default_synth):
    container = node_container(default_synth)
    groups = default_synth.resources("Cell-0", "AWS::Logs::LogGroup")
    ((group_logical, group),) = groups.items()
    assert group["Properties"]["RetentionInDays"] == 30
    assert container["LogConfiguration"]["LogDriver"] == "awslogs"
    assert container["LogConfiguration"]["Options"]["awslogs-group"] == {"Ref": group_logical}
    assert container["LogConfiguration"]["Options"]["awslogs-stream-prefix"] == "cell0-unit0"


def test_task_role_reads_only_the_model_prefix_and_its_own_cluster(default_synth):
    policies = default_synth.resources("Cell-0", "AWS::IAM::Policy")
    task_policy = next(p for k, p in policies.items() if k.startswith("TaskRole"))
    statements = {s["Sid"]: s for s in task_policy["Properties"]["PolicyDocument"]["Statement"]}
    # ReadWriteCompileCache / ListCompileCache: the neuron engine's compile cache, asserted in
    # test_neuron_unit.py.
    assert set(statements) == {
        "ReadModelArtifacts",
        "ListModelArtifacts",
        "ListClusterTasks",
        "DescribeClusterTasks",
        "ReadInstancesAndTopology",
        "ReadWriteCompileCache",
        "ListCompileCache",
    }
    assert statements["ReadModelArtifacts"]["Action"] == "s3:GetObject"
    assert (
        statements["ReadModelArtifacts"]["Resource"]["Fn::Join"][1][-1]
        == ":s3:::flotilla-models-example/llama-3.1-8b-instruct/*"
    )
    assert statements["ListModelArtifacts"]["Condition"] == {"StringLike": {"s3:prefix": ["llama-3.1-8b-instruct/*"]}}
    cluster_logical = next(iter(default_synth.resources("Cell-0", "AWS::ECS::Cluster")))
    for sid in ("ListClusterTasks", "DescribeClusterTasks"):
        assert statements[sid]["Condition"] == {"ArnEquals": {"ecs:cluster": {"Fn::GetAtt": [cluster_logical, "Arn"]}}}
    assert statements["DescribeClusterTasks"]["Action"] == ["ecs:DescribeContainerInstances", "ecs:DescribeTasks"]
    assert statements["ReadInstancesAndTopology"]["Action"] == ["ec2:DescribeInstanceTopology", "ec2:DescribeInstances"]


def test_instance_role_has_only_the_ecs_agent_essentials_and_the_boot_artifacts(default_synth):
    policies = default_synth.resources("Cell-0", "AWS::IAM::Policy")
    instance_policy = next(p for k, p in policies.items() if k.startswith("InstanceRole"))
    actions = set()
    for s in instance_policy["Properties"]["PolicyDocument"]["Statement"]:
        actions |= set([s["Action"]] if isinstance(s["Action"], str) else s["Action"])
    # s3:GetObject: the boot reads its artifacts, each by its exact key (tests/stacks/test_node_boot.py).
    assert actions == {
        "s3:GetObject",
        "ecs:DeregisterContainerInstance",
        "ecs:RegisterContainerInstance",
        "ecs:Submit*",
        "ecs:Poll",
        "ecs:StartTelemetrySession",
        "ecs:DiscoverPollEndpoint",
        "ecr:GetAuthorizationToken",
        "logs:CreateLogStream",
        "logs:PutLogEvents",
    }
    roles = default_synth.resources("Cell-0", "AWS::IAM::Role")
    assert not any("ManagedPolicyArns" in r["Properties"] for r in roles.values())


def test_resource_estimate_matches_what_cells_synthesize(default_synth, fleet_synth):
    assert len(default_synth.resources("Cell-0")) == estimate_cell_resources(1) == CELL_FIXED_RESOURCES + UNIT_RESOURCES
    for stack_id, template in fleet_synth.templates.items():
        if stack_id.startswith("Cell-"):
            assert len(template["Resources"]) == estimate_cell_resources(20)


def test_twenty_thousand_chip_fleet_fits_quotas_in_sixteen_cells_in_eight_lanes(fleet_synth):
    cells = fleet_synth.deployment.cells
    assert fleet_synth.deployment.config.chips == 20480
    assert [c.node.id for c in cells] == [f"Cell-{i}" for i in range(16)]
    for stack_id, template in fleet_synth.templates.items():
        assert len(template["Resources"]) <= MAX_RESOURCES_PER_STACK, stack_id
    for i, cell in enumerate(cells):
        cps = fleet_synth.resources(cell.node.id, "AWS::ECS::CapacityProvider")
        assert len(cps) == 20
        assert len(fleet_synth.resources(cell.node.id, "AWS::ECS::Cluster")) == 1
        deps = {d.node.id for d in cell.dependencies}
        # Discovery: the Cloud Map service the unit tasks register in. 32 units roll at once (10 %
        # of 320) as 4 units in each of 8 cells: Cell-n waits for Cell-(n-8).
        assert deps == ({"Network", "Discovery"} if i < 8 else {"Network", "Discovery", f"Cell-{i - 8}"})


def test_unit_resources_and_instances_carry_deployment_cell_and_unit_tags(default_synth):
    asg = only(default_synth.resources("Cell-0", "AWS::AutoScaling::AutoScalingGroup"))
    assert {(t["Key"], t["Value"], t["PropagateAtLaunch"]) for t in asg["Properties"]["Tags"]} >= {
        ("flotilla:deployment", "flotilla", True),
        ("flotilla:cell", "cell0", True),
        ("flotilla:unit", "cell0-unit0", True),
    }
    service = only(default_synth.resources("Cell-0", "AWS::ECS::Service"))["Properties"]
    assert service["PropagateTags"] == "SERVICE" and service["EnableECSManagedTags"] is True
    assert {"Key": "flotilla:unit", "Value": "cell0-unit0"} in service["Tags"]


def test_cluster_and_task_family_have_readable_names(default_synth):
    cluster = only(default_synth.resources("Cell-0", "AWS::ECS::Cluster"))["Properties"]
    task = only(default_synth.resources("Cell-0", "AWS::ECS::TaskDefinition"))["Properties"]
    assert (cluster["ClusterName"], task["Family"]) == ("flotilla-cell0", "flotilla-cell0-unit0")


def test_task_role_grants_exactly_the_aws_calls_ecs_rendezvous_makes(default_synth):
    """Read runtime/rendezvous/ecs.py as text (stacks never import runtime) and compare its
    boto3 calls with the task role's ECS/EC2 actions: nothing missing, nothing extra."""
    import re

    from synth_helpers import REPO_ROOT

    source = (REPO_ROOT / "runtime" / "rendezvous" / "ecs.py").read_text()
    calls = {(svc, op) for svc, op in re.findall(r"self\._(ecs|ec2)\.(\w+)\(", source) if op != "get_paginator"}
    calls |= {(svc, op) for svc, op in re.findall(r"self\._(ecs|ec2)\.get_paginator\(\"(\w+)\"\)", source)}
    called = {f"{svc}:{''.join(w.capitalize() for w in op.split('_'))}" for svc, op in calls}
    policies = default_synth.resources("Cell-0", "AWS::IAM::Policy")
    task_policy = next(p for k, p in policies.items() if k.startswith("TaskRole"))
    granted = set()
    for statement in task_policy["Properties"]["PolicyDocument"]["Statement"]:
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        granted |= {a for a in actions if a.startswith(("ecs:", "ec2:"))}
    assert called == granted


def test_node_runtime_accepts_the_environment_the_task_definition_gives_it(tmp_path):
    """The container's settings parser (runtime/node/settings.py) takes the task's environment
    as is: ECS rendezvous, the unit's id, size and revision, the node API port."""
    from synth_helpers import config_with, synthesize

    from runtime.node.settings import load_settings

    synth = synthesize(
        config_with(instance_type="m6i.large", node={"engine": "reference"}, revision="7", nodes_per_unit=2), tmp_path
    )
    env = {e["Name"]: e["Value"] for e in node_container(synth)["Environment"]}
    settings = load_settings(argv=[], env=env)
    assert (
        settings.rendezvous,
        settings.unit_id,
        settings.revision,
        settings.world_size,
        settings.api_port,
        settings.engine,
    ) == ("ecs", "cell0-unit0", "7", 2, contract.NODE_API_PORT, "reference")


def test_replaced_task_definitions_stay_registered_for_rollback(default_synth):
    """A new revision replaces the task definition; CloudFormation's default is to delete (deregister)
    the replaced one once the update completes (aws/aws-cdk#24372), and ECS refuses to update a
    service to an INACTIVE task definition, so `flotilla rollback` would have nothing to go back to.
    UpdateReplacePolicy Retain keeps it (and DeletionPolicy with it, cfn-lint W3011)."""
    (task,) = default_synth.resources("Cell-0", "AWS::ECS::TaskDefinition").values()
    assert task.get("UpdateReplacePolicy") == "Retain"
    assert task.get("DeletionPolicy") == "Retain"
