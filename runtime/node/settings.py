"""A unit member's settings, each declared once (flag, environment variable, default, rule, help);
--help and docs/node.md's tables are rendered from the declarations. Flags win over variables over
defaults; a bad value raises SettingsError, one line naming the setting as given and the fix
(contract.bad_input's wording).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from pydantic import (
    ValidationError,
    ValidationInfo,
    field_validator,
)

import contract
from contract import Engine
from contract.bad_input import NOT_GIVEN, bad_input_line
from contract.declare import (
    NOT_ALLOWED,
    NOT_AN_INTEGER,
    OUT_OF_RANGE,
    Integer,
    NonEmpty,
    Number,
    OneOf,
    refusal,
    refused,
    settings_docs_parser,
    spliced,
)
from contract.settings import SettingsError as SettingsError  # the one settings error, raised from here too
from runtime.engines.base import (
    DEFAULT_COLLECTIVE_TIMEOUT_S,
    DEFAULT_KV_BUDGET_TOKENS,
    DEFAULT_MAX_PREFILL_TOKENS,
    DEFAULT_MAX_RUNNING,
)
from runtime.node.declared import Declared as Declared
from runtime.node.declared import DeclaredSettings, Misplaced, declared
from runtime.node.declared import setting as setting
from runtime.node.neuron_settings import VLLM_BLOCK_SIZES as VLLM_BLOCK_SIZES
from runtime.node.neuron_settings import NeuronSettings as NeuronSettings

ENGINES = contract.ENGINES
RENDEZVOUS = ("static", "ecs")
STRATEGIES = contract.STRATEGY_CHOICES  # auto: measured at formation
# How a full unit refuses (docs/node.md, "How a request ends"): at arrival from the expected wait, or only
# once the queue timeout ran out (the estimate off, e.g. while diagnosing it).
SHED_MODES = ("at-once", "queue-timeout")
BUILTIN_MODELS = ("tiny", "smollm2")
DOCS = Path(__file__).resolve().parents[2] / "docs" / "node.md"
DOCS_BEGIN = (
    "<!-- BEGIN settings: rendered from runtime/node/settings.py by "
    "`python -m runtime.node.settings --write-docs`; edit the declarations, not this table -->"
)
DOCS_END = "<!-- END settings -->"


PORT = Integer(1, 65535)  # a member's port in the peer list


@dataclass(frozen=True)
class Peer:
    host: str
    port: int


class NodeSettings(DeclaredSettings):
    """One unit member's settings, validated; the fields after `rendezvous` depend on it."""

    unit_id: str = setting(
        "unit0", "--unit", contract.ENV_UNIT_ID, "unit id", rule=NonEmpty("an id such as cell0-unit0")
    )
    cell_id: str = setting(
        "",
        "--cell",
        contract.ENV_CELL_ID,
        "the unit's cell: `cell` in `/health/ready` and the `Cell` dimension of the EMF metrics (none locally)",
        shown="—",
    )
    revision: str = setting(
        "dev",
        "--revision",
        contract.ENV_REVISION,
        "deployment revision; members of other revisions are refused",
        rule=NonEmpty("the deployment revision (any non-empty string)"),
    )
    rendezvous: str = setting(
        "static", "--rendezvous", contract.ENV_RENDEZVOUS, "how members find each other", rule=OneOf(*RENDEZVOUS)
    )
    peers: tuple[Peer, ...] = setting(
        None, "--peers", contract.ENV_PEERS, "static: comma-separated host:port of every member, rank order"
    )
    rank: int | None = setting(None, "--rank", contract.ENV_RANK, "static: this member's rank")
    world_size: int = setting(
        None,
        "--nodes",
        contract.ENV_NODES_PER_UNIT,
        "ecs: members per unit (static: the number of peers)",
        rule=Integer(1, 64),
    )
    bind_host: str = setting("0.0.0.0", "--host", "FLOTILLA_BIND_HOST", "address to bind")
    api_port: int = setting(
        None,
        "--port",
        contract.ENV_PORT,
        "HTTP port (static: must match --peers)",
        shown=f"static: the peer's; ecs: {contract.NODE_API_PORT}",
        rule=Integer(1, 65535),
    )
    dist_port: int = setting(
        contract.DIST_PORT,
        "--dist-port",
        "FLOTILLA_DIST_PORT",
        "leader's collectives bootstrap port",
        rule=Integer(1, 65535),
    )
    engine: str = setting(
        "reference",
        "--engine",
        contract.ENV_ENGINE,
        "the engine that runs the model (neuron: vLLM + NxD Inference on Trainium)",
        rule=OneOf(*ENGINES),
    )
    neuron: NeuronSettings | None = None  # engine=neuron only: the settings further down
    model: str = setting("tiny", "--model", contract.ENV_MODEL, "tiny, smollm2 or a checkpoint directory")
    model_name: str = setting(
        None,
        "--model-name",
        contract.ENV_MODEL_NAME,
        'the name clients send as "model"',
        shown="the model's last path part",
    )
    prefill_strategy: str = setting(
        contract.AUTO_STRATEGY,
        "--prefill",
        contract.ENV_PREFILL_STRATEGY,
        "how prefill splits over the members; auto: the faster one, timed when the unit forms "
        "(docs/engine.md), pipeline or tensor to pin it",
        rule=OneOf(*STRATEGIES),
    )
    decode_strategy: str = setting(
        contract.AUTO_STRATEGY,
        "--decode",
        contract.ENV_DECODE_STRATEGY,
        "how decode splits over the members; auto, pipeline or tensor, as for prefill",
        rule=OneOf(*STRATEGIES),
    )
    cache_dir: str | None = setting(None, "--cache-dir", contract.ENV_CACHE_DIR, "model conversion cache")
    drain_timeout_s: float = setting(
        30.0,
        "--drain-timeout",
        contract.ENV_DRAIN_TIMEOUT,
        "seconds in-flight requests get after SIGTERM",
        rule=Number(0),
    )
    rendezvous_timeout_s: float = setting(
        600.0,
        "--rendezvous-timeout",
        "FLOTILLA_RENDEZVOUS_TIMEOUT_S",
        "seconds to wait for every member",
        rule=Number(1),
    )
    # engine=neuron: compiling a large model takes far longer than the reference engine's warm-up,
    # so a formation may take an hour and /health/live must outlast it (each still overridable).
    form_timeout_s: float = setting(
        600.0,
        "--form-timeout",
        "FLOTILLA_FORM_TIMEOUT_S",
        "seconds one formation may take (neuron: fetch + compile + load)",
        neuron_default=3600.0,
        rule=Number(1),
    )
    live_budget_s: float = setting(
        1800.0,
        "--live-budget",
        "FLOTILLA_LIVE_BUDGET_S",
        "seconds /health/live stays 200 while not formed",
        neuron_default=5400.0,
        rule=Number(1),
    )
    # The container health check (/health/container) first passes once the unit has been ready
    # this long: every router (polling every 0.25 s) has seen the new unit ready before ECS, which
    # stops an old task as soon as a new one is healthy, takes the old unit out of rotation.
    ready_settle_s: float = setting(
        2.0,
        "--ready-settle",
        "FLOTILLA_READY_SETTLE_S",
        "seconds the unit must have been ready before /health/container first answers 200",
        rule=Number(0),
    )
    max_restarts: int = setting(
        10, "--max-restarts", "FLOTILLA_MAX_RESTARTS", "re-forms allowed per restart window", rule=Integer(0)
    )
    restart_window_s: float = setting(600.0, "--restart-window", "FLOTILLA_RESTART_WINDOW_S", "seconds", rule=Number(1))
    peer_dead_after_s: float = setting(
        3.0,
        "--peer-dead-after",
        "FLOTILLA_PEER_DEAD_AFTER_S",
        "seconds of silence before a member counts as dead",
        rule=Number(0.1),
    )
    rendezvous_watch_s: float = setting(
        10.0,
        "--rendezvous-watch",
        "FLOTILLA_RENDEZVOUS_WATCH_S",
        "seconds between rendezvous membership checks; the member-to-member handshake notices deaths sooner",
        rule=Number(0.1),
    )
    max_tokens_limit: int = setting(
        4096,
        "--max-tokens-limit",
        "FLOTILLA_MAX_TOKENS_LIMIT",
        "largest max_tokens a request may ask for",
        rule=Integer(1),
    )
    # The two bounds on one request (docs/node.md, "How a request ends"). With the router's defaults
    # (runtime/router/settings.py: first byte 60 s, silence between chunks 30 s) the node's queue
    # timeout fires first, so a request stuck in a queue ends with the unit's own 503, which the
    # router may still move to another unit, rather than the router's 504 without a cause.
    queue_timeout_s: float = setting(
        25.0,
        "--queue-timeout",
        "FLOTILLA_QUEUE_TIMEOUT_S",
        "seconds a request may wait for a batch slot (until its first token) before it ends 429 + Retry-After",
        rule=Number(0.01),
    )
    shed: str = setting(
        "at-once",
        "--shed",
        "FLOTILLA_SHED",
        "when a full unit refuses a request (429 + Retry-After): at-once, on arrival, when its expected wait for a "
        "batch slot is past the queue timeout; queue-timeout, only once it has waited the whole queue timeout",
        rule=OneOf(*SHED_MODES),
    )
    request_timeout_s: float = setting(
        600.0,
        "--request-timeout",
        "FLOTILLA_REQUEST_TIMEOUT_S",
        "seconds a request may take in all; past it the engine drops it and the client gets an error, "
        "never a cut-short answer",
        rule=Number(0.01),
    )
    client_stall_s: float = setting(
        60.0,
        "--client-stall",
        "FLOTILLA_CLIENT_STALL_S",
        "seconds a streaming client (or a /health/watch watcher) may accept no bytes before it counts as gone: "
        "its request is cancelled in the engine, freeing its batch slot",
        rule=Number(0, above=True),
    )
    torch_threads: int = setting(
        1, "--torch-threads", "FLOTILLA_TORCH_THREADS", "torch threads per process", rule=Integer(1, 256)
    )
    kv_budget_tokens: int = setting(
        DEFAULT_KV_BUDGET_TOKENS,
        "--kv-budget-tokens",
        "FLOTILLA_KV_BUDGET_TOKENS",
        "KV-cache tokens over all running sequences",
        rule=Integer(16),
    )
    max_running: int = setting(
        DEFAULT_MAX_RUNNING, "--max-running", "FLOTILLA_MAX_RUNNING", "batch slots", rule=Integer(1, 4096)
    )
    max_prefill_tokens: int = setting(
        DEFAULT_MAX_PREFILL_TOKENS,
        "--max-prefill-tokens",
        "FLOTILLA_MAX_PREFILL_TOKENS",
        "engine=reference: prompt tokens prefilled per step; a longer prompt is prefilled in chunks over several "
        "steps, each also decoding the running batch (bounds how long running answers wait for a token; on a one-rank "
        "or tensor/tensor unit chunk and decode share one pass, so a small budget costs little: docs/engine.md)",
        rule=Integer(1, 1_048_576),
    )
    collective_timeout_s: float = setting(
        DEFAULT_COLLECTIVE_TIMEOUT_S,
        "--collective-timeout",
        "FLOTILLA_COLLECTIVE_TIMEOUT_S",
        "seconds before a silent peer fails the unit",
        rule=Number(1),
    )
    engine_stall_s: float = setting(
        60.0,
        "--engine-stall",
        "FLOTILLA_ENGINE_STALL_S",
        "seconds after which a ready engine process counts as wedged and the unit re-forms: silent (no report at "
        "all), or holding requests without progress (no token, no completed step)",
        rule=Number(0.5),
    )
    progress_stall_s: float = setting(
        3.0,
        "--progress-stall",
        "FLOTILLA_PROGRESS_STALL_S",
        "seconds the leader's engine may hold running sequences without progress, no token and no completed step "
        "(a stopped member, a stuck collective), before the unit reports not ready, when its steps are short; a "
        "busy engine may go twice its longest recent step plus 1 s (the stall bound, docs/node.md); ready again "
        "once its steps complete",
        rule=Number(0.1),
    )
    progress_stall_max_s: float = setting(
        30.0,
        "--progress-stall-max",
        "FLOTILLA_PROGRESS_STALL_MAX_S",
        "the most seconds the stall bound grows to on an engine whose recent steps were long, so a busy unit "
        "that then hangs still leaves routing; never below the progress stall",
        rule=Number(0.1),
    )
    canary_idle_s: float = setting(
        10.0,
        "--canary-idle",
        "FLOTILLA_CANARY_IDLE_S",
        "seconds without a request or a token after which the leader sends its own engine a one-token request "
        "(never counted as traffic), so an engine that hung while idle is found by the progress stall bound; 0: never",
        rule=Number(0),
    )

    echo_load_s: float = setting(
        0.0,
        "--echo-load",
        "FLOTILLA_ECHO_LOAD_S",
        "engine=echo only: seconds the engine takes to start, standing in for loading a model (rehearsals, tests)",
        rule=Number(0),
    )
    echo_step_s: float = setting(
        0.01,
        "--echo-step",
        "FLOTILLA_ECHO_STEP_S",
        "engine=echo only: seconds per decode step, standing in for a busy unit's slow steps (tests)",
        rule=Number(0, 600),
    )

    # Fixed, not settings.
    backoff_initial_s: ClassVar[float] = 0.5  # the first re-form waits this long, doubling each time
    backoff_max_s: ClassVar[float] = 30.0
    peer_poll_s: ClassVar[float] = 0.25  # how often members check each other

    @field_validator("peers", mode="before")
    @classmethod
    def _peers(cls, v: str | None, info: ValidationInfo) -> tuple[Peer, ...]:
        if info.data.get("rendezvous") != "static":
            return ()  # ecs rendezvous finds the members itself
        if not v or not v.strip():
            raise ValueError(
                "is required with static rendezvous: list every member as host:port, comma-separated, in rank order"
            )
        return parse_peers(v)

    @field_validator("rank", mode="wrap")
    @classmethod
    def _rank(cls, v: str | None, handler: Any, info: ValidationInfo) -> int | None:
        peers = info.data.get("peers")
        if info.data.get("rendezvous") != "static" or not peers:
            return None  # ecs rendezvous assigns ranks
        ranks = Integer(0, len(peers) - 1)  # a range known only once the peers are
        if v is None:
            raise ValueError(
                f"is required with static rendezvous: give this member's index in the peer list, {ranks.allowed}"
            )
        fix = ranks.fix
        try:
            rank: int = handler(v)
        except ValidationError:
            raise refusal(NOT_AN_INTEGER, fix) from None
        if not 0 <= rank < len(peers):
            raise refusal(OUT_OF_RANGE, fix)
        return rank

    @field_validator("world_size", mode="wrap")
    @classmethod
    def _world_size(cls, v: str | None, handler: Any, info: ValidationInfo) -> int:
        if info.data.get("rendezvous") == "static":
            peers = info.data.get("peers")
            if peers and v is not None and handler(v) != len(peers):
                raise ValueError(f"but {len(peers)} peers are listed: make them agree or drop the node count")
            return len(peers) if peers else 1
        if v is None:
            raise ValueError("is required with ecs rendezvous: give the number of members per unit")
        return int(handler(v))

    @field_validator("api_port", mode="wrap")
    @classmethod
    def _api_port(cls, v: str | None, handler: Any, info: ValidationInfo) -> int:
        port = None if v is None else int(handler(v))
        peers, rank = info.data.get("peers"), info.data.get("rank")
        if info.data.get("rendezvous") == "static" and peers and rank is not None:
            if port is not None and port != peers[rank].port:
                raise ValueError(
                    f"but the peer list gives rank {rank} port {peers[rank].port}: "
                    "drop the port setting or make them agree"
                )
            return int(peers[rank].port)
        return contract.NODE_API_PORT if port is None else port

    @field_validator("dist_port", mode="after")
    @classmethod
    def _dist_port(cls, v: int, info: ValidationInfo) -> int:
        if v == info.data.get("api_port"):
            raise ValueError("equals the HTTP port: give the collectives another port")
        return v

    @field_validator("neuron", mode="after")
    @classmethod
    def _neuron(cls, v: NeuronSettings | None, info: ValidationInfo) -> NeuronSettings | None:
        if v is not None and v.engine_port == info.data.get("api_port"):
            raise Misplaced(("neuron", "engine_port"), "equals the HTTP port: give vLLM another port")
        return v

    @field_validator("model", mode="after")
    @classmethod
    def _model(cls, v: str, info: ValidationInfo) -> str:
        if info.data.get("engine") == Engine.NEURON:
            return v  # the neuron engine fetches the model URI instead
        if not v:
            raise ValueError("is empty: use tiny, smollm2 or a checkpoint directory")
        if v not in BUILTIN_MODELS and not os.path.isdir(v):
            raise ValueError(
                "is neither tiny, smollm2 nor an existing checkpoint directory: fix the path or pick a built-in model"
            )
        return v

    @field_validator("request_timeout_s", mode="after")
    @classmethod
    def _queue_wait_within_the_deadline(cls, v: float, info: ValidationInfo) -> float:
        queue = info.data.get("queue_timeout_s")
        if queue is not None and queue > v:
            raise Misplaced(
                ("queue_timeout_s",),
                f"is longer than FLOTILLA_REQUEST_TIMEOUT_S (or --request-timeout), {v:g} s: a request must get "
                f"its batch slot before its deadline; give at most {v:g}, or a longer request timeout",
            )
        return v

    @field_validator("model_name", mode="before")
    @classmethod
    def _model_name(cls, v: str | None, info: ValidationInfo) -> str:
        if v and v.strip():
            return v
        neuron = info.data.get("neuron")
        return os.path.basename((neuron.model_uri if neuron else info.data.get("model", "")).rstrip("/"))


SETTINGS = declared(NodeSettings)
NEURON_FIELD = "neuron"  # the NodeSettings field that holds the neuron group
NEURON_SETTINGS = declared(NeuronSettings, (NEURON_FIELD,))
NEURON_DEFAULTS = {d.path[-1]: d.neuron_default for d in SETTINGS if d.neuron_default is not None}
NEURON_GROUP = "neuron engine (engine=neuron only)"
NEURON_GROUP_DOC = (
    "`FLOTILLA_ENGINE=neuron` only (read and checked only with that engine; the stacks set "
    "the model and compile-cache URIs and the instance type):"
)


# -- flags, environment, validation ------------------------------------------------------------------
def build_parser(p: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """The node's flags, on a fresh parser or on a subcommand's parser."""
    p = p or argparse.ArgumentParser(
        prog="flotilla-node",
        description="Run one member (leader or follower) of a flotilla unit. Every flag can also be "
        "given as the environment variable named in its help.",
    )
    # Every flag is read as a string and checked by the model, so that a bad value gets the same
    # one-line error whether it came from a flag or a variable (argparse's type= would exit itself).
    for d in SETTINGS:
        _add_flag(p, d)
    group = p.add_argument_group(NEURON_GROUP)
    for d in NEURON_SETTINGS:
        _add_flag(group, d)
    return p


def _add_flag(p: Any, d: Declared) -> None:
    default = d.default_text()
    given = "" if default == "—" else default if default == "required" else f"default {default}"
    where = ", ".join(x for x in (d.env, given) if x)
    text = re.sub(r"[`*]", "", f"{d.help} [{where}]").replace("%", "%%")
    metavar = "{" + ",".join(d.choices) + "}" if d.choices else d.path[-1].upper()
    p.add_argument(d.flag, dest=d.dest, metavar=metavar, help=text)


def load_settings(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> NodeSettings:
    return settings_from_args(build_parser().parse_args(argv), env)


def settings_from_args(ns: argparse.Namespace, env: Mapping[str, str] | None = None) -> NodeSettings:
    """Flags (parsed by build_parser) over environment variables over defaults, validated."""
    env = os.environ if env is None else env
    given: dict[tuple[str, ...], tuple[str, str]] = {}  # path -> (the flag or variable, its value)
    for d in SETTINGS + NEURON_SETTINGS:
        flag = getattr(ns, d.dest, None)
        if flag is not None:
            given[d.path] = (d.flag, flag)
        elif env.get(d.env, "") != "":
            given[d.path] = (d.env, env[d.env])
    data: dict[str, Any] = {path[0]: raw for path, (_, raw) in given.items() if len(path) == 1}
    if data.get("engine", Engine.REFERENCE) == Engine.NEURON:
        data = {**NEURON_DEFAULTS, **data}
        data[NEURON_FIELD] = {path[1]: raw for path, (_, raw) in given.items() if path[0] == NEURON_FIELD}
    try:
        return NodeSettings.model_validate(data)
    except ValidationError as e:
        raise SettingsError(_one_line(e, given)) from None


def _one_line(e: ValidationError, given: Mapping[tuple[str, ...], tuple[str, str]]) -> str:
    """pydantic's first error as '<setting as given>=<value> <what is wrong>: <the fix>'."""
    # Errors come in field order ("field order is preserved in validation errors",
    # https://docs.pydantic.dev/latest/concepts/models/#field-ordering): the first is the earliest
    # declared setting that is wrong. A validator's own ValueError is kept as ctx["error"] (error
    # type value_error, https://docs.pydantic.dev/latest/errors/validation_errors/#value_error);
    # tests/node/test_node_settings.py fails if either stops holding.
    err = e.errors()[0]
    cause = (err.get("ctx") or {}).get("error")
    loc = tuple(str(x) for x in err["loc"])
    declared = {d.path: d for d in SETTINGS + NEURON_SETTINGS}
    path = (
        cause.at
        if isinstance(cause, Misplaced)
        else next((loc[:n] for n in range(len(loc), 0, -1) if loc[:n] in declared), loc)
    )
    d = declared.get(path)
    if d is None:
        raise e  # a rule about no declared setting is a bug here, not the operator's mistake
    problem_fix = refused(err)  # a rule's refusal (contract.declare)
    if problem_fix is not None:
        problem, fix = problem_fix
    elif isinstance(cause, ValueError):  # a validator's: "<problem>: <fix>"
        problem, _, fix = str(cause).partition(": ")
    else:  # a check without its own wording: pydantic's sentence, still one line
        problem, fix = NOT_ALLOWED, str(err["msg"]).splitlines()[0]
    if path not in given:
        return bad_input_line(f"{d.env} (or {d.flag})", NOT_GIVEN, problem, fix)
    label, raw = given[path]
    return bad_input_line(label, raw, problem, fix, text=True)


def parse_peers(raw: str) -> tuple[Peer, ...]:
    """'host:port,host:port' -> the members in rank order; ValueError says what to fix."""
    peers = []
    for item in [s.strip() for s in raw.split(",")]:
        host, sep, port = item.rpartition(":")
        if not item or not sep or not host:
            raise ValueError(
                f"has {item!r}, which is not host:port: list every member as host:port, comma-separated, in rank order"
            )
        if not port.isdigit() or not 1 <= int(port) <= 65535:
            raise ValueError(f"has port {port!r} in {item!r}: give a port, {PORT.allowed}")
        peers.append(Peer(host=host, port=int(port)))
    if len(set(peers)) != len(peers):
        raise ValueError("lists a member twice: give each member's host:port once")
    return tuple(peers)


# -- docs/node.md ------------------------------------------------------------------------------------
def settings_markdown() -> str:
    """docs/node.md's settings tables, rendered from the declarations."""

    def table(settings: Sequence[Declared]) -> list[str]:
        rows = ["| environment variable | flag | default | allowed | meaning |", "|---|---|---|---|---|"]
        rows += [f"| `{d.env}` | `{d.flag}` | {d.default_text()} | {d.allowed()} | {d.help} |" for d in settings]
        return rows

    return "\n".join([*table(SETTINGS), "", NEURON_GROUP_DOC, "", *table(NEURON_SETTINGS)])


def docs_with_settings(doc: str) -> str:
    """`doc` with the text between DOCS_BEGIN and DOCS_END replaced by settings_markdown()."""
    return spliced(doc, DOCS_BEGIN, DOCS_END, settings_markdown(), DOCS)


def main(argv: Sequence[str] | None = None) -> int:
    if settings_docs_parser("python -m runtime.node.settings", "the node's", DOCS).parse_args(argv).write_docs:
        DOCS.write_text(docs_with_settings(DOCS.read_text()))
    else:
        print(settings_markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
