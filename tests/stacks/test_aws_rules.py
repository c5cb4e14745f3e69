"""AWS rules the synthesized templates must meet that neither moto nor cfn-lint models.

Each test states one rule of ECS, CloudFormation, EC2 or ELB, quotes its source, and checks every
template it applies to. moto accepts all of these templates either way, and cfn-lint checks their
shape, not what the service does with them: a template that breaks one of these rules deploys in
the tests and fails in an account.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from synth_helpers import CERTIFICATE_ARN, config_with, synthesize

import contract
from stacks.config import ConfigError, parse_config
from stacks.discovery import HTTP_PORT

RESERVATION_ID = "cr-0123456789abcdef0"


# --- helpers over synthesized templates ------------------------------------------------------------
def walk(value) -> Iterator:
    """Every dict and list nested in a template value, depth first."""
    yield value
    if isinstance(value, dict):
        for v in value.values():
            yield from walk(v)
    elif isinstance(value, list):
        for v in value:
            yield from walk(v)


def exports(synth) -> dict[str, tuple[str, dict]]:
    """Export name -> (stack id, exported value) over every stack of the deployment."""
    out = {}
    for stack_id, template in synth.templates.items():
        for output in template.get("Outputs", {}).values():
            if "Export" in output:
                out[output["Export"]["Name"]] = (stack_id, output["Value"])
    return out


def resolve(synth, stack_id: str, value) -> tuple[str, dict]:
    """(stack id, value) of a Fn::ImportValue followed to its export; anything else as is."""
    if isinstance(value, dict) and "Fn::ImportValue" in value:
        return exports(synth)[value["Fn::ImportValue"]]
    return stack_id, value


def resources(synth, stack_id: str, type_: str) -> dict[str, dict]:
    return synth.resources(stack_id, type_)


def all_of(synth, type_: str) -> Iterator[tuple[str, str, dict]]:
    """(stack id, logical id, resource) of every resource of a type in the deployment."""
    for stack_id in synth.templates:
        for logical, res in resources(synth, stack_id, type_).items():
            yield stack_id, logical, res


def depends_on(template: dict, logical: str) -> set[str]:
    """Logical ids `logical` waits for, directly or through other resources (DependsOn and references)."""
    res = template["Resources"]
    seen: set[str] = set()
    todo = [logical]
    while todo:
        current = res[todo.pop()]
        direct = current.get("DependsOn", [])
        direct = [direct] if isinstance(direct, str) else list(direct)
        for node in walk(current.get("Properties", {})):
            if isinstance(node, dict):
                if "Ref" in node and node["Ref"] in res:
                    direct.append(node["Ref"])
                if "Fn::GetAtt" in node and node["Fn::GetAtt"][0] in res:
                    direct.append(node["Fn::GetAtt"][0])
        for d in direct:
            if d not in seen:
                seen.add(d)
                todo.append(d)
    return seen


@pytest.fixture(scope="module")
def https_synth(tmp_path_factory):
    """The public front door: a certificate, internet-facing for one client range."""
    return synthesize(
        config_with(
            certificate_arn=CERTIFICATE_ARN, front={"scheme": "internet-facing", "client_cidrs": ["203.0.113.0/24"]}
        ),
        tmp_path_factory.mktemp("rules-https"),
    )


@pytest.fixture(scope="module")
def capacity_block_synth(tmp_path_factory):
    """Three units in two cells on a Capacity Block in one AZ of a two-AZ VPC."""
    config = config_with(
        units=3,
        units_per_cell=2,
        availability_zones=["us-east-1a", "us-east-1b"],
        capacity={"availability_zones": ["us-east-1b"], "reservation_id": RESERVATION_ID, "market": "capacity-block"},
    )
    return synthesize(config, tmp_path_factory.mktemp("rules-capacity-block"))


@pytest.fixture(params=["default", "https", "fleet", "capacity-block", "staging"])
def any_synth(request, default_synth, fleet_synth):
    if request.param == "default":
        return default_synth
    if request.param == "fleet":
        return fleet_synth
    return request.getfixturevalue(f"{request.param.replace('-', '_')}_synth")


# --- ECS --------------------------------------------------------------------------------------------
def test_service_registries_under_host_networking_name_a_container_and_port(any_synth):
    """ECS: "If the task definition that your service task specifies uses the bridge or host network
    mode, you must specify a containerName and containerPort combination from the task
    definition." -- ServiceRegistry, ECS API reference
    (https://docs.aws.amazon.com/AmazonECS/latest/APIReference/API_ServiceRegistry.html).
    CreateService fails otherwise: "When specifying 'host' or 'bridge' for networkMode, values for
    'containerName' and 'containerPort' must be specified from the task definition."
    (aws/aws-cdk#29245, where CDK drops both for HTTP-namespace services)."""
    checked = 0
    for stack_id, logical, service in all_of(any_synth, "AWS::ECS::Service"):
        props = service["Properties"]
        registries = props.get("ServiceRegistries", [])
        if not registries or "Ref" not in props["TaskDefinition"]:
            continue
        task = any_synth.template(stack_id)["Resources"][props["TaskDefinition"]["Ref"]]["Properties"]
        if task.get("NetworkMode") not in ("host", "bridge"):
            continue
        ports = {
            (c["Name"], m["ContainerPort"]) for c in task["ContainerDefinitions"] for m in c.get("PortMappings", [])
        }
        for registry in registries:
            assert (registry.get("ContainerName"), registry.get("ContainerPort")) in ports, (stack_id, logical)
            checked += 1
    assert checked >= 1  # the unit services are host-networked and registered


def test_capacity_provider_names_do_not_start_with_aws_ecs_or_fargate(any_synth):
    """ECS CreateCapacityProvider name: "The name can't be prefixed with "aws", "ecs", or
    "fargate"." (https://docs.aws.amazon.com/AmazonECS/latest/APIReference/API_CreateCapacityProvider.html).
    Without a Name, CloudFormation names the provider after the stack; CDK substitutes a safe name
    only for lowercase prefixes (aws/aws-cdk#29151, still open for `Ecs`/`AWS`: aws/aws-cdk#36584)."""
    stack_names = {s.node.id: s.stack_name for s in any_synth.stacks}
    providers = list(all_of(any_synth, "AWS::ECS::CapacityProvider"))
    assert providers
    for stack_id, logical, provider in providers:
        name = provider["Properties"].get("Name") or stack_names[stack_id]
        assert not name.lower().startswith(("aws", "ecs", "fargate")), (stack_id, logical, name)


@pytest.mark.parametrize("name", ["ecs-prod", "ECSprod", "Aws1", "FARGATE-x", "fargate"])
def test_config_refuses_deployment_names_ecs_would_refuse_as_capacity_provider_names(name):
    with pytest.raises(ConfigError, match=rf"^deployment_name='{name}' is not allowed: .*aws, ecs or fargate"):
        parse_config({"deployment_name": name})


def test_a_cluster_has_at_most_20_capacity_providers(fleet_synth):
    """ECS service quotas: "Capacity providers per cluster Each supported Region: 20 No"
    (https://docs.aws.amazon.com/AmazonECS/latest/developerguide/service-quotas.html)."""
    associations = list(all_of(fleet_synth, "AWS::ECS::ClusterCapacityProviderAssociations"))
    assert len(associations) == 16  # 320 units, 20 per cell
    for stack_id, _, association in associations:
        assert len(association["Properties"]["CapacityProviders"]) <= 20, stack_id


def test_managed_termination_protection_comes_with_managed_scaling_and_protected_instances(any_synth):
    """ECS AutoScalingGroupProvider.managedTerminationProtection: "When using managed termination
    protection, managed scaling must also be used otherwise managed termination protection
    doesn't work." and "The Auto Scaling group and each instance in the Auto Scaling group must have
    instance protection from scale-in actions on as well." (ECS API reference)."""
    for stack_id, logical, provider in all_of(any_synth, "AWS::ECS::CapacityProvider"):
        asg_provider = provider["Properties"]["AutoScalingGroupProvider"]
        if asg_provider.get("ManagedTerminationProtection") != "ENABLED":
            continue
        assert asg_provider["ManagedScaling"]["Status"] == "ENABLED", (stack_id, logical)
        asg = any_synth.template(stack_id)["Resources"][asg_provider["AutoScalingGroupArn"]["Ref"]]
        assert asg["Properties"]["NewInstancesProtectedFromScaleIn"] is True, (stack_id, logical)


def test_router_deployment_alarms_watch_only_what_a_router_revision_can_break(deployment_synth):
    """ECS rolls back a deployment when one of its alarms is in ALARM during it, whatever the
    cause ("Amazon ECS ... monitors the alarms ... If an alarm is in the ALARM state, ECS ... rolls
    back", https://docs.aws.amazon.com/AmazonECS/latest/developerguide/deployment-alarm-failure.html).
    A unit-readiness alarm fires while units load on a first deploy or roll out; TargetResponseTime
    ("the time elapsed after the request leaves the load balancer until a response from the target
    is received", ALB CloudWatch metrics) includes the units' whole generation for a non-streamed
    completion; HTTPCode_Target_5XX_Count includes the router's shedding 503s and the units' errors
    it relays. None of those is caused by a router revision: only the ALB's own 5xx, the router's
    own faults and added latency, and unhealthy router targets may roll it back."""
    router_caused = {
        ("AWS/ApplicationELB", "HTTPCode_ELB_5XX_Count"),
        ("AWS/ApplicationELB", "RequestCount"),  # the denominator of a rate
        ("AWS/ApplicationELB", "UnHealthyHostCount"),
        (contract.METRICS_NAMESPACE, contract.METRIC_ROUTER_FAULTS),
        (contract.METRICS_NAMESPACE, contract.METRIC_ROUTER_ADDED_LATENCY),
    }
    (router,) = [res for sid, _, res in all_of(deployment_synth, "AWS::ECS::Service") if sid == "Router"]
    names = router["Properties"]["DeploymentConfiguration"]["Alarms"]["AlarmNames"]
    assert names
    watched: set[tuple[str, str]] = set()
    for name in names:
        stack_id, ref = resolve(deployment_synth, "Router", name)
        alarm = deployment_synth.template(stack_id)["Resources"][ref["Ref"]]["Properties"]
        metrics = {(n["Namespace"], n["MetricName"]) for n in walk(alarm) if isinstance(n, dict) and "MetricName" in n}
        assert metrics and metrics <= router_caused, (ref, metrics - router_caused)
        watched |= metrics
    # All three things a router causes are watched: its 5xx, its added latency, unhealthy targets.
    assert {m for _, m in watched} >= {
        "HTTPCode_ELB_5XX_Count",
        contract.METRIC_ROUTER_FAULTS,
        contract.METRIC_ROUTER_ADDED_LATENCY,
        "UnHealthyHostCount",
    }


# --- ELB --------------------------------------------------------------------------------------------
def listeners(synth) -> dict[str, dict]:
    return resources(synth, "Front", "AWS::ElasticLoadBalancingV2::Listener")


def test_no_two_listeners_of_the_load_balancer_share_a_port(deployment_synth):
    """ELB CreateListener/ModifyListener fail with DuplicateListener: "A listener with the specified
    port already exists." (Elastic Load Balancing API reference, DuplicateListenerException)."""
    ports = [res["Properties"]["Port"] for res in listeners(deployment_synth).values()]
    assert len(ports) == len(set(ports)) == 2  # production and redirect (or parked)


@pytest.mark.parametrize("direction", ["add certificate", "remove certificate"])
def test_a_port_changes_listener_only_after_the_listener_holding_it_let_go(direction, default_synth, https_synth):
    """DuplicateListener (above) also holds during an update: a listener may take over a port only
    after the listener that held it moved away. CloudFormation updates a resource after the
    resources it depends on, and deletes removed resources only after every update ("if
    CloudFormation needs to replace an existing resource, it first creates a new resource and then
    deletes the old resource", UPDATE_COMPLETE_CLEANUP_IN_PROGRESS,
    https://docs.aws.amazon.com/AWSCloudFormation/latest/UserGuide/using-cfn-updating-stacks-monitor-stack.html).
    So for every port that changes hands, the listener holding it before is still in the new
    template and the listener taking it depends on it."""
    old, new = (default_synth, https_synth) if direction == "add certificate" else (https_synth, default_synth)
    old_ports = {res["Properties"]["Port"]: logical for logical, res in listeners(old).items()}
    new_template = new.template("Front")
    handovers = 0
    for logical, res in listeners(new).items():
        previous = old_ports.get(res["Properties"]["Port"])
        if previous is None or previous == logical:
            continue
        handovers += 1
        assert previous in new_template["Resources"], f"{previous} would free port {res['Properties']['Port']} last"
        assert previous in depends_on(new_template, logical), f"{logical} takes a port before {previous} frees it"
    assert handovers == 1  # port 80: production listener <-> redirect listener


def test_access_log_bucket_policy_has_no_region_lookup_that_fails_in_new_regions(default_synth, tmp_path):
    """CloudFormation: "Fn::FindInMap will always raise an error if it can't find the mapping"
    (aws-cloudformation/aws-cloudformation-templates#271), even in an Fn::If branch not taken, and
    FindInMap has no default without a transform (aws-cloudformation/cloudformation-coverage-roadmap#948).
    CDK's ELB account table misses regions such as ap-southeast-4 (Melbourne, a trn1 Capacity
    Block region): no template may look the account up by region in a mapping."""
    for stack_id, template in default_synth.templates.items():
        assert not any(isinstance(n, dict) and "Fn::FindInMap" in n for n in walk(template)), stack_id
    # With a region CDK has no ELB account for, only the log-delivery service principal is granted
    # ("For regions launched in August 2022 or later ... logdelivery.elasticloadbalancing.amazonaws.com",
    # ELB user guide, Enable access logs).
    synth = synthesize(
        config_with(region="ap-southeast-4", availability_zones=["ap-southeast-4a", "ap-southeast-4b"]), tmp_path
    )
    (policy,) = resources(synth, "Front", "AWS::S3::BucketPolicy").values()
    principals = [s["Principal"] for s in policy["Properties"]["PolicyDocument"]["Statement"] if s["Effect"] == "Allow"]
    assert principals == [{"Service": "logdelivery.elasticloadbalancing.amazonaws.com"}]


def test_the_alb_admits_clients_on_both_client_ports_with_or_without_a_certificate(default_synth, https_synth):
    """Discovery deploys before Front. If 443 closed with the certificate's removal, clients would be
    cut off between the two stacks' updates while the production listener still sits on 443 (and
    port 80 redirects there); the client ports therefore do not depend on the certificate."""
    for synth in (default_synth, https_synth):
        (group,) = resources(synth, "Discovery", "AWS::EC2::SecurityGroup").values()
        clients = sorted(r["FromPort"] for r in group["Properties"]["SecurityGroupIngress"])
        assert clients == [HTTP_PORT, 443]


# --- EC2 --------------------------------------------------------------------------------------------
def launch_templates(synth) -> list[dict]:
    return [res["Properties"]["LaunchTemplateData"] for _, _, res in all_of(synth, "AWS::EC2::LaunchTemplate")]


def test_capacity_block_launch_templates_target_exactly_the_block(capacity_block_synth):
    """A Capacity Block launch needs "The value MarketType of InstanceMarketOptions must be set to
    capacity-block", "A CapacityReservationSpecification with a valid CapacityReservationId" and "A
    valid InstanceType that matches the instance type of the Capacity Block"
    (https://docs.aws.amazon.com/pcs/latest/userguide/capacity-blocks-configure-cng.html); a
    reservation is targeted or preferred, "You can specify only one option at a time"
    (LaunchTemplateCapacityReservationSpecificationRequest, EC2 API reference); Capacity Blocks
    offer trn1.32xlarge, not trn1n (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-capacity-blocks.html)."""
    datas = launch_templates(capacity_block_synth)
    assert len(datas) == 3
    for data in datas:
        assert data["InstanceMarketOptions"] == {"MarketType": "capacity-block"}
        assert data["CapacityReservationSpecification"] == {
            "CapacityReservationTarget": {"CapacityReservationId": RESERVATION_ID}
        }
        assert data["InstanceType"] == "trn1.32xlarge"


def test_on_demand_launch_templates_leave_reservations_to_ec2(default_synth):
    """Without capacity settings EC2 uses any matching open Capacity Reservation by itself ("open -
    The instance can run in any open Capacity Reservation that has matching attributes", EC2 API
    reference): the launch template names no market and no reservation."""
    for data in launch_templates(default_synth):
        assert "InstanceMarketOptions" not in data and "CapacityReservationSpecification" not in data


def test_units_on_a_reservation_launch_in_its_availability_zone(capacity_block_synth):
    """ "Capacity Blocks are delivered as targeted capacity reservations in a single Availability
    Zone." (https://docs.aws.amazon.com/autoscaling/ec2/userguide/launch-template-capacity-blocks.html).
    Every unit ASG sits in the private subnet of the configured AZ (the second of the VPC's)."""
    asgs = list(all_of(capacity_block_synth, "AWS::AutoScaling::AutoScalingGroup"))
    assert len(asgs) == 3
    for stack_id, logical, asg in asgs:
        (subnet,) = asg["Properties"]["VPCZoneIdentifier"]
        _, value = resolve(capacity_block_synth, stack_id, subnet)
        assert re.fullmatch(r"VpcPrivateSubnet2Subnet[0-9A-F]+", value["Ref"]), (logical, value)


def test_launch_templates_map_no_instance_store_volumes(any_synth):
    """EC2: "NVMe instance store volumes are automatically enumerated and assigned a device name.
    Including them in your block device mapping has no effect." (BlockDeviceMapping.VirtualName,
    EC2 API reference). The instance store is found at boot (stacks/unit.py SCRATCH_SETUP); the
    mapping holds the root EBS volume only."""
    for data in launch_templates(any_synth):
        (root,) = data["BlockDeviceMappings"]
        assert root["DeviceName"] == "/dev/xvda" and "VirtualName" not in root and "Ebs" in root
