"""One unit: a model replica spread over several Trainium nodes (or x86 nodes, for a staging
fleet) that sit under one cluster placement group in one AZ, behind one ECS capacity provider,
running one ECS service whose tasks (one per node) form the unit through rendezvous (rank 0 leads)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from aws_cdk import Duration, RemovalPolicy, Tags
from aws_cdk import aws_autoscaling as autoscaling
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from aws_cdk import aws_servicediscovery as cloudmap
from constructs import Construct

import contract
from stacks.discovery import register_unit_members
from stacks.hosts import UnitHost, ami_parameter
from stacks.nag import cfn_child
from stacks.node_boot import SCRATCH_CONTAINER_PATH, SCRATCH_HOST_PATH, node_user_data


def unit_ami(shape: UnitHost) -> ec2.IMachineImage:
    """The pinned ECS AMI release the unit's hosts boot (stacks/hosts.py says which and why)."""
    return ec2.MachineImage.from_ssm_parameter(ami_parameter(shape.instance_type), os=ec2.OperatingSystemType.LINUX)


def memory_reservation_mib(shape: UnitHost) -> int:
    """MEMORY_RESERVATION_MIB, or half the host's memory on a small host: ECS places a task only on an
    instance that registered at least this much, and registers less than the instance has."""
    return min(MEMORY_RESERVATION_MIB, shape.memory_gib * 1024 // 2)


# A soft reservation only (no hard limit): the container may use all of the host's memory. It
# stays well below what ECS registers for a 512 GiB trn1 (ECS keeps some for the OS and agent)
# so placement never fails on it; distinctInstance already gives each node one task.
MEMORY_RESERVATION_MIB = 64 * 1024
# ECS (EC2 launch type) allows at most 120 s between SIGTERM and SIGKILL.
STOP_TIMEOUT = Duration.seconds(120)
# Neuron runtime and vLLM workers exchange tensors through /dev/shm.
SHARED_MEMORY_MIB = 64 * 1024
# Failures inside the start period do not count towards the retries ("If a health check succeeds
# within the startPeriod, then the container is considered healthy", API_HealthCheck.html); 300 s is
# ECS's maximum. Loading takes longer: the service's health-check grace period covers the rest.
HEALTH_START_PERIOD = Duration.seconds(300)


@dataclass(frozen=True)
class UnitSurge:
    """How a unit rolls to a new revision (config.unit_rollout).

    replace: ECS stops the unit's tasks, then starts the new ones on the same instances; the unit
    leaves the router's rotation while it re-forms. surge: the ASG may hold twice the nodes
    (FlotillaConfig.max_nodes_per_unit), so the new revision forms on fresh instances beside the
    old one; the old tasks drain once the new ones pass their container health check, which they
    do only after their unit has been ready. Waves of units are CellStack's (config.wave_plan).
    """

    min_healthy_percent: int
    max_healthy_percent: int

    @classmethod
    def for_rollout(cls, rollout: str) -> "UnitSurge":
        if rollout == "surge":
            return cls(min_healthy_percent=100, max_healthy_percent=200)
        return cls(min_healthy_percent=0, max_healthy_percent=100)


def efa_network_interfaces(*, efa_interfaces: int, security_group_id: str) -> list[dict]:
    """LaunchTemplateData.NetworkInterfaces: one EFA interface per network card.

    Card 0 carries the primary interface (device index 0); the others attach at device index 1 of
    their own card. No AssociatePublicIpAddress: EC2 rejects it when an instance launches with
    more than one interface, and never auto-assigns a public IPv4 address in that case.
    """
    return [
        {
            "NetworkCardIndex": card,
            "DeviceIndex": 0 if card == 0 else 1,
            "InterfaceType": "efa",
            "Groups": [security_group_id],
            "DeleteOnTermination": True,
            "Description": f"EFA card {card}",
        }
        for card in range(efa_interfaces)
    ]


@dataclass(frozen=True)
class UnitProps:
    """Everything one unit is built from, decided by its cell (stacks/cell.py): the cell's shared
    cluster, roles, image and log group, the network it sits in, and this unit's own settings."""

    unit_id: str
    family: str  # the task definition family
    cluster: ecs.Cluster
    vpc: ec2.IVpc
    subnet: ec2.ISubnet  # one subnet: the placement group and EFA traffic live in one AZ
    router_security_group: ec2.ISecurityGroup
    instance_type: str
    shape: UnitHost
    nodes: int
    max_nodes: int  # the ASG's maximum (twice the nodes under surge)
    surge: UnitSurge
    instance_profile: iam.IInstanceProfile
    root_volume_gib: int
    image: ecs.ContainerImage
    task_role: iam.IRole
    execution_role: iam.IRole
    log_group: logs.ILogGroup
    environment: Mapping[str, str]
    units_service: cloudmap.IService
    health_check_grace: Duration
    instance_store: bool = False
    # The bucket the boot installs its artifacts from (contract/node_boot.py): the model bucket.
    artifact_bucket: str = ""
    capacity_reservation_id: str | None = None
    capacity_reservation_group_arn: str | None = None
    market_type: str = "on-demand"
    own_placement_group: bool = True
    placement_group_name: str | None = None
    drained: bool = False
    # With the scaler: the unit's desired count as the cell's counts parameter holds it (a token),
    # instead of nodes; CloudFormation then writes back what the scaler set (docs/scaling.md).
    scaled_count: float | None = None

    def __post_init__(self) -> None:
        if self.own_placement_group and self.placement_group_name:
            raise ValueError(
                f"{self.unit_id}: own_placement_group and placement_group_name={self.placement_group_name!r} "
                "exclude each other"
            )


class ServingUnit(Construct):
    """One unit serving the model, on Trainium or on the x86 hosts of a staging fleet: placement
    group, launch template, single-subnet ASG, capacity provider and ECS service."""

    def __init__(self, scope: Construct, id_: str, props: UnitProps) -> None:
        super().__init__(scope, id_)
        self.unit_id = props.unit_id
        # On every resource of the unit, and through the ASG and ECS tag propagation on its
        # instances and tasks: cost allocation and `describe-*` filters per unit.
        Tags.of(self).add("flotilla:unit", props.unit_id)
        self._placement_group(props)
        self._security_group(props)
        self._launch_template(props)
        self._capacity(props)
        self._task_definition(props)
        self._container(props)
        self._service(props)

    def _placement_group(self, props: UnitProps) -> None:
        # Its own cluster placement group; or, with a reservation, the group the reservation was
        # created in (placement_group_name), or none (stacks/config.py check_capacity says why).
        self.placement_group = (
            ec2.CfnPlacementGroup(self, "PlacementGroup", strategy="cluster") if props.own_placement_group else None
        )
        self.placement_group_name = (
            self.placement_group.ref if self.placement_group is not None else props.placement_group_name
        )

    def _security_group(self, props: UnitProps) -> None:
        """EFA as the EC2 user guide prepares it ("Prepare an EFA-enabled security group": a group
        that "allows all inbound and outbound traffic to and from the security group itself"): the
        OS-bypass traffic matches only a rule that references the group, never a CIDR rule, so the
        self egress is its own rule. Every other outbound rule is stated here: with
        allow_all_outbound=True CDK keeps only 0.0.0.0/0 and drops added egress rules
        (aws/aws-cdk#38558), which is how the self egress went missing before."""
        self.security_group = ec2.SecurityGroup(
            self,
            "Sg",
            vpc=props.vpc,
            allow_all_outbound=False,
            description=f"flotilla {props.unit_id}: EFA and collectives between the unit nodes",
        )
        self.security_group.add_ingress_rule(
            self.security_group,
            ec2.Port.all_traffic(),
            "EFA requires all traffic from members of the same security group",
        )
        self.security_group.add_egress_rule(
            self.security_group,
            ec2.Port.all_traffic(),
            "EFA requires all traffic to members of the same security group",
        )
        # The ECS agent, image pulls (ECR and its S3 layers), the model bucket, CloudWatch Logs and
        # the AWS APIs rendezvous calls: all HTTPS, through the VPC endpoints or the NAT gateways.
        # DNS, NTP and instance metadata go to the VPC's link-local services, which security groups
        # do not filter (Amazon VPC user guide, "Control traffic to your AWS resources using
        # security groups": not filtered are Amazon DNS, DHCP, EC2 instance metadata, ECS task
        # metadata endpoints and the Amazon Time Sync Service).
        self.security_group.add_egress_rule(
            ec2.Peer.any_ipv4(), ec2.Port.tcp(443), "AWS APIs, image pulls and the model bucket over HTTPS"
        )
        self.security_group.add_ingress_rule(
            props.router_security_group,
            ec2.Port.tcp(contract.NODE_API_PORT),
            "Router to the node API (requests, health, load)",
        )

    def _launch_template(self, props: UnitProps) -> None:
        shape = props.shape
        # Installs from props.artifact_bucket only, verified, before the ECS agent starts (stacks/node_boot.py).
        user_data = node_user_data(
            instance_store=props.instance_store,
            efa_interfaces=shape.efa_interfaces,
            artifact_bucket=props.artifact_bucket,
        )
        self.launch_template = ec2.LaunchTemplate(
            self,
            "LaunchTemplate",
            instance_type=ec2.InstanceType(props.instance_type),
            machine_image=unit_ami(shape),
            instance_profile=props.instance_profile,
            # On the instance's one interface without EFA; with EFA it moves to the interfaces below.
            security_group=self.security_group,
            user_data=user_data,
            require_imdsv2=True,
            http_put_response_hop_limit=1,
            block_devices=[
                ec2.BlockDevice(
                    device_name="/dev/xvda",
                    volume=ec2.BlockDeviceVolume.ebs(
                        props.root_volume_gib,
                        encrypted=True,
                        volume_type=ec2.EbsDeviceVolumeType.GP3,
                        delete_on_termination=True,
                    ),
                )
            ],
            detailed_monitoring=True,
        )
        cfn_lt = cfn_child(self.launch_template, ec2.CfnLaunchTemplate)
        if self.placement_group_name:
            cfn_lt.add_property_override("LaunchTemplateData.Placement", {"GroupName": self.placement_group_name})
        if shape.efa_interfaces:
            cfn_lt.add_property_override(
                "LaunchTemplateData.NetworkInterfaces",
                efa_network_interfaces(
                    efa_interfaces=shape.efa_interfaces, security_group_id=self.security_group.security_group_id
                ),
            )
            # Security groups live on the interfaces; EC2 rejects both at once.
            cfn_lt.add_property_deletion_override("LaunchTemplateData.SecurityGroupIds")
        # Without EFA (an x86 staging type) the instance keeps one ordinary interface with the unit's
        # security group, and no public address (the private props.subnet does not map one).
        # A targeted reservation: one target, no preference ("You can specify only one option at a
        # time", LaunchTemplateCapacityReservationSpecificationRequest, EC2 API reference). A
        # Capacity Block is a targeted reservation launched with MarketType capacity-block
        # (https://docs.aws.amazon.com/autoscaling/ec2/userguide/launch-template-capacity-blocks.html).
        # stacks/config.py check_capacity refuses the combinations EC2 would.
        target = {}
        if props.capacity_reservation_id:
            target = {"CapacityReservationId": props.capacity_reservation_id}
        elif props.capacity_reservation_group_arn:
            target = {"CapacityReservationResourceGroupArn": props.capacity_reservation_group_arn}
        if target:
            cfn_lt.add_property_override(
                "LaunchTemplateData.CapacityReservationSpecification", {"CapacityReservationTarget": target}
            )
        if props.market_type != "on-demand":
            cfn_lt.add_property_override("LaunchTemplateData.InstanceMarketOptions", {"MarketType": props.market_type})

    def _capacity(self, props: UnitProps) -> None:
        self.auto_scaling_group = autoscaling.AutoScalingGroup(
            self,
            "Asg",
            vpc=props.vpc,
            launch_template=self.launch_template,
            # Exactly one props.subnet: the placement group and EFA traffic live in one AZ.
            vpc_subnets=ec2.SubnetSelection(subnets=[props.subnet]),
            # Created at 0 and brought up by the unit's own tasks: the capacity provider's managed
            # scaling launches what PROVISIONING tasks need ("Amazon ECS manages the scale-in and
            # scale-out actions of the Auto Scaling group", ECS API reference, ManagedScaling). A unit
            # short of capacity is then one service waiting, not a group the stack waits on, and a
            # cell deployed with --no-rollback keeps its other units serving (docs/runbooks/
            # partial-cell.md). No desired capacity: it would reset on every deploy. The max is the
            # one the quota checks count.
            min_capacity=0,
            max_capacity=props.max_nodes,
        )

        self.capacity_provider = ecs.AsgCapacityProvider(
            self,
            "CapacityProvider",
            auto_scaling_group=self.auto_scaling_group,
            enable_managed_scaling=True,
            target_capacity_percent=100,
            enable_managed_termination_protection=True,
            enable_managed_draining=True,
            # Trainium instances come up slowly (Neuron driver, EFA); don't count them as
            # capacity before they register.
            instance_warmup_period=600,
            machine_image_type=ecs.MachineImageType.AMAZON_LINUX_2,
        )
        props.cluster.add_asg_capacity_provider(self.capacity_provider)

    def _task_definition(self, props: UnitProps) -> None:
        self.task_definition = ecs.Ec2TaskDefinition(
            self,
            "Task",
            family=props.family,
            network_mode=ecs.NetworkMode.HOST,
            task_role=props.task_role,
            execution_role=props.execution_role,
        )
        # A task definition is replaced on every revision (its container definitions are
        # create-only), and by default CloudFormation deregisters the replaced one once the update
        # completes (aws/aws-cdk#24372), which `flotilla rollback` cannot then use ("you can't update
        # an existing service to reference an INACTIVE task definition", ECS DeregisterTaskDefinition).
        # Retain keeps previous revisions ACTIVE. DeletionPolicy goes with it (cfn-lint W3011): a
        # teardown leaves the unit's revisions registered too. Revisions cost nothing; clean-up in
        # docs/runbooks/rollback-units.md and teardown.md.
        self.task_definition.apply_removal_policy(RemovalPolicy.RETAIN)
        # Each revision runs only on the instance type it was built for: its devices (16 or 32
        # uverbs for 8 or 16 EFA interfaces) exist only there. Without it, an props.instance_type change
        # with `replace` starts the new tasks on the old instances, which fail, and the deployment
        # rolls back. ecs.instance-type is a built-in container instance attribute, and memberOf is
        # the task-definition placement constraint type (ECS developer guide,
        # task-placement-constraints.html: "attribute:ecs.instance-type == t2.small").
        self.task_definition.add_placement_constraint(
            ecs.PlacementConstraint.member_of(f"attribute:ecs.instance-type == {props.instance_type}")
        )

    def _container(self, props: UnitProps) -> None:
        shape = props.shape
        linux = ecs.LinuxParameters(
            self, "Linux", shared_memory_size=min(SHARED_MEMORY_MIB, memory_reservation_mib(shape))
        )
        linux.add_capabilities(ecs.Capability.IPC_LOCK)
        rw = [ecs.DevicePermission.READ, ecs.DevicePermission.WRITE]
        # Neuron devices (none on an x86 host) and the EFA user-space verbs devices, one per EFA
        # interface (none without EFA).
        devices = [f"/dev/neuron{i}" for i in range(shape.chips)]
        devices += [f"/dev/infiniband/uverbs{i}" for i in range(shape.efa_interfaces)]
        if devices:
            linux.add_devices(*[ecs.Device(host_path=d, container_path=d, permissions=rw) for d in devices])
        url = f"http://127.0.0.1:{contract.NODE_API_PORT}{contract.NODE_CONTAINER_HEALTH_PATH}"
        self.container = self.task_definition.add_container(
            "node",
            image=props.image,
            command=list(contract.NODE_COMMAND),
            essential=True,
            memory_reservation_mib=memory_reservation_mib(shape),
            environment=dict(props.environment),
            linux_parameters=linux,
            port_mappings=[ecs.PortMapping(container_port=contract.NODE_API_PORT)],
            logging=ecs.LogDrivers.aws_logs(stream_prefix=props.unit_id, log_group=props.log_group),
            stop_timeout=STOP_TIMEOUT,
            # Started, then alive (docs/node.md "Health"). ECS counts a task towards the minimum
            # healthy percent once its container health check passes ("A task is considered healthy
            # when all essential containers within the task have passed their health checks",
            # API_DeploymentConfiguration.html), so the check fails until the unit has served: a
            # rollout never stops the old revision early. After that it means alive, not ready: a
            # unit re-forming after a member died must not have its other members killed by ECS.
            health_check=ecs.HealthCheck(
                command=[
                    "CMD-SHELL",
                    f"python3 -c \"import urllib.request; urllib.request.urlopen('{url}', timeout=4)\" || exit 1",
                ],
                interval=Duration.seconds(30),
                timeout=Duration.seconds(5),
                retries=3,
                start_period=HEALTH_START_PERIOD,
            ),
        )
        self.container.add_ulimits(ecs.Ulimit(name=ecs.UlimitName.MEMLOCK, soft_limit=-1, hard_limit=-1))
        if props.instance_store:
            # The node fetches the model and the compiled artifacts here: the instance store, not
            # the container's writable layer on the root volume.
            self.task_definition.add_volume(name="scratch", host=ecs.Host(source_path=SCRATCH_HOST_PATH))
            self.container.add_mount_points(
                ecs.MountPoint(container_path=SCRATCH_CONTAINER_PATH, source_volume="scratch", read_only=False)
            )

    def _service(self, props: UnitProps) -> None:
        self.service = ecs.Ec2Service(
            self,
            "Service",
            cluster=props.cluster,
            task_definition=self.task_definition,
            # A unit in the config's drained_units stays at 0 across deploys (a drain made with
            # `flotilla drain-unit` alone is written back by the next update of the service).
            desired_count=0 if props.drained else props.nodes if props.scaled_count is None else props.scaled_count,
            capacity_provider_strategies=[
                ecs.CapacityProviderStrategy(capacity_provider=self.capacity_provider.capacity_provider_name, weight=1)
            ],
            placement_constraints=[ecs.PlacementConstraint.distinct_instances()],
            min_healthy_percent=props.surge.min_healthy_percent,
            max_healthy_percent=props.surge.max_healthy_percent,
            circuit_breaker=ecs.DeploymentCircuitBreaker(rollback=True),
            # A new task that is still loading its model must not be replaced for failing checks.
            health_check_grace_period=props.health_check_grace,
            enable_ecs_managed_tags=True,
            propagate_tags=ecs.PropagatedTagSource.SERVICE,
        )
        if props.drained:
            # What `flotilla status` reads: props.drained on purpose (and in the config), not failing.
            Tags.of(self.service).add(contract.TAG_DRAINED_DESIRED_COUNT, str(props.nodes))
            Tags.of(self.service).add(contract.TAG_DRAINED_IN_CONFIG, "true")
        # The router finds the members through Cloud Map: ECS registers each task (docs/discovery.md).
        register_unit_members(self.service, units_service=props.units_service)
