"""flotilla's one typed deployment configuration, validated before any stack is built.

Sources, later wins: built-in defaults < cdk.json context key `flotilla` < `-c config=file.yaml`.
The sections are pydantic models; a rejected value raises ConfigError whose message is one line in
contract.bad_input's wording: the key, the bad value, what is allowed. This module must not import
aws_cdk: it is also the fast path for config-only tests.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, BeforeValidator, Field, ValidationError, model_validator

import contract
from contract.declare import Integer, Items, Matches, OneOf, refused
from contract.rollout import WavePlan, default_units_per_wave, plan_waves
from contract.speculation import Speculation
from stacks.config_rules import ConfigError as ConfigError  # re-exported: callers import it from here
from stacks.config_rules import Section
from stacks.config_sections import AZ_RE
from stacks.config_sections import LIVE_TARGET_GROUPS as LIVE_TARGET_GROUPS  # stacks/front.py reads it here
from stacks.config_sections import CapacityConfig as CapacityConfig  # re-exported: callers import the sections here
from stacks.config_sections import FrontConfig as FrontConfig
from stacks.config_sections import NodeConfig as NodeConfig
from stacks.config_sections import RouterConfig as RouterConfig
from stacks.front_door import check_front_door
from stacks.hosts import HOST_INSTANCES, UnitHost, is_trainium
from stacks.model_config import (
    ModelConfig,
    check_engine_fits_instance,
    check_model_layout,
)
from stacks.scaling_config import ScalingConfig, check_scaling, section_type
from stacks.speculation import SpeculationSection

# --- Limits that shape the layout (AWS service quotas) -------------------------------------------
MAX_CONTAINER_INSTANCES_PER_CLUSTER = 5000  # ECS
MAX_RESOURCES_PER_STACK = 500  # CloudFormation
MAX_OUTPUTS_PER_STACK = 200  # CloudFormation quotas: "Outputs: 200 per template", not adjustable
# "Placement groups: 500 per Region", not adjustable (EC2 user guide, placement-groups.html, rules
# and limitations): each unit gets its own cluster placement group unless capacity.placement_group
# names a shared one.
MAX_PLACEMENT_GROUPS_PER_REGION = 500
# The VPC is a /16 (stacks/network.py). Its private subnets are /18 (16,384 addresses minus the 5 AWS
# reserves) up to three AZs; four /18s would fill the /16 and leave no room for the public /24s, so
# four to six AZs get /19s (6 x 8,192 + 6 x 256 addresses fit the 65,536). Each subnet's mask follows
# from the AZ count alone, so a deployment of up to three AZs keeps its /18s.
PRIVATE_SUBNET_MASK = 18
PRIVATE_SUBNET_MASK_MANY_AZS = 19
MAX_AZS_FOR_WIDE_SUBNETS = 3


def private_subnet_mask(az_count: int) -> int:
    return PRIVATE_SUBNET_MASK if az_count <= MAX_AZS_FOR_WIDE_SUBNETS else PRIVATE_SUBNET_MASK_MANY_AZS


def usable_ips(mask: int) -> int:
    return int(2 ** (32 - mask)) - 5


USABLE_IPS_PER_PRIVATE_SUBNET = usable_ips(PRIVATE_SUBNET_MASK)

# CloudFormation resources one Cell stack emits: a fixed part (cluster, capacity-provider
# association, shared roles, log group...) plus a part per unit. stacks/cell.py and stacks/unit.py
# emit exactly this; tests/stacks/test_cell_stack.py checks it against the synthesized templates,
# so the quota check below can run before anything is built.
CELL_FIXED_RESOURCES = 10
UNIT_RESOURCES = 10
# The Discovery stack: the namespace, the ALB security group and its ALB -> router ingress rule, plus
# one Cloud Map service per cell (stacks/discovery.py).
DISCOVERY_FIXED_RESOURCES = 3
# Discovery's outputs: three it declares plus the exports other stacks import (the ALB security
# group, one Cloud Map service per cell). Observability's resources: the topic, its key and policy,
# the dashboard and six fleet-wide alarms, plus one ready-units alarm per cell.
# tests/stacks/test_hard_limits.py checks both against synthesized templates.
DISCOVERY_FIXED_OUTPUTS = 4
OBSERVABILITY_FIXED_RESOURCES = 10

# Cloud Map quotas (https://docs.aws.amazon.com/cloud-map/latest/dg/cloud-map-limits.html) and the
# router's use of them (docs/discovery.md). Every unit member is one instance in its cell's service.
CLOUDMAP_INSTANCES_PER_SERVICE = 1000  # not adjustable; DiscoverInstances also returns at most 1,000
CLOUDMAP_INSTANCES_PER_NAMESPACE = 2000  # default, adjustable
CLOUDMAP_DISCOVER_INSTANCES_PER_S = 1000  # DiscoverInstances, per account, steady rate; adjustable
CLOUDMAP_DISCOVER_REVISION_PER_S = 3000  # DiscoverInstancesRevision, per account; adjustable
# Seconds between the router's discovery passes with Cloud Map: each pass asks every cell's service
# for its revision and reads again the services that moved.
ROUTER_DISCOVERY_INTERVAL_S = contract.CLOUDMAP_DISCOVERY_INTERVAL_S

UNIT_ROLLOUTS = ("replace", "surge")
# ECS: "The name can't be prefixed with "aws", "ecs", or "fargate"." (CreateCapacityProvider,
# https://docs.aws.amazon.com/AmazonECS/latest/APIReference/API_CreateCapacityProvider.html).
# CloudFormation names each unit's capacity provider after its stack, <deployment_name>-Cell-<n>;
# CDK renames only lowercase matches (aws/aws-cdk#29151, still open for `Ecs...`/`AWS...`:
# aws/aws-cdk#36584), so the config refuses the prefixes in any case.
RESERVED_NAME_PREFIXES = ("aws", "ecs", "fargate")
_REGION_RE = re.compile(r"^[a-z]{2}(-gov)?-[a-z]+-\d$")
_ACCOUNT_RE = re.compile(r"^\d{12}$")
_IMAGE_RE = re.compile(r"^[a-z0-9.-]+(:\d+)?/[a-z0-9._/-]+(:[\w.-]{1,128}|@sha256:[0-9a-f]{64})$")
_CERT_RE = re.compile(r"^arn:aws(-[a-z]+)*:acm:[a-z0-9-]+:\d{12}:certificate/[0-9a-f-]{36}$")
_EMAIL_RE = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
_DEPLOYMENT_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9-]{0,23}$")
_REVISION_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_UNIT_ID_RE = re.compile(r"^cell\d+-unit\d+$")


@dataclass(frozen=True)
class UnitPlacement:
    """Where one unit lives: its cell, its index inside the cell and its AZ slot."""

    cell: int
    index: int  # 0..units_per_cell-1 inside the cell
    global_index: int  # 0..units-1 across the fleet
    az_index: int  # index into the VPC's AZs (round-robin over the fleet)

    @property
    def unit_id(self) -> str:
        return contract.unit_id(self.cell, self.index)


class FlotillaConfig(Section):
    """The whole deployment. Built by load_config(); read-only afterwards."""

    deployment_name: Annotated[
        str, Matches(_DEPLOYMENT_NAME_RE, "1-24 characters: a letter, then letters, digits or -")
    ] = "flotilla"
    """Prefix of the CloudFormation stack names (`flotilla-Cell-0`); not starting with aws, ecs or fargate
    in any case (ECS refuses capacity providers so named, aws/aws-cdk#29151)."""
    instance_type: Annotated[str, OneOf(*HOST_INSTANCES)] = "trn1.32xlarge"
    """The node type. Trainium (16 chips; 32, 32 or 64 NeuronCores; 8, 16 or 16 EFA interfaces,
    [hardware.md](hardware.md)) takes the `neuron` engine only; the x86 types (2 or 4 vCPUs, no EFA) take
    the `reference` or `echo` engine only, for a staging fleet ([staging](runbooks/staging-before-production.md))."""
    nodes_per_unit: Annotated[int, Integer(1, 64)] = 1
    """Instances per model replica (rank 0 leads); the node runtime accepts at most 64 too. With the
    `neuron` engine it also picks the image: 1 runs AWS's vLLM image, more NxD Inference split over every
    node's NeuronCores. Synth refuses a layout the model's shape does not split into
    ([model-layout.md](model-layout.md)); `flotilla plan` recommends 1 whenever the model fits."""
    units: Annotated[int, Integer(1, 10000)] = 1
    """Model replicas in the fleet; with `scaling`, the most the scaler may run."""
    units_per_cell: Annotated[
        int,
        Integer(
            1,
            contract.MAX_UNITS_PER_CELL,
            f"ECS allows {contract.MAX_UNITS_PER_CELL} capacity providers per cluster, one per unit",
        ),
    ] = contract.MAX_UNITS_PER_CELL
    """Units per ECS cluster (`Cell-<n>` stack). Fixed once deployed: a new value moves units to other
    cells, which `flotilla check-update` refuses. An account whose ECS quota is 10 sets 10."""
    availability_zones: Annotated[
        tuple[Annotated[str, Matches(AZ_RE, "AZ names like us-east-1a")], ...],
        Items(
            "a list of 2 to 6 AZ names like [us-east-1a, us-east-1b], or [] for the region's first three",
            lambda n: n == 0 or 2 <= n <= 6,
        ),
    ] = ()
    """2 to 6 AZs of one region the VPC spans, in order; `[]`: the region's first three (`Fn::GetAZs`,
    environment-agnostic). Trainium is offered in a few AZs only: name those of your capacity (with
    `region` set synth refuses `[]` for a Trainium type). New AZs on a running deployment are a new
    deployment (CloudFormation refuses to replace subnets other stacks import)."""
    account: Annotated[str | None, Matches(_ACCOUNT_RE, "a 12-digit account id", optional=True)] = None
    """The AWS account to deploy to; unset with `region`: environment-agnostic templates."""
    region: Annotated[str | None, Matches(_REGION_RE, "a region like us-east-1", optional=True)] = None
    """The AWS region to deploy to; unset: environment-agnostic templates."""
    model: ModelConfig = Field(default_factory=ModelConfig)
    """The model: where it is published, its name and its shape."""
    image: Annotated[
        str | None,
        Matches(
            _IMAGE_RE,
            "an image URI with a tag or digest, like 123456789012.dkr.ecr.us-east-1.amazonaws.com/flotilla:1.0",
            optional=True,
        ),
    ] = None
    """A prebuilt image; unset: built at `make deploy`, for `neuron` units from `runtime/Dockerfile.neuron`
    (one node) or `runtime/Dockerfile.neuron-multinode` (more), for the others from `runtime/Dockerfile`."""
    certificate_arn: Annotated[str | None, Matches(_CERT_RE, "an ACM certificate ARN", optional=True)] = None
    """HTTPS on the ALB (Front stack), with this certificate of the deployment's region; unset: HTTP on 80."""
    alarm_email: Annotated[str | None, Matches(_EMAIL_RE, "an e-mail address", optional=True)] = None
    """Subscribes this address to the alarms' SNS topic (Observability stack)."""
    # YAML reads `revision: 2` as a number; the revision is a label, so take its text.
    revision: Annotated[str, Matches(_REVISION_RE, "1-64 characters: letters, digits, . _ -"), BeforeValidator(str)] = (
        "1"
    )
    """The deployment revision every task carries: change it to roll every unit."""
    unit_rollout: Annotated[str, OneOf(*UNIT_ROLLOUTS)] = "surge"
    """How a unit rolls to a new revision. `surge` (zero downtime): minimum healthy 100 %, maximum 200 %;
    the ASG may grow to twice `nodes_per_unit` so the new revision forms beside the old one, which then
    drains (needs that spare capacity in the AZ). `replace`: the unit's tasks stop, then start on the same
    instances; the unit is out of rotation while it re-forms ([rollouts](rollouts.md))."""
    units_per_wave: Annotated[
        int | None,
        Integer(1, 10000, "units that roll at once", optional=True),
    ] = None
    """Units that roll at once, fleet-wide, at most `units` (`contract/rollout.py` lays it out as units per
    cell wave times cells at once); unset: about 10 % of `units`, at least 1. First creation uses the same
    waves."""
    node: NodeConfig = Field(default_factory=NodeConfig)
    """The unit members' container."""
    router: RouterConfig = Field(default_factory=RouterConfig)
    """The router service."""
    capacity: CapacityConfig = Field(default_factory=CapacityConfig)
    """Where the Trainium instances come from."""
    drained_units: Annotated[
        tuple[Annotated[str, Matches(_UNIT_ID_RE, "unit ids like cell0-unit3")], ...],
        Items("a list of unit ids like [cell0-unit3]"),
    ] = ()
    """Units of the layout the template holds at desired count 0, so a deploy never brings them back:
    CloudFormation writes a service's desired count on every update, so a drain made only with
    `flotilla drain-unit` is undone by the next deploy that updates the unit. `flotilla status` shows them
    drained."""
    front: FrontConfig = Field(default_factory=FrontConfig)
    """Who may call the fleet: the ALB's scheme and clients, API keys."""
    speculation: SpeculationSection = Field(default_factory=Speculation)  # after node: checked against it
    """Speculative decoding on every unit."""
    scaling: ScalingConfig | None = None  # with it, units is the ceiling (stacks/scaling_config.py)
    """Units follow demand between `scaling.floor` and `units` ([scaling.md](scaling.md)); unset: `units`
    always serve."""

    @model_validator(mode="after")
    def _fits_aws(self) -> FlotillaConfig:
        azs = list(self.availability_zones)
        if len(set(azs)) != len(azs):
            raise ConfigError("availability_zones", azs, "each AZ at most once")
        if len({az[:-1] for az in azs}) > 1:
            raise ConfigError("availability_zones", azs, "AZs of one region")
        if self.region and azs and azs[0][:-1] != self.region:
            raise ConfigError("availability_zones", azs, f"AZs of region {self.region}")
        if self.region and not azs and is_trainium(self.instance_type):
            # Fn::GetAZs takes the region's first three AZs whatever they offer, and Trainium is sold
            # in a few AZs only; a unit's group has one subnet, so it cannot fall back to another AZ.
            # Which AZs offer a type depends on the account (AZ names are mapped per account), so
            # only the operator's own lookup can name them; an environment-agnostic synth gets the
            # warning in stacks/deployment.py instead.
            raise ConfigError(
                "availability_zones",
                azs,
                f"2 to 6 AZs of {self.region} that offer {self.instance_type} when region is set (else the VPC "
                "takes the region's first three whatever they offer); list them with aws ec2 "
                "describe-instance-type-offerings --location-type availability-zone --filters "
                f"Name=instance-type,Values={self.instance_type} --region {self.region}",
            )
        if self.units_per_wave is not None and self.units_per_wave > self.units:
            raise ConfigError("units_per_wave", self.units_per_wave, f"at most units ({self.units})")
        if self.deployment_name.lower().startswith(RESERVED_NAME_PREFIXES):
            raise ConfigError(
                "deployment_name",
                self.deployment_name,
                "a name not starting with aws, ecs or fargate in any case (ECS refuses capacity-provider "
                "names with those prefixes, and each unit's is named after its stack)",
            )
        check_engine_fits_instance(self)
        check_front_door(self)
        check_capacity(self)
        check_quotas(self)
        check_scaling(self)
        known = {p.unit_id for c in range(self.cells) for p in self.units_in_cell(c)}
        unknown = [u for u in self.drained_units if u not in known]
        if unknown:
            raise ConfigError(
                "drained_units", list(self.drained_units), f"unit ids of this layout ({', '.join(unknown)} is not one)"
            )
        check_model_layout(self)
        return self

    # --- derived layout ---------------------------------------------------------------------
    @property
    def shape(self) -> UnitHost:
        return HOST_INSTANCES[self.instance_type]

    @property
    def az_count(self) -> int:
        return len(self.availability_zones) or 3

    @property
    def private_subnet_mask(self) -> int:
        return private_subnet_mask(self.az_count)

    @property
    def usable_ips_per_private_subnet(self) -> int:
        return usable_ips(self.private_subnet_mask)

    @property
    def unit_az_indexes(self) -> tuple[int, ...]:
        """Indexes into the VPC's AZs (its private subnets) that units go to, in order."""
        if self.capacity.availability_zones:
            return tuple(self.availability_zones.index(az) for az in self.capacity.availability_zones)
        return tuple(range(self.az_count))

    @property
    def cells(self) -> int:
        return math.ceil(self.units / self.units_per_cell)

    @property
    def chips(self) -> int:
        return self.units * self.nodes_per_unit * self.shape.chips

    @property
    def wave_plan(self) -> WavePlan:
        """How the rollout budget (units_per_wave) splits into units per cell and cells at once."""
        return plan_waves(self.units, self.units_per_cell, self.units_per_wave)

    @property
    def effective_units_per_wave(self) -> int:
        return self.units_per_wave if self.units_per_wave is not None else default_units_per_wave(self.units)

    @property
    def unit_placement_group(self) -> str | None:
        """The existing placement group every unit launches into; None: each unit creates its own
        (own_placement_groups) or uses none."""
        group = self.capacity.placement_group
        return None if group in (None, "none") else group

    @property
    def own_placement_groups(self) -> bool:
        """Each unit creates its own cluster placement group: no capacity.placement_group set and no
        Capacity Block (whose instances launch without one, check_capacity)."""
        return self.capacity.placement_group is None and self.capacity.market != "capacity-block"

    @property
    def max_nodes_per_unit(self) -> int:
        """ASG maximum: room for a second revision of the unit when rolling out with surge."""
        return self.nodes_per_unit * (2 if self.unit_rollout == "surge" else 1)

    def units_in_cell(self, cell: int) -> list[UnitPlacement]:
        azs = self.unit_az_indexes
        first = cell * self.units_per_cell
        last = min(self.units, first + self.units_per_cell)
        return [
            UnitPlacement(cell=cell, index=g - first, global_index=g, az_index=azs[g % len(azs)])
            for g in range(first, last)
        ]


# Trainium types EC2 sells as Capacity Blocks for ML: "trn1.32xlarge -- US East (N. Virginia) |
# Asia Pacific (Melbourne)"; trn1n.32xlarge is not listed
# (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-capacity-blocks.html; the list grows:
# add a type here when AWS does).
CAPACITY_BLOCK_INSTANCE_TYPES = ("trn1.32xlarge",)


def check_capacity(cfg: FlotillaConfig) -> None:
    """Refuse capacity settings EC2 would reject at launch, before anything is built.

    Sources: "You can specify only one option at a time" (a preference or a target) --
    LaunchTemplateCapacityReservationSpecificationRequest, EC2 API reference; a Capacity Block
    needs "The value MarketType of InstanceMarketOptions must be set to capacity-block" and "A
    CapacityReservationSpecification with a valid CapacityReservationId"
    (https://docs.aws.amazon.com/pcs/latest/userguide/capacity-blocks-configure-cng.html); "Capacity
    Blocks are delivered as targeted capacity reservations in a single Availability Zone"
    (https://docs.aws.amazon.com/autoscaling/ec2/userguide/launch-template-capacity-blocks.html),
    and an On-Demand Capacity Reservation too holds capacity in one AZ (CreateCapacityReservation
    takes one AvailabilityZone).
    """
    cap = cfg.capacity
    unit_azs = list(cap.availability_zones)
    if unit_azs:
        if not cfg.availability_zones:
            raise ConfigError(
                "capacity.availability_zones",
                unit_azs,
                "needs availability_zones set explicitly (units can only be pinned to AZs the VPC names)",
            )
        if len(set(unit_azs)) != len(unit_azs):
            raise ConfigError("capacity.availability_zones", unit_azs, "each AZ at most once")
        outside = [az for az in unit_azs if az not in cfg.availability_zones]
        if outside:
            raise ConfigError(
                "capacity.availability_zones",
                unit_azs,
                f"AZs from availability_zones {list(cfg.availability_zones)} ({', '.join(outside)} is not one)",
            )
    if cap.reservation_id and cap.reservation_group_arn:
        raise ConfigError(
            "capacity.reservation_group_arn",
            cap.reservation_group_arn,
            "unset when capacity.reservation_id is set (a launch targets one reservation or one group)",
        )
    if cap.reservation_group_arn and cfg.region and f":{cfg.region}:" not in cap.reservation_group_arn:
        raise ConfigError(
            "capacity.reservation_group_arn", cap.reservation_group_arn, f"a group in region {cfg.region}"
        )
    if cap.market == "capacity-block":
        if not cap.reservation_id:
            raise ConfigError(
                "capacity.market",
                cap.market,
                "capacity-block only with capacity.reservation_id set to the Capacity Block's reservation id",
            )
        if cfg.instance_type not in CAPACITY_BLOCK_INSTANCE_TYPES:
            raise ConfigError(
                "instance_type",
                cfg.instance_type,
                f"one of {', '.join(CAPACITY_BLOCK_INSTANCE_TYPES)} with capacity.market capacity-block "
                "(the Trainium types EC2 offers as Capacity Blocks)",
            )
    # A reservation is usable from a cluster placement group only if it was created in that group
    # (EC2 user guide, "Capacity Reservations in cluster placement groups"); a new group per unit
    # would never match it, and eksctl#7949 got 11 of 16 reserved instances that way. AWS
    # ParallelCluster refuses a placement group with a Capacity Block ("a placement group constraint
    # should not be set as insufficient capacity errors may occur", cli/src/pcluster/validators/
    # ec2_validators.py): we follow ParallelCluster there, since EC2's guide documents only ODCRs.
    reserved = cap.reservation_id or cap.reservation_group_arn
    if cap.market == "capacity-block" and cap.placement_group not in (None, "none"):
        raise ConfigError(
            "capacity.placement_group",
            cap.placement_group,
            "none or unset with capacity.market capacity-block (a Capacity Block's instances are placed "
            "together already; a placement group makes launches fail with insufficient capacity)",
        )
    if reserved and cap.market != "capacity-block" and cap.placement_group is None:
        raise ConfigError(
            "capacity.placement_group",
            None,
            "the name of the cluster placement group the reservation was created in, or none, when "
            "capacity.reservation_id or reservation_group_arn is set (EC2 launches into a reservation only "
            "from its own placement group)",
        )
    if cap.reservation_id and len(unit_azs) != 1:
        raise ConfigError(
            "capacity.availability_zones",
            unit_azs,
            "exactly one AZ, the one capacity.reservation_id holds capacity in (a Capacity Reservation "
            "or Capacity Block is in a single AZ)",
        )


def estimate_cell_resources(units_in_cell: int) -> int:
    return CELL_FIXED_RESOURCES + UNIT_RESOURCES * units_in_cell


def estimate_discovery_resources(cells: int) -> int:
    return DISCOVERY_FIXED_RESOURCES + cells


def cloudmap_quota_warnings(cfg: FlotillaConfig) -> list[str]:
    """The adjustable Cloud Map quotas this layout needs raised, each with the number to request.
    (The hard ones, instances per service and stack size, refuse the config in check_quotas.)"""
    out: list[str] = []
    members = cfg.units * cfg.max_nodes_per_unit
    if members > CLOUDMAP_INSTANCES_PER_NAMESPACE:
        during = f" during a {cfg.unit_rollout} rollout" if cfg.unit_rollout == "surge" else ""
        out.append(
            f"Cloud Map 'Instances per namespace' is {CLOUDMAP_INSTANCES_PER_NAMESPACE:,} by default and this "
            f"fleet registers up to {members:,} unit members{during}: request at least {members:,} in "
            "Service Quotas (AWS Cloud Map) before deploying, or ECS cannot register the rest"
        )
    passes_per_s = cfg.router.max_count / ROUTER_DISCOVERY_INTERVAL_S
    revisions = math.ceil(passes_per_s * cfg.cells)
    if revisions > CLOUDMAP_DISCOVER_REVISION_PER_S:
        out.append(
            f"{cfg.router.max_count} routers asking {cfg.cells} cell services every "
            f"{ROUTER_DISCOVERY_INTERVAL_S:g} s make {revisions:,} DiscoverInstancesRevision calls/s; the "
            f"account quota is {CLOUDMAP_DISCOVER_REVISION_PER_S:,}: request at least {revisions:,}"
        )
    if revisions > CLOUDMAP_DISCOVER_INSTANCES_PER_S:
        out.append(
            f"while every cell changes at once (a fleet-wide rollout) {cfg.router.max_count} routers read "
            f"{cfg.cells} cell services every {ROUTER_DISCOVERY_INTERVAL_S:g} s: up to {revisions:,} "
            f"DiscoverInstances calls/s against an account quota of {CLOUDMAP_DISCOVER_INSTANCES_PER_S:,} "
            f"(throttled routers keep their last view): request at least {revisions:,}"
        )
    return out


def check_quotas(cfg: FlotillaConfig) -> None:
    """Refuse a layout that would break an AWS limit at deploy time."""
    biggest_cell = min(cfg.units, cfg.units_per_cell)
    instances = biggest_cell * cfg.max_nodes_per_unit
    if instances > MAX_CONTAINER_INSTANCES_PER_CLUSTER:
        raise ConfigError(
            "units_per_cell",
            cfg.units_per_cell,
            f"at most {MAX_CONTAINER_INSTANCES_PER_CLUSTER // cfg.max_nodes_per_unit} with "
            f"{cfg.max_nodes_per_unit} instances per unit (ECS allows "
            f"{MAX_CONTAINER_INSTANCES_PER_CLUSTER} container instances per cluster)",
        )
    per_stack = estimate_cell_resources(biggest_cell)
    if per_stack > MAX_RESOURCES_PER_STACK:
        raise ConfigError(
            "units_per_cell",
            cfg.units_per_cell,
            f"at most {(MAX_RESOURCES_PER_STACK - CELL_FIXED_RESOURCES) // UNIT_RESOURCES} "
            f"(a cell stack would hold {per_stack} resources; CloudFormation allows "
            f"{MAX_RESOURCES_PER_STACK})",
        )
    # Every EFA interface takes an address of the unit's private subnet.
    unit_azs = len(cfg.unit_az_indexes)
    units_in_busiest_az = math.ceil(cfg.units / unit_azs)
    # A node without EFA (an x86 staging type) still takes its primary interface's address.
    per_node = max(cfg.shape.efa_interfaces, 1)
    ips = units_in_busiest_az * cfg.max_nodes_per_unit * per_node
    if ips > cfg.usable_ips_per_private_subnet:
        per_az = cfg.usable_ips_per_private_subnet // (cfg.max_nodes_per_unit * per_node)
        raise ConfigError(
            "units",
            cfg.units,
            f"at most {per_az * unit_azs} over {unit_azs} AZs ({ips} EFA addresses would "
            f"be needed in one /{cfg.private_subnet_mask} private subnet; add AZs or reduce units)",
        )
    # One Cloud Map service per cell holds every member of the cell's units, twice over while a
    # surge rollout runs both revisions (docs/discovery.md).
    per_service = biggest_cell * cfg.max_nodes_per_unit
    if per_service > CLOUDMAP_INSTANCES_PER_SERVICE:
        during = " during a surge rollout" if cfg.unit_rollout == "surge" else ""
        raise ConfigError(
            "units_per_cell",
            cfg.units_per_cell,
            f"at most {CLOUDMAP_INSTANCES_PER_SERVICE // cfg.max_nodes_per_unit} with "
            f"{cfg.max_nodes_per_unit} members per unit{during}"
            f" (a cell's Cloud Map service would hold {per_service:,} instances; Cloud Map allows "
            f"{CLOUDMAP_INSTANCES_PER_SERVICE:,} per service, not adjustable)",
        )
    if cfg.own_placement_groups and cfg.units > MAX_PLACEMENT_GROUPS_PER_REGION:
        raise ConfigError(
            "units",
            cfg.units,
            f"at most {MAX_PLACEMENT_GROUPS_PER_REGION} with a cluster placement group per unit (EC2 allows "
            f"{MAX_PLACEMENT_GROUPS_PER_REGION} per Region); or set capacity.placement_group to share one",
        )
    outputs = cfg.cells + DISCOVERY_FIXED_OUTPUTS
    if outputs > MAX_OUTPUTS_PER_STACK:
        raise ConfigError(
            "units",
            cfg.units,
            f"at most {(MAX_OUTPUTS_PER_STACK - DISCOVERY_FIXED_OUTPUTS) * cfg.units_per_cell} with units_per_cell "
            f"{cfg.units_per_cell} (the Discovery stack would have {outputs} outputs, one export per cell; "
            f"CloudFormation allows {MAX_OUTPUTS_PER_STACK})",
        )
    observability = cfg.cells + OBSERVABILITY_FIXED_RESOURCES
    if observability > MAX_RESOURCES_PER_STACK:
        raise ConfigError(
            "units",
            cfg.units,
            f"at most {(MAX_RESOURCES_PER_STACK - OBSERVABILITY_FIXED_RESOURCES) * cfg.units_per_cell} with "
            f"units_per_cell {cfg.units_per_cell} (the Observability stack would hold {observability} resources, "
            f"one alarm per cell; CloudFormation allows {MAX_RESOURCES_PER_STACK})",
        )
    discovery = estimate_discovery_resources(cfg.cells)
    if discovery > MAX_RESOURCES_PER_STACK:
        raise ConfigError(
            "units",
            cfg.units,
            f"at most {(MAX_RESOURCES_PER_STACK - DISCOVERY_FIXED_RESOURCES) * cfg.units_per_cell} with "
            f"units_per_cell {cfg.units_per_cell} (the Discovery stack would hold {discovery} resources, "
            f"one Cloud Map service per cell; CloudFormation allows {MAX_RESOURCES_PER_STACK})",
        )


# --- adjustable quotas: synth warns with the number to request ---------------------------------
@dataclass(frozen=True)
class QuotaNotice:
    """An adjustable Service Quotas quota and what this config needs of it.

    `default` is AWS's default value (None when AWS sets it per account); `needed` counts steady
    state, `peak` what the ASG maxima allow while units roll out with surge.
    """

    key: str  # short id for the synth annotation
    quota: str  # the quota's name in Service Quotas
    code: str
    default: int | None
    needed: int
    peak: int
    counted: str  # what the number counts

    @property
    def exceeds_default(self) -> bool:
        return self.default is not None and self.peak > self.default

    @property
    def worth_a_warning(self) -> bool:
        """Above AWS's default, or a default set per account (often 0 for Trainium): say so at synth."""
        return self.default is None or self.exceeds_default

    def message(self) -> str:
        default = f"default {self.default:,}" if self.default is not None else "its value is set per account"
        text = (
            f'Service Quotas "{self.quota}" ({self.code}, adjustable; {default}): this config needs '
            f"{self.needed:,} ({self.counted})"
        )
        text += f", up to {self.peak:,} while units roll out with surge." if self.peak > self.needed else "."
        if self.exceeds_default:
            return text + f" Request at least {self.peak:,} in the deployment region before deploying."
        return text + f" Check that the quota in the deployment region covers {self.peak:,}; request that if not."


# "Network interfaces per Region": 5,000 by default, adjustable (Amazon VPC quotas,
# https://docs.aws.amazon.com/vpc/latest/userguide/amazon-vpc-limits.html, "Network interfaces"
# table; the default as listed by third-party quota tables, the AWS row itself was not read). Every
# EFA interface is a network interface (InterfaceType efa in the launch template), as is each
# awsvpc task (the router on Fargate), each interface-endpoint subnet and each NAT gateway.
ENI_QUOTA = ("Network interfaces per Region", "L-DF5E4CA3", 5000)
# "Running On-Demand Trn instances", counted in vCPUs, adjustable, per-account default
# (https://docs.aws.amazon.com/ec2/latest/instancetypes/ec2-instance-quotas.html).
TRN_VCPU_QUOTA = ("Running On-Demand Trn instances", "L-2C3B7624")
# The x86 staging types (M family) count against the standard instances' vCPU quota (same page).
STANDARD_VCPU_QUOTA = ("Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances", "L-1216C47A")
INTERFACE_ENDPOINT_SERVICES = 3  # ECR API, ECR Docker, CloudWatch Logs (stacks/network.py)
# Adjustable quotas with AWS's defaults: "Auto Scaling groups per region" 500 (EC2 Auto Scaling
# user guide, ec2-auto-scaling-quotas.html); "EC2-VPC Elastic IPs" 5 per Region (EC2 user guide,
# elastic-ip-addresses-eip.html, "Elastic IP address quota"); "VPCs per Region" 5 (Amazon VPC
# quotas). Each unit has one group; each AZ one NAT gateway with one Elastic IP; the deployment one
# VPC. Other workloads of the account share them: synth says what this deployment needs of each.
ASG_QUOTA = ("Auto Scaling groups per region", "L-CDE20ADC", 500)
EIP_QUOTA = ("EC2-VPC Elastic IPs", "L-0263D0A3", 5)
VPC_QUOTA = ("VPCs per Region", "L-F678F1CE", 5)


def quota_notices(cfg: FlotillaConfig) -> list[QuotaNotice]:
    """The adjustable quotas this config leans on, with the numbers to request (see QuotaNotice)."""
    nodes, peak_nodes = cfg.units * cfg.nodes_per_unit, cfg.units * cfg.max_nodes_per_unit
    efa = max(cfg.shape.efa_interfaces, 1)  # an x86 node without EFA: its primary interface
    # Router tasks: up to max_count, twice that during a blue/green deployment.
    fixed = 2 * cfg.router.max_count + (INTERFACE_ENDPOINT_SERVICES + 1) * cfg.az_count
    name, code, default = ENI_QUOTA
    enis = QuotaNotice(
        key="network-interfaces",
        quota=name,
        code=code,
        default=default,
        needed=nodes * efa + fixed,
        peak=peak_nodes * efa + fixed,
        counted=(f"{efa} EFA interfaces" if cfg.shape.efa_interfaces else "1 network interface")
        + f" on each of {nodes:,} nodes, plus router tasks, endpoints and NAT gateways",
    )
    name, code = TRN_VCPU_QUOTA if is_trainium(cfg.instance_type) else STANDARD_VCPU_QUOTA
    vcpus = QuotaNotice(
        key="trn-vcpus" if is_trainium(cfg.instance_type) else "standard-vcpus",
        quota=name,
        code=code,
        default=None,
        needed=nodes * cfg.shape.vcpus,
        peak=peak_nodes * cfg.shape.vcpus,
        counted=f"{nodes:,} x {cfg.instance_type} at {cfg.shape.vcpus} vCPUs",
    )

    def steady(key: str, quota: tuple[str, str, int], needed: int, counted: str) -> QuotaNotice:
        """A quota that rollouts do not raise: the same need steady and at peak."""
        name, code, default = quota
        return QuotaNotice(key=key, quota=name, code=code, default=default, needed=needed, peak=needed, counted=counted)

    return [
        enis,
        vcpus,
        steady("auto-scaling-groups", ASG_QUOTA, cfg.units, f"one per unit, {cfg.units:,} units"),
        steady(
            "elastic-ips",
            EIP_QUOTA,
            cfg.az_count,
            f"one per NAT gateway, {cfg.az_count} AZs; other VPCs of the account use the same quota",
        ),
        steady("vpcs", VPC_QUOTA, 1, "this deployment's VPC"),
    ]


# --- parsing -----------------------------------------------------------------------------------
def _section_at(path: tuple[str, ...]) -> type[BaseModel]:
    section: type[BaseModel] = FlotillaConfig
    for key in path:
        section = section_type(section.model_fields[key].annotation)
    return section


def _config_error(exc: ValidationError) -> ConfigError:
    """pydantic's report (every error, several lines each) -> the one line an operator reads."""
    errors = exc.errors(include_url=False)
    # A misspelt key explains the errors it causes, so it goes first.
    err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    ctx = err.get("ctx") or {}
    raised = ctx.get("error")
    if isinstance(raised, ConfigError):  # raised by a model validator as is
        return raised
    path = tuple(part for part in err["loc"] if isinstance(part, str))  # list indexes dropped
    key = ".".join(path) or "flotilla"
    problem_fix = refused(err)
    if problem_fix is not None:
        return ConfigError(key, err["input"], problem_fix[1], problem=problem_fix[0])
    if err["type"] == "extra_forbidden":
        known = ", ".join(_section_at(path[:-1]).model_fields)
        return ConfigError(key, err["input"], f"use one of {known}", problem="is not a known key")
    elif err["type"] in ("model_type", "model_attributes_type"):
        allowed = "a mapping with keys " + ", ".join(_section_at(path).model_fields)
    else:  # a check without its own wording: pydantic's sentence, still one line
        allowed = " ".join(err["msg"].split())
    return ConfigError(key, err["input"], allowed)


def parse_config(raw: Mapping[str, Any]) -> FlotillaConfig:
    """Validate a plain mapping (merged context + YAML) into a FlotillaConfig, or raise ConfigError."""
    try:
        return FlotillaConfig.model_validate(dict(raw) if isinstance(raw, Mapping) else raw)
    except ValidationError as exc:
        raise _config_error(exc) from None


def _deep_merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), Mapping) else v
    return out


def load_config(context: Mapping[str, Any] | None, config_path: str | None) -> FlotillaConfig:
    """The cdk.json `flotilla` context, overridden by the YAML file at config_path (if any)."""
    raw: dict[str, Any] = {}
    if context is not None:
        if not isinstance(context, Mapping):
            raise ConfigError("flotilla", context, "a mapping of flotilla settings (cdk.json context key `flotilla`)")
        raw = dict(context)
    if config_path:
        path = Path(config_path)
        if not path.is_file():
            raise ConfigError("config", config_path, "path to an existing YAML file")
        try:
            overrides = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as err:
            first = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise ConfigError("config", config_path, f"valid YAML ({first})") from None
        if not isinstance(overrides, Mapping):
            raise ConfigError("config", config_path, "a YAML mapping of flotilla settings at top level")
        model = overrides.get("model")
        if isinstance(model, Mapping) and isinstance(model.get("config_json"), str):
            # A model's config.json is named relative to the YAML file that names it.
            overrides = {**overrides, "model": {**model, "config_json": str(path.parent / model["config_json"])}}
        raw = _deep_merge(raw, overrides)
    return parse_config(raw)
