"""The few names both sides of flotilla agree on: ports, health paths, environment variables.

Imported by the CDK app (stacks/) and by the container runtime (runtime/). It must stay free of
aws-cdk-lib and of torch so that either side can import it without pulling in the other.
"""

from __future__ import annotations

from enum import StrEnum

# Declared beside the Retry-After rounding both sides run; named here with every other shared name.
from contract.busy import BUSY_CODE_QUEUE_TIMEOUT as BUSY_CODE_QUEUE_TIMEOUT
from contract.busy import BUSY_CODE_SHED as BUSY_CODE_SHED
from contract.busy import BUSY_CODES as BUSY_CODES
from contract.busy import BUSY_STATUS as BUSY_STATUS
from contract.busy import RETRY_AFTER_MAX_S as RETRY_AFTER_MAX_S

# --- Ports -------------------------------------------------------------------------------------
NODE_API_PORT = 8000  # a unit member's HTTP server (the leader serves the API here)
ROUTER_PORT = 8080  # the router's public HTTP server (the API and its health check); the ALB targets it
# The router's /metrics, on loopback by default: a port no target group forwards to (runtime/router/metrics_port.py)
ROUTER_METRICS_PORT = 9464
DIST_PORT = 29500  # torch.distributed / collectives bootstrap on the leader
# Ports the units use between their own members only (unit security group, self-referencing)
UNIT_INTERNAL_PORT_RANGE = (29500, 29600)

# --- Health paths ------------------------------------------------------------------------------
NODE_LIVE_PATH = "/health/live"  # alive: the process answers and is not wedged
# The ECS container health check: fails until the unit has been ready once in this member's life,
# then means alive (docs/node.md "Health"); a rolling update stops old tasks once new ones pass it.
NODE_CONTAINER_HEALTH_PATH = "/health/container"
NODE_READY_PATH = "/health/ready"  # ready: unit formed, engine warm, not draining (router reads it)
NODE_WATCH_PATH = "/health/watch"  # the ready body as a stream, one line per interval: the router watches leaders
ROUTER_HEALTH_PATH = "/health"  # the ALB's target-group health check on the router
METRICS_PATH = "/metrics"
API_PATH_PATTERN = "/v1/*"  # the OpenAI API: with ROUTER_HEALTH_PATH, all the front door forwards

# --- Request identity ----------------------------------------------------------------------------
REQUEST_ID_HEADER = "X-Request-Id"
REQUEST_ID_PATTERN = r"^[A-Za-z0-9._:\-]{1,128}$"  # a client's id is kept (as correlation id) if it matches
# The leader's own id of a request (the response body's `id`): generated, unique in the unit, the only
# key the node files a request under. X-Request-Id is the client's correlation id: logged, returned,
# forwarded, never a key (two clients may send the same one).
COMPLETION_ID_HEADER = "X-Flotilla-Completion-Id"
ARRIVAL_HEADER = "X-Flotilla-Arrival"  # unix seconds, float, when the leader took the request
FIRST_TOKEN_HEADER = "X-Flotilla-First-Token"  # unix seconds of the first token (non-streamed responses)
FINISH_HEADER = "X-Flotilla-Finish"  # unix seconds of the last token (non-streamed responses)
UNIT_HEADER = "X-Flotilla-Unit"  # which unit served the request (set by the leader)
REVISION_HEADER = "X-Flotilla-Revision"  # the serving unit's revision
# A client's conversation id: the router keeps requests that carry the same one on one unit (its
# cache), like the OpenAI `user` field; docs/routing.md.
SESSION_HEADER = "X-Session-Id"

# --- Resumable streams (router <-> leader only; the router strips these from client requests) -----
# The router asks a leader to report, inside the SSE stream, the token ids each event carries: an SSE
# comment line (": ..."), which EventSource and OpenAI's SDKs skip (WHATWG HTML, "Server-sent events",
# interpreting an event stream: a line starting with ":" is ignored), and which the router strips.
RESUME_HEADER = "X-Flotilla-Resume"  # router -> leader: "1" = put resume comments in this stream
# router -> leader: the body carries CONTINUATION_FIELD (the tokens already sent to the client); a
# leader honours that field only with this header, which no client request reaches a leader with.
CONTINUATION_HEADER = "X-Flotilla-Continuation"
CONTINUATION_FIELD = "flotilla_continuation"  # {"id", "created", "token_ids"} in the request body
RESUME_COMMENT = ": flotilla-resume "  # + {"t": [token ids sent in this event], "h": held tokens}; opens the event
MOVE_COMMENT = ": flotilla-move "  # + the reason: this stream should continue on another unit
# router -> leader: the request's routing key (a 64-bit unsigned integer in decimal). The leader lists
# the keys it admits in its watch lines (`keys`), so every router learns which unit took a
# conversation's latest turn, not only the router that sent it (docs/routing.md).
ROUTE_KEY_HEADER = "X-Flotilla-Route-Key"
# router -> leader, beside ROUTE_KEY_HEADER on a completion prompt: "<bytes>:<tail>", the prompt's length
# and the hash of its last bytes as the router compares prompts (runtime/router/balance.py KeyPrompts).
# The leader lists it with the prompt's token count in its watch lines (`prompts`: [key, bytes, tokens,
# tail] each), so every router, not only the sender, credits the conversation's next completion prompt
# with what its unit holds (docs/routing.md).
ROUTE_PROMPT_HEADER = "X-Flotilla-Route-Prompt"
# router -> leader, beside ROUTE_PROMPT_HEADER: "<mark>,<mark>,...", the hashes at the prompt's
# checkpoints, the furthest first (KeyPrompts again), at most ROUTE_MARKS_MAX. The leader lists them in
# its watch lines as `marks`, one list per `prompts` entry and in the same order ([] when the header was
# absent or malformed), so every router credits a next prompt that resends most of this one. A separate
# header and field, so that members of the revision before, which read neither, keep working beside these.
ROUTE_MARKS_HEADER = "X-Flotilla-Route-Marks"
ROUTE_MARKS_MAX = 8
INTERNAL_HEADERS = (RESUME_HEADER, CONTINUATION_HEADER, ROUTE_KEY_HEADER, ROUTE_PROMPT_HEADER, ROUTE_MARKS_HEADER)

# --- Environment variables (container settings) --------------------------------------------------
ENV_ROLE = "FLOTILLA_ROLE"  # node | router (the image command also picks it)
ENV_UNIT_ID = "FLOTILLA_UNIT_ID"  # e.g. "cell0-unit3"
ENV_CELL_ID = "FLOTILLA_CELL_ID"
ENV_REVISION = "FLOTILLA_REVISION"  # deployment revision; a unit never mixes revisions
ENV_NODES_PER_UNIT = "FLOTILLA_NODES_PER_UNIT"
ENV_RENDEZVOUS = "FLOTILLA_RENDEZVOUS"  # static | ecs
ENV_PEERS = "FLOTILLA_PEERS"  # static rendezvous: comma-separated host:port, rank order
ENV_RANK = "FLOTILLA_RANK"  # static rendezvous: this member's rank
ENV_ENGINE = "FLOTILLA_ENGINE"  # reference | neuron
ENV_MODEL = "FLOTILLA_MODEL"  # tiny | smollm2 | a checkpoint directory
ENV_MODEL_URI = "FLOTILLA_MODEL_URI"  # s3://bucket/prefix of the model artifacts (AWS)
ENV_MODEL_NAME = "FLOTILLA_MODEL_NAME"  # the name clients use in "model"
ENV_PREFILL_STRATEGY = "FLOTILLA_PREFILL_STRATEGY"  # auto | pipeline | tensor
ENV_DECODE_STRATEGY = "FLOTILLA_DECODE_STRATEGY"  # auto | pipeline | tensor
ENV_DRAIN_TIMEOUT = "FLOTILLA_DRAIN_TIMEOUT_S"
ENV_PORT = "PORT"  # HTTP port override (node API or router)
ENV_METRICS_PORT = "FLOTILLA_METRICS_PORT"  # router: its metrics port (ROUTER_METRICS_PORT)
ENV_DISCOVERY = "FLOTILLA_DISCOVERY"  # router: static | cloudmap
ENV_UNITS = "FLOTILLA_UNITS"  # router, static discovery: comma-separated leader URLs
ENV_CLOUDMAP_NAMESPACE = "FLOTILLA_CLOUDMAP_NAMESPACE"
ENV_CLOUDMAP_SERVICE = "FLOTILLA_CLOUDMAP_SERVICE"
ENV_POLL_INTERVAL = "FLOTILLA_POLL_INTERVAL_S"
ENV_BALANCE = "FLOTILLA_BALANCE"  # router: how it picks a unit (docs/routing.md)
ROUTER_BALANCE_POLICIES = ("cache_aware", "least_work", "least_requests")  # its values; the first is the default
ENV_ADMISSION_PARAMETER = "FLOTILLA_ADMISSION_PARAMETER"  # router: SSM parameter of the admission limit
ENV_CACHE_DIR = "FLOTILLA_CACHE_DIR"  # model conversion / download cache
ENV_API_KEYS_SECRET = "FLOTILLA_API_KEYS_SECRET"  # router: Secrets Manager secret of the hashed API keys
ENV_API_KEYS_TTL = "FLOTILLA_API_KEYS_TTL_S"  # router: seconds between reads of the keys' secret
ENV_API_KEY = "FLOTILLA_API_KEY"  # router: the one key local mode accepts (`make local API_KEY=...`)
ENV_LIMIT_ROUTERS = "FLOTILLA_LIMIT_ROUTERS"  # router: routers sharing each key's limits (each takes 1/n)


# --- Choices both the deployment config and the node settings offer -----------------------------
class Engine(StrEnum):
    """FLOTILLA_ENGINE: what runs the model. A str, so a name read from a flag or JSON compares equal."""

    REFERENCE = "reference"  # torch on CPU
    ECHO = "echo"  # a test engine: no model
    NEURON = "neuron"  # vLLM with NxD Inference on Trainium


class Strategy(StrEnum):
    """How a phase (prefill, decode) splits the model over a unit's members."""

    PIPELINE = "pipeline"  # each member holds some layers
    TENSOR = "tensor"  # each member holds a share of every layer's heads


ENGINES = tuple(e.value for e in Engine)
STRATEGIES = tuple(s.value for s in Strategy)
AUTO_STRATEGY = "auto"  # the reference engine times both strategies at formation and keeps the faster
STRATEGY_CHOICES = (AUTO_STRATEGY, *STRATEGIES)  # FLOTILLA_PREFILL_STRATEGY / FLOTILLA_DECODE_STRATEGY

# --- Names of cells and units --------------------------------------------------------------------
# A cell's id names its stack's tags, its Cloud Map service and its ECS cluster; a unit's id is
# FLOTILLA_UNIT_ID. Parsed back by the operations CLI, so both forms are declared here only.
CELL_ID_PATTERN = r"cell(\d+)"
UNIT_ID_PATTERN = CELL_ID_PATTERN + r"-unit(\d+)"


# ECS "Capacity providers per cluster": 20, not adjustable, in the current developer guide
# (https://docs.aws.amazon.com/AmazonECS/latest/developerguide/service-quotas.html); the older ECS
# user guide page (AmazonECS/latest/userguide/service-quotas.html) and
# aws-cloudformation/cloudformation-coverage-roadmap#1086 say 10. We follow the developer guide, the
# page AWS maintains; an account that still has 10 sets units_per_cell: 10 (docs/configuration.md).
# A cell is one cluster and each unit has its own capacity provider, so a cell holds at most this many.
MAX_UNITS_PER_CELL = 20


def cell_id(cell: int) -> str:
    return f"cell{cell}"


def unit_id(cell: int, index: int) -> str:
    return f"{cell_id(cell)}-unit{index}"


# --- Router discovery ----------------------------------------------------------------------------
# Seconds between the router's discovery passes: a units file is cheap to re-read; a Cloud Map
# pass is a DiscoverInstancesRevision call per cell, which the deployment's quota check counts.
STATIC_DISCOVERY_INTERVAL_S = 2.0
CLOUDMAP_DISCOVERY_INTERVAL_S = 5.0

# --- Image commands ------------------------------------------------------------------------------
NODE_COMMAND = ["node"]
ROUTER_COMMAND = ["router"]

# Unit identity keys: a unit member reports them in its /health/ready JSON body (router discovery)
ATTR_UNIT = "unit"
ATTR_ROLE = "role"  # leader | follower
ATTR_REVISION = "revision"
ATTR_CELL = "cell"  # the unit's cell (FLOTILLA_CELL_ID); the router emits ReadyUnits per cell
ATTR_MEMBERS = "members"  # leader: its followers as it last saw them, so nobody else has to poll them
ATTR_LEADER = "leader"  # follower: its leader's host:port, so a router that asks a follower finds the leader

# --- Unit service tags the stacks write and `flotilla` reads ------------------------------------------
# On a unit's ECS service: the desired count it had before it was drained (drain-unit writes it; the
# template writes it, with the node count, for a unit in the config's drained_units).
TAG_DRAINED_DESIRED_COUNT = "flotilla:drained-desired-count"
# On a unit the config drains (drained_units): restore-unit refuses it, since the next deploy would
# drain it again; remove it from drained_units and deploy instead.
TAG_DRAINED_IN_CONFIG = "flotilla:drained-in-config"

# --- Metrics: CloudWatch embedded metric format (EMF) lines on stdout ------------------------------
# The awslogs driver ships stdout to CloudWatch Logs, which turns EMF JSON lines into metrics; the
# Observability stack's dashboard and alarms read exactly these names. See docs/observability.md.
METRICS_NAMESPACE = "Flotilla"
METRIC_DIM_SERVICE = "Service"  # always present, value METRIC_SERVICE_VALUE (fleet-wide series)
METRIC_SERVICE_VALUE = "flotilla"
METRIC_DIM_CELL = "Cell"  # second dimension set: per cell (value = FLOTILLA_CELL_ID)
METRIC_TIME_TO_FIRST_TOKEN = "TimeToFirstToken"  # Milliseconds; the leader, once per request
METRIC_OUTPUT_TOKENS = "OutputTokens"  # Count; the leader, once per finished request
METRIC_READY_UNITS = "ReadyUnits"  # Count; each router, every 60 s, per cell and fleet-wide
# Percent; each router, every 60 s: of the requests it routed with a session or prefix key, the share
# sent to the key's own unit (the rest went to less work elsewhere). docs/routing.md.
METRIC_ROUTED_TO_PREFERRED = "RoutedToPreferredUnit"
# Percent; each router, every 60 s: the busiest routable unit's requests as a percentage of the mean
# (100 = even). A hot unit shows here first. docs/runbooks/hot-unit.md.
METRIC_BUSIEST_UNIT_LOAD = "BusiestUnitLoad"
# Each router, once per routed request (its access log line, on stderr): what a router revision can
# break, for the router's blue/green deployment alarms. Sheds (429/503 by design) are not routed.
METRIC_ROUTER_ADDED_LATENCY = "RouterAddedLatency"  # Milliseconds; the router's own share of the wait
METRIC_ROUTER_FAULTS = "RouterFaults"  # Count; 1 when the router itself failed the request, else 0
# Each unit leader whose engine drafts, once a minute (speculative decoding, docs/engine.md): draft tokens
# kept of those verified in the minute, and the tokens a decoding answer gained per step lately.
METRIC_SPEC_ACCEPTANCE = "SpeculativeAcceptance"  # Percent
METRIC_DECODE_TOKENS_PER_STEP = "DecodeTokensPerStep"  # Count

# Cloud Map attributes that ECS itself writes when it registers a unit member (tasks carry no custom
# attributes): the router reads the address here and asks the member's /health/ready for
# ATTR_UNIT / ATTR_ROLE / ATTR_REVISION (keys of that JSON body). See docs/discovery.md.
CLOUDMAP_ATTR_IPV4 = "AWS_INSTANCE_IPV4"
CLOUDMAP_ATTR_PORT = "AWS_INSTANCE_PORT"  # may be absent (host networking): use NODE_API_PORT
CLOUDMAP_ATTR_ECS_SERVICE = "ECS_SERVICE_NAME"  # one ECS service per unit
# One Cloud Map service per cell, named this prefix + the cell id ("units-cell0"): a service holds at
# most 1,000 instances and DiscoverInstances returns at most 1,000 (docs/discovery.md).
CLOUDMAP_UNITS_SERVICE_PREFIX = "units-"

# --- Neuron engine -----------------------------------------------------------------------------
# Multi-node units use NxD Inference's documented port (aws-neuron/neuronx-distributed-inference@cd3abf30
# examples/multi_node.md:109,132, NEURON_RT_ROOT_COMM_ID=<rank-0 host>:63423), outside
# UNIT_INTERNAL_PORT_RANGE: the unit security group's self-referencing rule admits all traffic (EFA
# needs it), so it covers it; nothing outside the unit may reach it.
NEURON_RT_ROOT_COMM_PORT = 63423  # Neuron runtime collectives bootstrap on the leader
NEURON_ENGINE_PORT = 8001  # the leader's vLLM server, bound to 127.0.0.1 only
ENV_NEURON_SDK_VERSION = "FLOTILLA_NEURON_SDK_VERSION"  # set by Dockerfile.neuron; compile-cache key
ENV_COMPILE_CACHE_URI = "FLOTILLA_COMPILE_CACHE_URI"  # s3://bucket/prefix for compiled artifacts
ENV_INSTANCE_TYPE = "FLOTILLA_INSTANCE_TYPE"  # neuron engine: the node's instance type (plan layout)
NEURON_SAMPLING_MODES = ("device", "cpu")  # neuron engine: on-device sampling or vLLM's host sampler
ENV_NEURON_SAMPLING = "FLOTILLA_NEURON_SAMPLING"  # which of them; decides the OpenAI fields it serves
# neuron engine, one node: 0 (off) or the KV block size in tokens of vLLM's prefix caching (an opt-in)
ENV_NEURON_PREFIX_CACHING_BLOCK = "FLOTILLA_NEURON_PREFIX_CACHING_BLOCK"
NEURON_PREFIX_CACHING_BLOCKS = (0, 1, 8, 16, 32, 64, 128, 256)  # 0, or what vLLM 0.13.0's --block-size takes
# neuron engine: the layout the node checks at start (contract/layout.py), as the stacks set it
ENV_NEURON_SEQ_LEN = "FLOTILLA_NEURON_SEQ_LEN"  # prompt + output tokens of a sequence
ENV_NEURON_BATCH_SIZE = "FLOTILLA_NEURON_BATCH_SIZE"  # sequences decoded together
ENV_NEURON_CP_DEGREE = "FLOTILLA_NEURON_CP_DEGREE"
ENV_NEURON_ATTENTION_DP_DEGREE = "FLOTILLA_NEURON_ATTENTION_DP_DEGREE"
