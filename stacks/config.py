"""flotilla's one typed deployment configuration, validated before any stack is built.

Sources, later wins: built-in defaults < cdk.json context key `flotilla` < `-c config=file.yaml`.
A rejected value raises ConfigError whose message is one line: the key, the bad value, what is
allowed. This module must not import aws_cdk: it is also the fast path for config-only tests.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

# --- Limits that shape the layout (architecture §3; AWS service quotas) -------------------------
MAX_CAPACITY_PROVIDERS_PER_CLUSTER = 20     # ECS, not adjustable: one capacity provider per unit
MAX_CONTAINER_INSTANCES_PER_CLUSTER = 5000  # ECS
MAX_RESOURCES_PER_STACK = 500               # CloudFormation
# Private subnets are /18 (see stacks/network.py): 16,384 addresses minus the 5 AWS reserves.
PRIVATE_SUBNET_MASK = 18
USABLE_IPS_PER_PRIVATE_SUBNET = 2 ** (32 - PRIVATE_SUBNET_MASK) - 5

# CloudFormation resources one Cell stack emits: a fixed part (cluster, capacity-provider
# association, shared roles, log group...) plus a part per unit. stacks/cell.py and stacks/unit.py
# emit exactly this; tests/stacks/test_cell.py checks it against the synthesized templates, so the
# quota check below can run before anything is built.
CELL_FIXED_RESOURCES = 10
UNIT_RESOURCES = 9


@dataclass(frozen=True)
class InstanceShape:
    """What one Trainium instance type offers (AWS instance-type docs)."""

    efa_interfaces: int     # one EFA interface per network card
    neuron_devices: int     # /dev/neuron0..N-1 (one per Trainium chip)
    neuron_cores: int
    vcpus: int
    memory_gib: int


INSTANCE_SHAPES: dict[str, InstanceShape] = {
    "trn1.32xlarge": InstanceShape(efa_interfaces=8, neuron_devices=16, neuron_cores=32,
                                   vcpus=128, memory_gib=512),
    "trn1n.32xlarge": InstanceShape(efa_interfaces=16, neuron_devices=16, neuron_cores=32,
                                    vcpus=128, memory_gib=512),
}

LOG_RETENTION_DAYS = (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827,
                      2192, 2557, 2922, 3288, 3653)
UNIT_ROLLOUTS = ("replace", "surge")
LIVE_TARGET_GROUPS = ("blue", "green")
ENGINES = ("neuron", "reference", "echo")
STRATEGIES = ("pipeline", "tensor")

_AZ_RE = re.compile(r"^[a-z]{2}(-gov)?-[a-z]+-\d[a-z]$")
_REGION_RE = re.compile(r"^[a-z]{2}(-gov)?-[a-z]+-\d$")
_ACCOUNT_RE = re.compile(r"^\d{12}$")
_S3_URI_RE = re.compile(r"^s3://([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(/[^\s]*)?$")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")
_IMAGE_RE = re.compile(r"^[a-z0-9.-]+(:\d+)?/[a-z0-9._/-]+(:[\w.-]{1,128}|@sha256:[0-9a-f]{64})$")
_CERT_RE = re.compile(r"^arn:aws(-[a-z]+)*:acm:[a-z0-9-]+:\d{12}:certificate/[0-9a-f-]{36}$")
_EMAIL_RE = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
_DEPLOYMENT_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9-]{0,23}$")
_REVISION_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


class ConfigError(ValueError):
    """A configuration value the user must fix. str(err) is one line naming key, value, allowed."""

    def __init__(self, key: str, value: Any, allowed: str):
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(f"invalid flotilla config: {key}={value!r}: {allowed}")


def _split_s3_uri(uri: str) -> tuple[str, str]:
    """s3://bucket/some/prefix/ -> ("bucket", "some/prefix/"); the prefix is '' for a bare bucket."""
    bucket, _, prefix = uri[len("s3://"):].partition("/")
    return bucket, prefix


@dataclass(frozen=True)
class ModelConfig:
    """Where the compiled/sharded model artifacts live and the name clients ask for."""

    s3_uri: str = "s3://flotilla-models-example/llama-3.1-8b-instruct/"
    name: str = "llama-3.1-8b-instruct"
    # Where the neuron engine caches NxD Inference's compiled artifacts ('' = the model bucket's
    # neuron-compile-cache/ prefix). Nodes may read and write only there; the model stays read-only.
    compile_cache_uri: str = ""

    @property
    def compile_cache(self) -> str:
        return self.compile_cache_uri or f"s3://{self.bucket}/neuron-compile-cache/"

    @property
    def compile_cache_bucket(self) -> str:
        return _split_s3_uri(self.compile_cache)[0]

    @property
    def compile_cache_prefix(self) -> str:
        return _split_s3_uri(self.compile_cache)[1]

    @property
    def bucket(self) -> str:
        return _split_s3_uri(self.s3_uri)[0]

    @property
    def prefix(self) -> str:
        """Key prefix inside the bucket, no leading slash; '' means the whole bucket."""
        return _split_s3_uri(self.s3_uri)[1]


@dataclass(frozen=True)
class NodeConfig:
    """Settings of the unit members' container (the `node` command)."""

    engine: str = "neuron"
    prefill_strategy: str = "pipeline"
    decode_strategy: str = "tensor"
    # ECS (EC2 launch type) waits at most 120 s between SIGTERM and SIGKILL; the node must finish
    # draining inside that window.
    drain_timeout_s: int = 100
    # ECS ignores failed health checks of a new task this long: loading (and on Neuron, compiling)
    # a sharded model takes minutes, and the container's start period stops at 300 s.
    health_check_grace_s: int = 1800
    root_volume_gib: int = 512
    log_retention_days: int = 30


@dataclass(frozen=True)
class RouterConfig:
    """Settings of the router service (Router stack) and its ALB rules (Front stack)."""

    desired_count: int = 2        # also the autoscaling minimum
    max_count: int = 10           # autoscaling maximum
    cpu: int = 1024
    memory_mib: int = 2048
    bake_time_minutes: int = 10
    # The target group the listener rules send 100 % to in the template. ECS blue/green flips the
    # live group at every router deployment; set this to the live one before a deploy that updates
    # a listener rule (aws/aws-cdk#36649, docs/runbooks/routine-deploy.md).
    live_target_group: str = "blue"


@dataclass(frozen=True)
class UnitPlacement:
    """Where one unit lives: its cell, its index inside the cell and its AZ slot."""

    cell: int
    index: int          # 0..units_per_cell-1 inside the cell
    global_index: int   # 0..units-1 across the fleet
    az_index: int       # index into the VPC's AZs (round-robin over the fleet)

    @property
    def unit_id(self) -> str:
        return f"cell{self.cell}-unit{self.index}"


@dataclass(frozen=True)
class FlotillaConfig:
    """The whole deployment. Built by load_config(); read-only afterwards."""

    deployment_name: str = "flotilla"
    instance_type: str = "trn1.32xlarge"
    nodes_per_unit: int = 2
    units: int = 1
    units_per_cell: int = 20
    # Empty: the VPC takes the first three AZs of the deployment region (environment-agnostic).
    # Trainium is offered in a few AZs only: a real deployment should name them.
    availability_zones: tuple[str, ...] = ()
    account: str | None = None
    region: str | None = None
    model: ModelConfig = field(default_factory=ModelConfig)
    image: str | None = None
    certificate_arn: str | None = None
    alarm_email: str | None = None
    revision: str = "1"
    # surge (default, zero-downtime): the ASG may grow to twice nodes_per_unit so the new revision
    # forms beside the old one, then the old one drains (min healthy 100 %, max 200 %). replace:
    # a unit's tasks are stopped, then started on the same instances (the unit is out of rotation
    # while it re-forms; the router routes around it): for fleets without spare Trainium capacity.
    unit_rollout: str = "surge"
    node: NodeConfig = field(default_factory=NodeConfig)
    router: RouterConfig = field(default_factory=RouterConfig)

    # --- derived layout ---------------------------------------------------------------------
    @property
    def shape(self) -> InstanceShape:
        return INSTANCE_SHAPES[self.instance_type]

    @property
    def az_count(self) -> int:
        return len(self.availability_zones) or 3

    @property
    def cells(self) -> int:
        return math.ceil(self.units / self.units_per_cell)

    @property
    def chips(self) -> int:
        return self.units * self.nodes_per_unit * self.shape.neuron_devices

    @property
    def max_nodes_per_unit(self) -> int:
        """ASG maximum: room for a second revision of the unit when rolling out with surge."""
        return self.nodes_per_unit * (2 if self.unit_rollout == "surge" else 1)

    def units_in_cell(self, cell: int) -> list[UnitPlacement]:
        first = cell * self.units_per_cell
        last = min(self.units, first + self.units_per_cell)
        return [UnitPlacement(cell=cell, index=g - first, global_index=g, az_index=g % self.az_count)
                for g in range(first, last)]


def estimate_cell_resources(units_in_cell: int) -> int:
    return CELL_FIXED_RESOURCES + UNIT_RESOURCES * units_in_cell


# --- parsing -----------------------------------------------------------------------------------
def _int(key: str, value: Any, lo: int, hi: int, why: str = "") -> int:
    allowed = f"an integer from {lo} to {hi}" + (f" ({why})" if why else "")
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ConfigError(key, value, allowed)
    return value


def _choice(key: str, value: Any, choices: tuple) -> Any:
    if value not in choices:
        raise ConfigError(key, value, "one of " + ", ".join(map(str, choices)))
    return value


def _match(key: str, value: Any, pattern: re.Pattern, allowed: str, optional: bool = False):
    if value is None and optional:
        return None
    if not isinstance(value, str) or not pattern.match(value):
        raise ConfigError(key, value, allowed + (" (or omit it)" if optional else ""))
    return value


def _section(key: str, value: Any, known: tuple[str, ...]) -> dict:
    if not isinstance(value, Mapping):
        raise ConfigError(key, value, "a mapping with keys " + ", ".join(known))
    for k in value:
        if k not in known:
            raise ConfigError(f"{key}.{k}" if key else str(k), value[k],
                              "unknown key; allowed keys: " + ", ".join(known))
    return dict(value)


def _keys(cls) -> tuple[str, ...]:
    return tuple(cls.__dataclass_fields__)


def parse_config(raw: Mapping[str, Any]) -> FlotillaConfig:
    """Validate a plain mapping (merged context + YAML) into a FlotillaConfig, or raise ConfigError."""
    top = _section("", raw, _keys(FlotillaConfig))
    d = FlotillaConfig()
    get = lambda k: top.get(k, getattr(d, k))  # noqa: E731

    model_raw = _section("model", top.get("model", {}), _keys(ModelConfig))
    dm = ModelConfig()
    model = ModelConfig(
        s3_uri=_match("model.s3_uri", model_raw.get("s3_uri", dm.s3_uri), _S3_URI_RE,
                      "an S3 URI like s3://bucket/prefix/"),
        name=_match("model.name", model_raw.get("name", dm.name), _NAME_RE,
                    "1-128 characters: letters, digits, . _ : / -"),
        compile_cache_uri=(_match("model.compile_cache_uri", model_raw["compile_cache_uri"],
                                  _S3_URI_RE, "an S3 URI like s3://bucket/prefix/")
                           if model_raw.get("compile_cache_uri") else ""),
    )
    node_raw = _section("node", top.get("node", {}), _keys(NodeConfig))
    dn = NodeConfig()
    nget = lambda k: node_raw.get(k, getattr(dn, k))  # noqa: E731
    node = NodeConfig(
        engine=_choice("node.engine", nget("engine"), ENGINES),
        prefill_strategy=_choice("node.prefill_strategy", nget("prefill_strategy"), STRATEGIES),
        decode_strategy=_choice("node.decode_strategy", nget("decode_strategy"), STRATEGIES),
        drain_timeout_s=_int("node.drain_timeout_s", nget("drain_timeout_s"), 1, 115,
                             "ECS sends SIGKILL 120 s after SIGTERM"),
        root_volume_gib=_int("node.root_volume_gib", nget("root_volume_gib"), 64, 16384),
        health_check_grace_s=_int("node.health_check_grace_s", nget("health_check_grace_s"), 0,
                                  86400, "time a unit may take to load its model"),
        log_retention_days=_choice("node.log_retention_days", nget("log_retention_days"),
                                   LOG_RETENTION_DAYS),
    )
    router_raw = _section("router", top.get("router", {}), _keys(RouterConfig))
    dr = RouterConfig()
    rget = lambda k: router_raw.get(k, getattr(dr, k))  # noqa: E731
    router = RouterConfig(
        desired_count=_int("router.desired_count", rget("desired_count"), 1, 100),
        cpu=_choice("router.cpu", rget("cpu"), (256, 512, 1024, 2048, 4096)),
        memory_mib=_int("router.memory_mib", rget("memory_mib"), 512, 30720),
        bake_time_minutes=_int("router.bake_time_minutes", rget("bake_time_minutes"), 0, 1440),
        max_count=_int("router.max_count", rget("max_count"), 1, 1000),
        live_target_group=_choice("router.live_target_group", rget("live_target_group"),
                                  LIVE_TARGET_GROUPS),
    )
    if router.max_count < router.desired_count:
        raise ConfigError("router.max_count", router.max_count,
                          f"at least router.desired_count ({router.desired_count})")

    azs = get("availability_zones")
    if isinstance(azs, str) or not isinstance(azs, (list, tuple)) or not (
            len(azs) == 0 or 2 <= len(azs) <= 6):
        raise ConfigError("availability_zones", azs,
                          "a list of 2 to 6 AZ names like [us-east-1a, us-east-1b], or [] for the "
                          "region's first three")
    for az in azs:
        _match("availability_zones", az, _AZ_RE, "AZ names like us-east-1a")
    if len(set(azs)) != len(azs):
        raise ConfigError("availability_zones", list(azs), "each AZ at most once")
    if len({az[:-1] for az in azs}) > 1:
        raise ConfigError("availability_zones", list(azs), "AZs of one region")

    region = _match("region", get("region"), _REGION_RE, "a region like us-east-1", optional=True)
    if region and azs and azs[0][:-1] != region:
        raise ConfigError("availability_zones", list(azs), f"AZs of region {region}")

    cfg = FlotillaConfig(
        deployment_name=_match("deployment_name", get("deployment_name"), _DEPLOYMENT_NAME_RE,
                               "1-24 characters: a letter, then letters, digits or -"),
        instance_type=_choice("instance_type", get("instance_type"), tuple(INSTANCE_SHAPES)),
        # 64 nodes = 1,024 Trainium chips per replica; the node runtime accepts at most 64 too.
        nodes_per_unit=_int("nodes_per_unit", get("nodes_per_unit"), 1, 64),
        units=_int("units", get("units"), 1, 10000),
        units_per_cell=_int("units_per_cell", get("units_per_cell"), 1,
                            MAX_CAPACITY_PROVIDERS_PER_CLUSTER,
                            "ECS allows 20 capacity providers per cluster, one per unit"),
        availability_zones=tuple(azs),
        account=_match("account", get("account"), _ACCOUNT_RE, "a 12-digit account id",
                       optional=True),
        region=region,
        model=model,
        image=_match("image", get("image"), _IMAGE_RE,
                     "an image URI with a tag or digest, like 123456789012.dkr.ecr.us-east-1."
                     "amazonaws.com/flotilla:1.0", optional=True),
        certificate_arn=_match("certificate_arn", get("certificate_arn"), _CERT_RE,
                               "an ACM certificate ARN", optional=True),
        alarm_email=_match("alarm_email", get("alarm_email"), _EMAIL_RE, "an e-mail address",
                           optional=True),
        revision=_match("revision", str(get("revision")), _REVISION_RE,
                        "1-64 characters: letters, digits, . _ -"),
        unit_rollout=_choice("unit_rollout", get("unit_rollout"), UNIT_ROLLOUTS),
        node=node,
        router=router,
    )
    check_quotas(cfg)
    return cfg


def check_quotas(cfg: FlotillaConfig) -> None:
    """Refuse a layout that would break an AWS limit at deploy time (architecture §3)."""
    biggest_cell = min(cfg.units, cfg.units_per_cell)
    instances = biggest_cell * cfg.max_nodes_per_unit
    if instances > MAX_CONTAINER_INSTANCES_PER_CLUSTER:
        raise ConfigError(
            "units_per_cell", cfg.units_per_cell,
            f"at most {MAX_CONTAINER_INSTANCES_PER_CLUSTER // cfg.max_nodes_per_unit} with "
            f"{cfg.max_nodes_per_unit} instances per unit (ECS allows "
            f"{MAX_CONTAINER_INSTANCES_PER_CLUSTER} container instances per cluster)")
    per_stack = estimate_cell_resources(biggest_cell)
    if per_stack > MAX_RESOURCES_PER_STACK:
        raise ConfigError(
            "units_per_cell", cfg.units_per_cell,
            f"at most {(MAX_RESOURCES_PER_STACK - CELL_FIXED_RESOURCES) // UNIT_RESOURCES} "
            f"(a cell stack would hold {per_stack} resources; CloudFormation allows "
            f"{MAX_RESOURCES_PER_STACK})")
    # Every EFA interface takes an address of the unit's private subnet.
    units_in_busiest_az = math.ceil(cfg.units / cfg.az_count)
    ips = units_in_busiest_az * cfg.max_nodes_per_unit * cfg.shape.efa_interfaces
    if ips > USABLE_IPS_PER_PRIVATE_SUBNET:
        per_az = USABLE_IPS_PER_PRIVATE_SUBNET // (cfg.max_nodes_per_unit * cfg.shape.efa_interfaces)
        raise ConfigError(
            "units", cfg.units,
            f"at most {per_az * cfg.az_count} over {cfg.az_count} AZs ({ips} EFA addresses would "
            f"be needed in one /{PRIVATE_SUBNET_MASK} private subnet; add AZs or reduce units)")


def _deep_merge(base: dict, over: Mapping) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, Mapping) and isinstance(
            out.get(k), Mapping) else v
    return out


def load_config(context: Mapping[str, Any] | None, config_path: str | None) -> FlotillaConfig:
    """The cdk.json `flotilla` context, overridden by the YAML file at config_path (if any)."""
    raw: dict = {}
    if context is not None:
        raw = dict(_section("", context, _keys(FlotillaConfig)))
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
        raw = _deep_merge(raw, overrides)
    return parse_config(raw)
