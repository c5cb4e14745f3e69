"""The deployment config's sections for the nodes, the routers, capacity and the front door: their keys,
the values each allows and what each means (docs/configuration.md is generated from them). The whole
deployment (stacks/config.py) holds one of each. Must not import aws_cdk (config-only tests import it).
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import model_validator

import contract
from contract import NEURON_PREFIX_CACHING_BLOCKS, NEURON_SAMPLING_MODES, ROUTER_BALANCE_POLICIES, apikeys
from contract.declare import Bool, Integer, Items, Matches, OneOf
from contract.layout import DEFAULT_BATCH_SIZE, DEFAULT_SEQ_LEN
from stacks.config_rules import ConfigError, Section
from stacks.front_door import BODY_RULE_NAMES, DNS_NAME_RE

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
# LaunchTemplateInstanceMarketOptionsRequest.MarketType values flotilla uses: on-demand capacity
# (optionally from a Capacity Reservation) or an EC2 Capacity Block for ML.
MARKETS = ("on-demand", "capacity-block")
LIVE_TARGET_GROUPS = ("blue", "green")
ENGINES = contract.ENGINES
STRATEGIES = contract.STRATEGY_CHOICES  # auto: the reference engine times both at formation
ROUTER_CPUS = (256, 512, 1024, 2048, 4096)

AZ_RE = re.compile(r"^[a-z]{2}(-gov)?-[a-z]+-\d[a-z]$")
_CAPACITY_RESERVATION_RE = re.compile(r"^cr-[0-9a-f]{8,17}$")
_PLACEMENT_GROUP_RE = re.compile(r"^[A-Za-z0-9_.-]{1,255}$")
_RESOURCE_GROUP_ARN_RE = re.compile(
    r"^arn:aws(-[a-z]+)*:resource-groups:[a-z0-9-]+:\d{12}:group/[A-Za-z0-9_.-]{1,300}$"
)


class NodeConfig(Section):
    """Settings of the unit members' container (the `node` command)."""

    engine: Annotated[str, OneOf(*ENGINES)] = "neuron"
    """The engine inside the node container. `neuron`: vLLM + NxD Inference (one node) or NxD Inference
    under flotilla's leader/follower loop (several), not yet run on Trainium; `reference` (PyTorch on CPU)
    and `echo` (no model: a plumbing smoke test) run in the image of `runtime/Dockerfile`."""
    prefill_strategy: Annotated[str, OneOf(*STRATEGIES)] = "auto"
    """The reference engine's parallel strategy for prefill; `auto`: the unit times every pair when it
    forms and keeps the fastest ([engine.md](engine.md#choosing-the-strategies))."""
    decode_strategy: Annotated[str, OneOf(*STRATEGIES)] = "auto"
    """The reference engine's parallel strategy for decode, as `prefill_strategy`."""
    drain_timeout_s: Annotated[int, Integer(1, 115, "ECS sends SIGKILL 120 s after SIGTERM")] = 100
    """Seconds a member drains after SIGTERM (in-flight requests finish, no new ones): ECS (EC2 launch
    type) waits at most 120 s between SIGTERM and SIGKILL, so the drain must end inside that window."""
    health_check_grace_s: Annotated[int, Integer(0, 86400, "time a unit may take to load its model")] = 1800
    """Seconds ECS ignores a new unit task's failed health checks: loading (and on Neuron, compiling) a
    sharded model takes minutes, and the container's start period stops at 300 s."""
    root_volume_gib: Annotated[int, Integer(64, 16384)] = 128
    """The encrypted gp3 root volume per node: the OS and the container images (raise it with
    `node.instance_store: false`, which puts the model there too)."""
    instance_store: Annotated[bool, Bool()] = True
    """The model and the compile cache on the node's NVMe instance store (RAID0 at boot, mounted into the
    task at `/var/cache/flotilla`) instead of the root volume
    ([cold start](infrastructure.md#cold-start-where-the-model-lands))."""
    log_retention_days: Annotated[int, OneOf(*LOG_RETENTION_DAYS)] = 30
    """Days CloudWatch Logs keeps the container and VPC flow logs."""
    neuron_sampling: Annotated[str, OneOf(*NEURON_SAMPLING_MODES)] = "cpu"
    """`neuron` engine, one node: where tokens are sampled. `cpu`: vLLM's sampler on the host, each request
    with its own parameters, also logprobs, structured output and penalties; `device`: on the NeuronCores,
    faster, but the pinned plugin can sample a request with another live request's parameters
    ([runbook](runbooks/neuron-sampling.md))."""
    neuron_prefix_caching_block: Annotated[int, OneOf(*NEURON_PREFIX_CACHING_BLOCKS)] = 0
    """`neuron` engine, one node, opt-in: a block size in tokens runs vLLM with prefix caching (and reports
    `cached_tokens`); 0 runs without it. Off by default: no trn1 run has checked its outputs and memory
    ([hardware.md](hardware.md#prefix-caching-on-trainium))."""
    neuron_seq_len: Annotated[int, Integer(1, 1_048_576)] = DEFAULT_SEQ_LEN
    """`neuron` engine: prompt + output tokens of a sequence (vLLM `--max-model-len`, the API's context
    length). Synth checks the units' memory at this length."""
    neuron_batch_size: Annotated[int, Integer(1, 4096)] = DEFAULT_BATCH_SIZE
    """`neuron` engine: sequences decoded together (vLLM `--max-num-seqs`). Synth checks the units'
    memory at this batch."""


class RouterConfig(Section):
    """Settings of the router service (Router stack) and its ALB rules (Front stack)."""

    desired_count: Annotated[int, Integer(1, 100)] = 2
    """Routers the service starts with and autoscaling's minimum (not a count the template states: a deploy
    keeps the size autoscaling reached). Each router enforces 1/`desired_count` of every key's limit."""
    max_count: Annotated[int, Integer(1, 1000)] = 10
    """Autoscaling's maximum, at least `desired_count` (it scales on requests per healthy target)."""
    cpu: Annotated[int, OneOf(*ROUTER_CPUS)] = 1024
    """CPU units of a router task (Fargate; 1024 is one vCPU)."""
    memory_mib: Annotated[int, Integer(512, 30720)] = 2048
    """Memory of a router task, MiB (Fargate pairs it with `cpu`)."""
    bake_time_minutes: Annotated[int, Integer(0, 1440)] = 10
    """Minutes a router deployment's new tasks take all traffic while the deployment alarms watch, before
    the old ones stop (ECS blue/green)."""
    live_target_group: Annotated[str, OneOf(*LIVE_TARGET_GROUPS)] = "blue"
    """The target group the listener rules send 100 % to in the template. ECS blue/green flips the live
    group at every router deployment: set this to the live one before a deploy that updates a listener
    rule (aws/aws-cdk#36649, [routine deploy](runbooks/routine-deploy.md))."""
    balance: Annotated[str, OneOf(*ROUTER_BALANCE_POLICIES)] = ROUTER_BALANCE_POLICIES[0]
    """How each router picks a unit ([routing.md](routing.md)): by the request's conversation and the
    units' work, by work alone, or by requests alone; `least_work` is the lever for a hot unit
    ([runbook](runbooks/hot-unit.md))."""

    @model_validator(mode="after")
    def _max_covers_desired(self) -> RouterConfig:
        if self.max_count < self.desired_count:
            raise ConfigError(
                "router.max_count", self.max_count, f"at least router.desired_count ({self.desired_count})"
            )
        return self


class CapacityConfig(Section):
    """Where the units' instances come from: On-Demand capacity (optionally a Capacity
    Reservation or a group of them) or an EC2 Capacity Block, and in which AZs."""

    availability_zones: Annotated[
        tuple[Annotated[str, Matches(AZ_RE, "AZ names like us-east-1a")], ...],
        Items("a list of up to 6 AZ names from availability_zones, or [] for all of them", lambda n: n <= 6),
    ] = ()
    """Up to 6 AZs of `availability_zones` (which must then be set) units go to, round-robin, while the VPC
    and ALB span all of them; `[]`: every AZ of the VPC. Changing it on a running fleet moves units away
    from their placement groups: `flotilla check-update` refuses that before the deploy
    ([runbook](runbooks/capacity-shortage.md#move-units-to-other-azs))."""
    reservation_id: Annotated[
        str | None,
        Matches(_CAPACITY_RESERVATION_RE, "a Capacity Reservation id like cr-0123456789abcdef0", optional=True),
    ] = None
    """Launch every unit into this On-Demand Capacity Reservation or Capacity Block (targeted); needs exactly
    one AZ in `capacity.availability_zones`, the reservation's."""
    reservation_group_arn: Annotated[
        str | None,
        Matches(
            _RESOURCE_GROUP_ARN_RE,
            "a Capacity Reservation resource group ARN like arn:aws:resource-groups:us-east-1:123456789012:group/trn1",
            optional=True,
        ),
    ] = None
    """Launch into any reservation of this resource group, falling back to On-Demand when none has room;
    not with `reservation_id`."""
    market: Annotated[str, OneOf(*MARKETS)] = "on-demand"
    """`capacity-block`: an EC2 Capacity Block for ML (launch template market type `capacity-block`); needs
    `reservation_id` and a type EC2 sells as Capacity Blocks (trn1.32xlarge)."""
    placement_group: Annotated[
        str | None,
        Matches(_PLACEMENT_GROUP_RE, "a placement group name (1-255 letters, digits, - _ .) or none", optional=True),
    ] = None
    """The cluster placement group every unit launches into, instead of one new group per unit (unset). With
    a reservation it is required: the group the reservation was created in (EC2 launches into a
    reservation in a cluster placement group only from that group), or `none`. With a Capacity Block:
    unset or `none` (its instances are already placed together; EC2 refuses a placement group with one)."""


# --- Front door: who may reach the ALB and how the routers check callers --------------------------
SCHEMES = ("internal", "internet-facing")
_CIDR_RE = re.compile(r"^((25[0-5]|2[0-4]\d|1?\d?\d)\.){3}(25[0-5]|2[0-4]\d|1?\d?\d)/(3[0-2]|[12]?\d)$")
_PREFIX_LIST_RE = re.compile(r"^pl-[0-9a-f]{8,17}$")
_PRINCIPAL_RE = re.compile(r"^arn:aws(-[a-z]+)*:iam::\d{12}:(root|role/[\w+=,.@/-]+|user/[\w+=,.@/-]+)$")
# AWS WAF rate-based rule: Limit from 10 to 2,000,000,000 requests per evaluation window
# (RateBasedStatement, AWS WAF API reference).
WAF_RATE_LIMIT_RANGE = (10, 2_000_000_000)


class FrontConfig(Section):
    """The front door: internal (the default, reachable from the VPC and client_cidrs) or
    internet-facing (only client_cidrs / client_prefix_lists, behind AWS WAF); API keys."""

    scheme: Annotated[str, OneOf(*SCHEMES)] = "internal"
    """`internal`: the ALB has private addresses only, reachable from the VPC (and `client_cidrs` routed
    into it: peering, Transit Gateway, VPN); `internet-facing`: public addresses, only for `client_cidrs` /
    `client_prefix_lists` (one of them required), behind AWS WAF. Switching replaces the ALB
    ([runbook](runbooks/front-door.md))."""
    client_cidrs: Annotated[
        tuple[Annotated[str, Matches(_CIDR_RE, "IPv4 CIDRs like 203.0.113.0/24")], ...],
        Items("a list of IPv4 CIDRs like [203.0.113.0/24]"),
    ] = ()
    """Client ranges admitted on 443/80 besides the VPC (peered VPCs, on-premises, partners); an
    internet-facing ALB admits only these and the prefix lists, and no 0.0.0.0/0 unless listed."""
    client_prefix_lists: Annotated[
        tuple[Annotated[str, Matches(_PREFIX_LIST_RE, "managed prefix list ids like pl-0123456789abcdef0")], ...],
        Items("a list of managed prefix list ids like [pl-0123456789abcdef0]"),
    ] = ()
    """Managed prefix lists admitted on 443/80, like `client_cidrs`."""
    privatelink_principals: Annotated[
        tuple[Annotated[str, Matches(_PRINCIPAL_RE, "IAM principal ARNs like arn:aws:iam::123456789012:root")], ...],
        Items("a list of IAM principal ARNs like [arn:aws:iam::123456789012:root]"),
    ] = ()
    """Internal only: an endpoint service (PrivateLink, an internal NLB forwarding to the ALB) these IAM
    principals may create endpoints to, each connection accepted by you
    ([runbook](runbooks/front-door.md#privatelink-consumers-in-other-vpcs-or-accounts))."""
    privatelink_private_dns_name: Annotated[
        str | None, Matches(DNS_NAME_RE, "a DNS name like api.example.com", optional=True)
    ] = None
    """The name HTTPS consumers of the endpoint service call, matching the certificate, once its domain is
    verified ([runbook](runbooks/front-door.md))."""
    waf_requests_per_5_min: Annotated[int, Integer(*WAF_RATE_LIMIT_RANGE, "AWS WAF rate-based rule limit")] = 3000
    """Internet-facing only: AWS WAF blocks a client IP above this many requests in 5 minutes."""
    waf_blocked_body_rules: Annotated[
        tuple[Annotated[str, OneOf(*BODY_RULE_NAMES)], ...], Items("a list of WAF body rule names")
    ] = ()
    """Internet-facing only: managed-group body rules WAF blocks on instead of counting (long prompts are
    legitimate, so they count by default; [runbook](runbooks/waf-body-rules.md))."""
    api_keys: Annotated[bool, Bool()] = True
    """Routers require `Authorization: Bearer <key>`, checked against the hashed keys of `flotilla keys`
    (Secrets Manager `flotilla/<deployment>/api-keys`); `false` only for a fleet nobody else can reach."""
    api_keys_ttl_s: Annotated[int, Integer(1, 3600, "a revoked key works at most this long")] = apikeys.API_KEYS_TTL_S
    """Seconds between the routers' reads of the keys: a revoked key stops working within it."""
