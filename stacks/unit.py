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
from stacks.hosts import UnitHost

# The ECS-optimized AL2023 Neuron AMI release the units run, never "recommended": that one moves its
# Neuron driver (aws/amazon-ecs-ami scripts/enable-ecs-agent-inferentia-support.sh installs the latest
# aws-neuronx-dkms at build time), while the containers' runtime stays at Neuron SDK 2.28, and driver
# 2.29 "requires Neuron Runtime Library 2.33 or later ... [else] nrt_init() [fails]" (aws-neuron/aws-neuron-sdk
# @81ce03ae:release-notes/components/runtime.rst:329). Release 20260403 (aws/amazon-ecs-ami@eb80a9f, built
# 2026-04-03) predates SDK 2.29 (2026-04-09), so it carries the SDK 2.28 driver line (2.26.10.0,
# runtime.rst:742-747). The parameter is ECS's per-release form, /<variant>/<AMI name>/image_id
# (Amazon ECS developer guide, "Retrieving Amazon ECS-optimized Linux AMI metadata": ".../amazon-linux-2023/
# <version>"). The variant is "neuron": AWS's own release script reads .../amazon-linux-2023/neuron/recommended
# (aws/amazon-ecs-ami@eb80a9f:generate-release-notes.sh:155; aws/aws-cdk#34689 moved CDK from "inf", the
# Amazon Linux 2 variant, for this reason; some copies of the ECS guide still print "inf" for AL2023).
# The AMI name is the al2023neu build's, <prefix>-neuron-hvm-2023.0.<version><kernel>-x86_64
# (al2023neu.pkr.hcl:2) with version 20260403 and kernel -kernel-6.1 (release-al2023.auto.pkrvars.hcl:1,10)
# and the public prefix al2023-ami-ecs (the releases' notes name al2023-ami-ecs-neuron-hvm-... AMIs).
# docs/hardware.md.
NEURON_AMI_NAME = "al2023-ami-ecs-neuron-hvm-2023.0.20260403-kernel-6.1-x86_64"
NEURON_AMI_PARAMETER = f"/aws/service/ecs/optimized-ami/amazon-linux-2023/neuron/{NEURON_AMI_NAME}/image_id"


# The x86 staging hosts run the plain ECS-optimized AL2023 AMI of the same ECS AMI release
# (aws/amazon-ecs-ami@eb80a9f builds every variant of 20260403), pinned the same way and for the same
# reason: a replacement node must boot what its peers booted. Parameter form: Amazon ECS developer
# guide, "Retrieving Amazon ECS-optimized Linux AMI metadata"
# (https://docs.aws.amazon.com/AmazonECS/latest/developerguide/retrieve-ecs-optimized_AMI.html),
# section "Systems Manager Parameter Store parameter format": "Amazon Linux 2023 AMI metadata:
# /aws/service/ecs/optimized-ami/amazon-linux-2023/<version>" (the x86_64 variant has no variant
# segment; arm64, neuron and gpu do); "the metadata of a specific Amazon ECS-optimized AMI version
# [is retrieved] by specifying the AMI name" (its example is Amazon Linux 2's
# .../amazon-linux-2/amzn2-ami-ecs-hvm-2.0.20181112-x86_64-ebs); and the AMI ID alone is the
# "sub-parameter image_id" (.../amazon-linux-2023/recommended/image_id). Together:
# /aws/service/ecs/optimized-ami/amazon-linux-2023/<AMI name>/image_id.
X86_AMI_NAME = "al2023-ami-ecs-hvm-2023.0.20260403-kernel-6.1-x86_64"
X86_AMI_PARAMETER = f"/aws/service/ecs/optimized-ami/amazon-linux-2023/{X86_AMI_NAME}/image_id"


def neuron_ami() -> ec2.IMachineImage:
    """The unit's AMI: the pinned Neuron ECS AMI release (see NEURON_AMI_NAME)."""
    return ec2.MachineImage.from_ssm_parameter(NEURON_AMI_PARAMETER, os=ec2.OperatingSystemType.LINUX)


def x86_ami() -> ec2.IMachineImage:
    """A staging unit's AMI: the pinned x86_64 ECS AMI release (see X86_AMI_NAME)."""
    return ec2.MachineImage.from_ssm_parameter(X86_AMI_PARAMETER, os=ec2.OperatingSystemType.LINUX)


def unit_ami(shape: UnitHost) -> ec2.IMachineImage:
    """Trainium hosts boot the Neuron AMI (its driver exposes /dev/neuron*); x86 hosts the plain one."""
    return neuron_ami() if shape.chips else x86_ami()


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
# Model artifacts and the compile cache: where the node container writes them (the image's
# FLOTILLA_CACHE_DIR and the parent of the node's default model and compiled-artifact directories,
# runtime/node/settings.py) and the host directory the instance store is mounted at.
SCRATCH_CONTAINER_PATH = "/var/cache/flotilla"
SCRATCH_HOST_PATH = "/mnt/flotilla"

# User data: stripe the instance's NVMe instance-store volumes into one RAID0 XFS file system at
# SCRATCH_HOST_PATH. EC2 exposes them without a block device mapping ("NVMe instance store volumes
# are automatically enumerated and assigned a device name. Including them in your block device
# mapping has no effect." -- EC2 API reference, BlockDeviceMapping.VirtualName) under the NVMe
# model name "Amazon EC2 NVMe Instance Storage", which udev links as
# /dev/disk/by-id/nvme-Amazon_EC2_NVMe_Instance_Storage_* (the EKS AMI finds them the same way:
# awslabs/amazon-eks-ami@029ecebc:templates/shared/runtime/bin/setup-local-disks). User data runs
# before the ECS agent starts (the agent reads the /etc/ecs/ecs.config it writes,
# https://docs.aws.amazon.com/AmazonECS/latest/developerguide/bootstrap_container_instance.html),
# so no task starts before the mount. The fstab entry (by UUID, nofail) brings it back after a
# reboot; without instance-store volumes the directory stays on the root volume.
SCRATCH_SETUP = f"""\
scratch={SCRATCH_HOST_PATH}
by_id=/dev/disk/by-id
mkdir -p "$scratch"
if ! mountpoint -q "$scratch"; then
  mapfile -t disks < <(for link in "$by_id"/*NVMe_Instance_Storage_*; do
    [ -e "$link" ] && readlink -f "$link"
  done | sort -u)
  device=""
  if [ "${{#disks[@]}}" -gt 1 ]; then
    command -v mdadm >/dev/null || dnf install -y mdadm
    mdadm --create /dev/md/flotilla --level=0 --raid-devices="${{#disks[@]}}" --run "${{disks[@]}}"
    device=/dev/md/flotilla
  elif [ "${{#disks[@]}}" -eq 1 ]; then
    device="${{disks[0]}}"
  fi
  if [ -n "$device" ]; then
    mkfs.xfs -f "$device"
    echo "UUID=$(blkid -s UUID -o value "$device") $scratch xfs defaults,noatime,nofail 0 2" >> /etc/fstab
    mount "$scratch"
  else
    echo "flotilla: no NVMe instance store found; $scratch stays on the root volume" >&2
  fi
fi
mkdir -p "$scratch/model" "$scratch/neuron-compiled"
"""


# First lines of the user data: a failed boot step (a failed `dnf install mdadm`, a RAID that does not
# assemble) must not leave a node that joins its unit with the model on the 128 GiB root volume and
# fails hours later. Every error stops the script, says which command failed on stderr (cloud-init
# copies it to /var/log/cloud-init-output.log and the console output,
# https://cloudinit.readthedocs.io/en/latest/reference/base_config_reference.html#output) and powers
# the instance off before the ECS agent starts (ecs.service runs after cloud-final.service on the ECS
# AMI, https://docs.aws.amazon.com/AmazonECS/latest/developerguide/bootstrap_container_instance.html).
# Auto Scaling counts an instance in any state but running as unhealthy and replaces it ("Amazon EC2
# Auto Scaling considers ... unhealthy" a stopped instance, ec2-auto-scaling-health-checks.html), so
# the failure shows as a replaced node in the group's activities, which `flotilla status` reads.
# The ERR trap names the failed command; the EXIT trap catches what stops the script without ERR:
# under `set -u` an unset variable ends a non-interactive bash at once, running the EXIT trap and
# not the ERR one (bash manual, "The Set Builtin" -u and "Bourne Shell Builtins" trap; checked with
# bash 5), and the ECS agent would then start on a half-booted node: ecs.service is ordered After=
# cloud-final.service, an ordering only, which "is independent of the requirement dependencies"
# (systemd.unit(5), After=), so it starts whatever the user data's exit status.
BOOT_PROLOGUE = """\
set -euo pipefail
boot_failed() {
  trap - EXIT
  echo "flotilla: boot failed (exit $1) at line $2: $3; powering off" >&2
  poweroff
  exit "$1"
}
trap 'boot_failed $? $LINENO "$BASH_COMMAND"' ERR
trap 'status=$?; if [ "$status" -ne 0 ]; then boot_failed "$status" "$LINENO" "the script stopped"; fi' EXIT
"""


# Host EFA: the ECS Neuron AMI installs no EFA component (aws/amazon-ecs-ami@eb80a9f
# scripts/enable-ecs-agent-inferentia-support.sh), and the container's libfabric (installed with
# --skip-kmod) needs the host's EFA kernel driver and rdma-core; AWS's EKS AL2023 AMI puts them on
# the host with `efa_installer.sh --minimal -y` (awslabs/amazon-eks-ami@1403405
# templates/al2023/provisioners/install-efa.sh). docs/hardware.md "Host EFA" has the decision.
# Version and download URL: EC2 user guide, "Get started with EFA and MPI" (efa-start.html, step
# "Install the EFA software": curl -O https://efa-installer.amazonaws.com/aws-efa-installer-1.47.0.tar.gz).
# The SHA256 is the one AWS publishes for 1.47.0 (EC2 user guide, "Verify the EFA installer using a
# checksum", efa-verify.html: "If the checksums do not match, do not run the installation script"):
# pinned here, it checks the tarball without trusting a key fetched from the same host.
EFA_INSTALLER_VERSION = "1.47.0"
EFA_INSTALLER_URL = f"https://efa-installer.amazonaws.com/aws-efa-installer-{EFA_INSTALLER_VERSION}.tar.gz"
EFA_INSTALLER_SHA256 = "2df4201e046833c7dc8160907bee7f52b76ff80ed147376a2d0ed8a0dd66b2db"
# Written once the installer has run: a second run of the script (cloud-init runs user data once per
# instance, but an operator may re-run it) goes straight to the checks. The DKMS-built module and
# rdma-core stay installed across reboots, and udev loads the module when the EFA devices appear.
EFA_INSTALLED_MARKER = f"/var/lib/flotilla/efa-installer-{EFA_INSTALLER_VERSION}"


def efa_setup(efa_interfaces: int) -> str:
    """User data for a host with EFA interfaces: install the pinned EFA installer's host part
    (kernel driver and rdma-core), verified against AWS's published checksum, then check that the
    host shows one verbs device per EFA interface, the devices the task definition maps
    (/dev/infiniband/uverbs0..N-1): without them ECS could not start the task at all.

    Runs under BOOT_PROLOGUE: any failure (download, checksum, installer, device count) powers the
    instance off before the ECS agent starts. Every wait is bounded (curl's --max-time, udevadm's
    --timeout)."""
    return f"""\
efa_marker={EFA_INSTALLED_MARKER}
if [ ! -e "$efa_marker" ]; then
  command -v tar >/dev/null || dnf install -y tar gzip
  efa_dir=$(mktemp -d)
  curl --fail --silent --show-error --location --retry 5 --retry-connrefused --connect-timeout 10 \\
    --max-time 600 -o "$efa_dir/aws-efa-installer.tar.gz" {EFA_INSTALLER_URL}
  echo "{EFA_INSTALLER_SHA256}  $efa_dir/aws-efa-installer.tar.gz" | sha256sum --check --strict -
  tar -xzf "$efa_dir/aws-efa-installer.tar.gz" -C "$efa_dir"
  cd "$efa_dir/aws-efa-installer"
  ./efa_installer.sh --minimal -y
  cd /
  rm -rf "$efa_dir"
  mkdir -p "$(dirname "$efa_marker")"
  touch "$efa_marker"
fi
modprobe efa
udevadm settle --timeout=60
shopt -s nullglob
uverbs=(/dev/infiniband/uverbs*)
shopt -u nullglob
if [ "${{#uverbs[@]}}" -ne {efa_interfaces} ]; then
  echo "flotilla: ${{#uverbs[@]}} EFA verbs devices, expected {efa_interfaces} (one per EFA interface)" >&2
  false
fi
"""


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


class TrainiumUnit(Construct):
    """Placement group, launch template, single-subnet ASG, capacity provider and ECS service."""

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
        # EFA needs all traffic allowed between the unit's own interfaces (and nothing else in).
        self.security_group = ec2.SecurityGroup(
            self,
            "Sg",
            vpc=props.vpc,
            allow_all_outbound=True,
            description=f"flotilla {props.unit_id}: EFA and collectives between the unit nodes",
        )
        self.security_group.add_ingress_rule(
            self.security_group,
            ec2.Port.all_traffic(),
            "EFA requires all traffic from members of the same security group",
        )
        self.security_group.add_ingress_rule(
            props.router_security_group,
            ec2.Port.tcp(contract.NODE_API_PORT),
            "Router to the node API (requests, health, load)",
        )

    def _launch_template(self, props: UnitProps) -> None:
        shape = props.shape
        user_data = ec2.UserData.for_linux()
        user_data.add_commands(BOOT_PROLOGUE)
        if props.instance_store:
            user_data.add_commands(SCRATCH_SETUP)
        # Only where the instance has EFA interfaces (every Trainium type; no x86 staging type).
        if shape.efa_interfaces:
            user_data.add_commands(efa_setup(shape.efa_interfaces))
        # Host-network tasks only get their task role credentials when the agent allows it.
        user_data.add_commands("echo ECS_ENABLE_TASK_IAM_ROLE_NETWORK_HOST=true >> /etc/ecs/ecs.config")
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
        cfn_lt: ec2.CfnLaunchTemplate = self.launch_template.node.default_child
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
