"""flotilla's one typed deployment configuration, validated before any stack is built.

Sources, later wins: built-in defaults < cdk.json context key `flotilla` < `-c config=file.yaml`.
The sections are pydantic models; a rejected value raises ConfigError whose message is one line:
the key, the bad value, what is allowed. This module must not import aws_cdk: it is also the fast
path for config-only tests.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)
from pydantic_core import PydanticCustomError, core_schema

from contract.trainium import INSTANCES, TrainiumInstance

# --- Limits that shape the layout (AWS service quotas) -------------------------------------------
MAX_CAPACITY_PROVIDERS_PER_CLUSTER = 20  # ECS, not adjustable: one capacity provider per unit
MAX_CONTAINER_INSTANCES_PER_CLUSTER = 5000  # ECS
MAX_RESOURCES_PER_STACK = 500  # CloudFormation
# Private subnets are /18 (see stacks/network.py): 16,384 addresses minus the 5 AWS reserves.
PRIVATE_SUBNET_MASK = 18
USABLE_IPS_PER_PRIVATE_SUBNET = 2 ** (32 - PRIVATE_SUBNET_MASK) - 5

# CloudFormation resources one Cell stack emits: a fixed part (cluster, capacity-provider
# association, shared roles, log group...) plus a part per unit. stacks/cell.py and stacks/unit.py
# emit exactly this; tests/stacks/test_cell_stack.py checks it against the synthesized templates,
# so the quota check below can run before anything is built.
CELL_FIXED_RESOURCES = 10
UNIT_RESOURCES = 9

LOG_RETENTION_DAYS = (
    1,
    3,
    5,
    7,
    14,
    30,
    60,
    90,
    120,
    150,
    180,
    365,
    400,
    545,
    731,
    1096,
    1827,
    2192,
    2557,
    2922,
    3288,
    3653,
)
UNIT_ROLLOUTS = ("replace", "surge")
LIVE_TARGET_GROUPS = ("blue", "green")
ENGINES = ("neuron", "reference", "echo")
STRATEGIES = ("auto", "pipeline", "tensor")  # auto: the reference engine times both at formation
ROUTER_CPUS = (256, 512, 1024, 2048, 4096)

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
_S3_URI_ALLOWED = "an S3 URI like s3://bucket/prefix/"


class ConfigError(ValueError):
    """A configuration value the user must fix. str(err) is one line naming key, value, allowed."""

    def __init__(self, key: str, value: Any, allowed: str):
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(f"invalid flotilla config: {key}={value!r}: {allowed}")


# --- Field rules: pydantic does the checking, the rule words the refusal ------------------------
_REFUSED = "flotilla_refused"  # error type whose context carries the `allowed` text


def _refuse(allowed: str) -> PydanticCustomError:
    return PydanticCustomError(_REFUSED, "{allowed}", {"allowed": allowed})


class Rule:
    """Annotated metadata: validate with a pydantic-core schema; on any failure report `allowed`.

    It supplies the field's whole schema, so it comes first in Annotated[...]; a BeforeValidator
    after it runs before it.
    """

    def __init__(self, schema: core_schema.CoreSchema, allowed: str):
        self.schema, self.allowed = schema, allowed

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> core_schema.CoreSchema:
        def check(value: Any, validate: Callable[[Any], Any]) -> Any:
            try:
                return validate(value)
            except ValidationError:
                raise _refuse(self.allowed) from None

        return core_schema.no_info_wrap_validator_function(check, self.schema)


def between(lo: int, hi: int, why: str = "") -> Rule:
    """An int (not a bool, not a numeric string) from lo to hi."""
    return Rule(
        core_schema.int_schema(ge=lo, le=hi, strict=True),
        f"an integer from {lo} to {hi}" + (f" ({why})" if why else ""),
    )


def one_of(choices: tuple[Any, ...]) -> Rule:
    schema: core_schema.CoreSchema = core_schema.literal_schema(list(choices))
    if all(isinstance(c, int) for c in choices):
        # A literal 1 also takes True (True == 1): demand a real int first.
        schema = core_schema.chain_schema([core_schema.int_schema(strict=True), schema])
    return Rule(schema, "one of " + ", ".join(map(str, choices)))


def matches(pattern: re.Pattern[str], allowed: str, *, optional: bool = False) -> Rule:
    """A string matching pattern; with optional, None (the key left out) too."""
    # pydantic-core matches with Rust's regex crate (ConfigDict.regex_engine defaults to
    # 'rust-regex', docs.pydantic.dev/latest/api/config/): the patterns above mean the same there,
    # except that `$` is the end of the text only, where Python's also allows a final newline.
    schema: core_schema.CoreSchema = core_schema.str_schema(pattern=pattern.pattern, strict=True)
    if optional:
        return Rule(core_schema.nullable_schema(schema), allowed + " (or omit it)")
    return Rule(schema, allowed)


def _az_list(value: Any) -> Any:
    if isinstance(value, (list, tuple)) and (len(value) == 0 or 2 <= len(value) <= 6):
        return value
    raise _refuse("a list of 2 to 6 AZ names like [us-east-1a, us-east-1b], or [] for the region's first three")


def _split_s3_uri(uri: str) -> tuple[str, str]:
    """s3://bucket/some/prefix/ -> ("bucket", "some/prefix/"); the prefix is '' for a bare bucket."""
    bucket, _, prefix = uri[len("s3://") :].partition("/")
    return bucket, prefix


class _Section(BaseModel):
    # Unknown keys are typos: refuse them rather than ignore a setting the operator meant.
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelConfig(_Section):
    """Where the compiled/sharded model artifacts live and the name clients ask for."""

    s3_uri: Annotated[str, matches(_S3_URI_RE, _S3_URI_ALLOWED)] = "s3://flotilla-models-example/llama-3.1-8b-instruct/"
    name: Annotated[str, matches(_NAME_RE, "1-128 characters: letters, digits, . _ : / -")] = "llama-3.1-8b-instruct"
    # Where the neuron engine caches NxD Inference's compiled artifacts ('' = the model bucket's
    # neuron-compile-cache/ prefix). Nodes may read and write only there; the model stays read-only.
    compile_cache_uri: Annotated[
        str,
        Rule(core_schema.str_schema(pattern=f"^$|{_S3_URI_RE.pattern}", strict=True), _S3_URI_ALLOWED),
        BeforeValidator(lambda v: v or ""),
    ] = ""

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


class NodeConfig(_Section):
    """Settings of the unit members' container (the `node` command)."""

    engine: Annotated[str, one_of(ENGINES)] = "neuron"
    prefill_strategy: Annotated[str, one_of(STRATEGIES)] = "auto"
    decode_strategy: Annotated[str, one_of(STRATEGIES)] = "auto"
    # ECS (EC2 launch type) waits at most 120 s between SIGTERM and SIGKILL; the node must finish
    # draining inside that window.
    drain_timeout_s: Annotated[int, between(1, 115, "ECS sends SIGKILL 120 s after SIGTERM")] = 100
    # ECS ignores failed health checks of a new task this long: loading (and on Neuron, compiling)
    # a sharded model takes minutes, and the container's start period stops at 300 s.
    health_check_grace_s: Annotated[int, between(0, 86400, "time a unit may take to load its model")] = 1800
    root_volume_gib: Annotated[int, between(64, 16384)] = 512
    log_retention_days: Annotated[int, one_of(LOG_RETENTION_DAYS)] = 30


class RouterConfig(_Section):
    """Settings of the router service (Router stack) and its ALB rules (Front stack)."""

    desired_count: Annotated[int, between(1, 100)] = 2  # also the autoscaling minimum
    max_count: Annotated[int, between(1, 1000)] = 10  # autoscaling maximum
    cpu: Annotated[int, one_of(ROUTER_CPUS)] = 1024
    memory_mib: Annotated[int, between(512, 30720)] = 2048
    bake_time_minutes: Annotated[int, between(0, 1440)] = 10
    # The target group the listener rules send 100 % to in the template. ECS blue/green flips the
    # live group at every router deployment; set this to the live one before a deploy that updates
    # a listener rule (aws/aws-cdk#36649, docs/runbooks/routine-deploy.md).
    live_target_group: Annotated[str, one_of(LIVE_TARGET_GROUPS)] = "blue"

    @model_validator(mode="after")
    def _max_covers_desired(self) -> RouterConfig:
        if self.max_count < self.desired_count:
            raise ConfigError(
                "router.max_count", self.max_count, f"at least router.desired_count ({self.desired_count})"
            )
        return self


@dataclass(frozen=True)
class UnitPlacement:
    """Where one unit lives: its cell, its index inside the cell and its AZ slot."""

    cell: int
    index: int  # 0..units_per_cell-1 inside the cell
    global_index: int  # 0..units-1 across the fleet
    az_index: int  # index into the VPC's AZs (round-robin over the fleet)

    @property
    def unit_id(self) -> str:
        return f"cell{self.cell}-unit{self.index}"


class FlotillaConfig(_Section):
    """The whole deployment. Built by load_config(); read-only afterwards."""

    deployment_name: Annotated[
        str, matches(_DEPLOYMENT_NAME_RE, "1-24 characters: a letter, then letters, digits or -")
    ] = "flotilla"
    instance_type: Annotated[str, one_of(tuple(INSTANCES))] = "trn1.32xlarge"
    # 64 nodes = 1,024 Trainium chips per replica; the node runtime accepts at most 64 too.
    nodes_per_unit: Annotated[int, between(1, 64)] = 2
    units: Annotated[int, between(1, 10000)] = 1
    units_per_cell: Annotated[
        int,
        between(1, MAX_CAPACITY_PROVIDERS_PER_CLUSTER, "ECS allows 20 capacity providers per cluster, one per unit"),
    ] = 20
    # Empty: the VPC takes the first three AZs of the deployment region (environment-agnostic).
    # Trainium is offered in a few AZs only: a real deployment should name them.
    availability_zones: Annotated[
        tuple[Annotated[str, matches(_AZ_RE, "AZ names like us-east-1a")], ...], BeforeValidator(_az_list)
    ] = ()
    account: Annotated[str | None, matches(_ACCOUNT_RE, "a 12-digit account id", optional=True)] = None
    region: Annotated[str | None, matches(_REGION_RE, "a region like us-east-1", optional=True)] = None
    model: ModelConfig = Field(default_factory=ModelConfig)
    image: Annotated[
        str | None,
        matches(
            _IMAGE_RE,
            "an image URI with a tag or digest, like 123456789012.dkr.ecr.us-east-1.amazonaws.com/flotilla:1.0",
            optional=True,
        ),
    ] = None
    certificate_arn: Annotated[str | None, matches(_CERT_RE, "an ACM certificate ARN", optional=True)] = None
    alarm_email: Annotated[str | None, matches(_EMAIL_RE, "an e-mail address", optional=True)] = None
    # YAML reads `revision: 2` as a number; the revision is a label, so take its text.
    revision: Annotated[str, matches(_REVISION_RE, "1-64 characters: letters, digits, . _ -"), BeforeValidator(str)] = (
        "1"
    )
    # surge (default, zero-downtime): the ASG may grow to twice nodes_per_unit so the new revision
    # forms beside the old one, then the old one drains (min healthy 100 %, max 200 %). replace:
    # a unit's tasks are stopped, then started on the same instances (the unit is out of rotation
    # while it re-forms; the router routes around it): for fleets without spare Trainium capacity.
    unit_rollout: Annotated[str, one_of(UNIT_ROLLOUTS)] = "surge"
    node: NodeConfig = Field(default_factory=NodeConfig)
    router: RouterConfig = Field(default_factory=RouterConfig)

    @model_validator(mode="after")
    def _fits_aws(self) -> FlotillaConfig:
        azs = list(self.availability_zones)
        if len(set(azs)) != len(azs):
            raise ConfigError("availability_zones", azs, "each AZ at most once")
        if len({az[:-1] for az in azs}) > 1:
            raise ConfigError("availability_zones", azs, "AZs of one region")
        if self.region and azs and azs[0][:-1] != self.region:
            raise ConfigError("availability_zones", azs, f"AZs of region {self.region}")
        check_quotas(self)
        return self

    # --- derived layout ---------------------------------------------------------------------
    @property
    def shape(self) -> TrainiumInstance:
        return INSTANCES[self.instance_type]

    @property
    def az_count(self) -> int:
        return len(self.availability_zones) or 3

    @property
    def cells(self) -> int:
        return math.ceil(self.units / self.units_per_cell)

    @property
    def chips(self) -> int:
        return self.units * self.nodes_per_unit * self.shape.chips

    @property
    def max_nodes_per_unit(self) -> int:
        """ASG maximum: room for a second revision of the unit when rolling out with surge."""
        return self.nodes_per_unit * (2 if self.unit_rollout == "surge" else 1)

    def units_in_cell(self, cell: int) -> list[UnitPlacement]:
        first = cell * self.units_per_cell
        last = min(self.units, first + self.units_per_cell)
        return [
            UnitPlacement(cell=cell, index=g - first, global_index=g, az_index=g % self.az_count)
            for g in range(first, last)
        ]


def estimate_cell_resources(units_in_cell: int) -> int:
    return CELL_FIXED_RESOURCES + UNIT_RESOURCES * units_in_cell


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
    units_in_busiest_az = math.ceil(cfg.units / cfg.az_count)
    ips = units_in_busiest_az * cfg.max_nodes_per_unit * cfg.shape.efa_interfaces
    if ips > USABLE_IPS_PER_PRIVATE_SUBNET:
        per_az = USABLE_IPS_PER_PRIVATE_SUBNET // (cfg.max_nodes_per_unit * cfg.shape.efa_interfaces)
        raise ConfigError(
            "units",
            cfg.units,
            f"at most {per_az * cfg.az_count} over {cfg.az_count} AZs ({ips} EFA addresses would "
            f"be needed in one /{PRIVATE_SUBNET_MASK} private subnet; add AZs or reduce units)",
        )


# --- parsing -----------------------------------------------------------------------------------
def _section_at(path: tuple[str, ...]) -> type[BaseModel]:
    section: type[BaseModel] = FlotillaConfig
    for key in path:
        section = section.model_fields[key].annotation  # type: ignore[assignment]
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
    if err["type"] == _REFUSED:
        allowed = ctx["allowed"]
    elif err["type"] == "extra_forbidden":
        allowed = "unknown key; allowed keys: " + ", ".join(_section_at(path[:-1]).model_fields)
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
        raw = _deep_merge(raw, overrides)
    return parse_config(raw)
