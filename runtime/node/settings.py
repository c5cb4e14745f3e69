"""A unit member's settings: read once from flags and environment variables, validated at start.

Flags win over environment variables. A bad value raises SettingsError with one line that names
the setting and the fix; the command line turns it into exit code 2.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import Mapping, Sequence

import contract
from contract.trainium import INSTANCES
from runtime.artifacts.manifest import ManifestError, parse_s3_uri

ENGINES = ("reference", "echo", "neuron")
RENDEZVOUS = ("static", "ecs")
STRATEGIES = ("pipeline", "tensor")


class SettingsError(ValueError):
    """A setting the operator gave is wrong; the message names it and the fix."""


@dataclass(frozen=True)
class Peer:
    host: str
    port: int


@dataclass(frozen=True)
class NeuronSettings:
    """engine=neuron: where the model and compile cache live, and the unit's Neuron layout."""
    model_uri: str                  # s3://bucket/prefix of the published checkpoint
    compile_cache_uri: str | None   # s3://bucket/prefix; None: compile on every start
    instance_type: str
    model_dir: str                  # where this node fetches the checkpoint
    compiled_dir: str               # NEURON_COMPILED_ARTIFACTS
    seq_len: int
    batch_size: int
    cp_degree: int | str            # int or "auto"
    attention_dp_degree: int | str
    engine_port: int                # the leader's vLLM server on 127.0.0.1
    launcher: str | None            # replaces `python3 -m <module>` of the plan's command (test stand-ins)


@dataclass(frozen=True)
class NodeSettings:
    unit_id: str
    revision: str
    cell_id: str                    # the unit's cell ("" locally): /health/ready and the EMF Cell dimension
    rendezvous: str                 # static | ecs
    peers: tuple[Peer, ...]         # static: every member's host:api_port, in rank order
    rank: int | None                # static: this member's rank
    nodes_per_unit: int             # world_size
    bind_host: str
    api_port: int
    dist_port: int
    engine: str
    model: str
    model_name: str
    prefill_strategy: str
    decode_strategy: str
    cache_dir: str | None
    drain_timeout_s: float
    rendezvous_timeout_s: float     # how long to wait for every member to appear
    form_timeout_s: float           # one formation attempt (process group + weights + warm-up)
    live_budget_s: float            # /health/live stays 200 this long while the unit is not formed
    max_restarts: int               # re-forms allowed inside restart_window_s before giving up
    restart_window_s: float
    backoff_initial_s: float
    backoff_max_s: float
    peer_poll_s: float              # how often members check each other
    rendezvous_watch_s: float       # how often the rendezvous backend is asked about changes (AWS APIs)
    peer_dead_after_s: float        # a member silent this long is dead: the unit re-forms
    max_tokens_limit: int           # the largest max_tokens a request may ask for
    torch_threads: int
    kv_budget_tokens: int           # reference engine: KV-cache tokens over all running sequences
    max_running: int                # reference engine: batch slots
    collective_timeout_s: float     # reference engine: a wedged peer fails requests within this
    engine_stall_s: float           # a ready engine process silent this long is wedged: re-form
    neuron: "NeuronSettings | None" = None   # engine=neuron only

    @property
    def world_size(self) -> int:
        return self.nodes_per_unit


def build_parser(p: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """The node's flags, on a fresh parser or on a subcommand's parser."""
    p = p or argparse.ArgumentParser(
        prog="flotilla-node",
        description="Run one member (leader or follower) of a flotilla unit. Every flag can also be "
        "given as the environment variable named in its help.",
    )
    a = p.add_argument
    a("--unit", dest="unit_id", help=f"unit id [{contract.ENV_UNIT_ID}, default unit0]")
    a("--cell", dest="cell_id", help=f"the unit's cell, reported to the router and in metrics [{contract.ENV_CELL_ID}, default none]")
    a("--revision", help=f"deployment revision; members of other revisions are refused [{contract.ENV_REVISION}, default dev]")
    a("--rendezvous", help=f"static | ecs [{contract.ENV_RENDEZVOUS}, default static]")
    a("--peers", help=f"static: comma-separated host:port of every member, rank order [{contract.ENV_PEERS}]")
    a("--rank", help=f"static: this member's rank [{contract.ENV_RANK}]")
    a("--nodes", dest="nodes_per_unit", help=f"ecs: members per unit [{contract.ENV_NODES_PER_UNIT}]")
    a("--host", dest="bind_host", help="address to bind [FLOTILLA_BIND_HOST, default 0.0.0.0]")
    a("--port", dest="api_port", help=f"HTTP port (static: must match --peers) [{contract.ENV_PORT}, default {contract.NODE_API_PORT}]")
    a("--dist-port", help=f"leader's collectives bootstrap port [FLOTILLA_DIST_PORT, default {contract.DIST_PORT}]")
    a("--engine", help=f"reference | echo | neuron [{contract.ENV_ENGINE}, default reference]")
    a("--model", help=f"tiny | smollm2 | checkpoint directory [{contract.ENV_MODEL}, default tiny]")
    a("--model-name", help=f"the name clients send as \"model\" [{contract.ENV_MODEL_NAME}, default the model]")
    a("--prefill", dest="prefill_strategy", help=f"pipeline | tensor [{contract.ENV_PREFILL_STRATEGY}, default pipeline]")
    a("--decode", dest="decode_strategy", help=f"pipeline | tensor [{contract.ENV_DECODE_STRATEGY}, default tensor]")
    a("--cache-dir", help=f"model conversion cache [{contract.ENV_CACHE_DIR}]")
    a("--drain-timeout", dest="drain_timeout_s", help=f"seconds in-flight requests get after SIGTERM [{contract.ENV_DRAIN_TIMEOUT}, default 30]")
    a("--rendezvous-timeout", dest="rendezvous_timeout_s", help="seconds to wait for every member [FLOTILLA_RENDEZVOUS_TIMEOUT_S, default 600]")
    a("--form-timeout", dest="form_timeout_s", help="seconds one formation may take [FLOTILLA_FORM_TIMEOUT_S, default 600]")
    a("--live-budget", dest="live_budget_s", help="seconds /health/live stays 200 while not formed [FLOTILLA_LIVE_BUDGET_S, default 1800]")
    a("--max-restarts", help="re-forms allowed per restart window [FLOTILLA_MAX_RESTARTS, default 10]")
    a("--restart-window", dest="restart_window_s", help="seconds [FLOTILLA_RESTART_WINDOW_S, default 600]")
    a("--rendezvous-watch", dest="rendezvous_watch_s", help="seconds between rendezvous membership checks; the member-to-member handshake notices deaths sooner [FLOTILLA_RENDEZVOUS_WATCH_S, default 10]")
    a("--peer-dead-after", dest="peer_dead_after_s", help="seconds of silence before a member counts as dead [FLOTILLA_PEER_DEAD_AFTER_S, default 3]")
    a("--max-tokens-limit", help="largest max_tokens a request may ask for [FLOTILLA_MAX_TOKENS_LIMIT, default 4096]")
    a("--torch-threads", help="torch threads per process [FLOTILLA_TORCH_THREADS, default 1]")
    a("--kv-budget-tokens", help="KV-cache tokens over all running sequences [FLOTILLA_KV_BUDGET_TOKENS, default 16384]")
    a("--max-running", help="batch slots [FLOTILLA_MAX_RUNNING, default 16]")
    a("--engine-stall", dest="engine_stall_s", help="seconds of silence after which a ready engine process counts as wedged [FLOTILLA_ENGINE_STALL_S, default 60]")
    a("--collective-timeout", dest="collective_timeout_s", help="seconds before a silent peer fails the unit [FLOTILLA_COLLECTIVE_TIMEOUT_S, default 30]")
    n = p.add_argument_group("neuron engine (engine=neuron only)")
    n.add_argument("--model-uri", help=f"s3://bucket/prefix of the published checkpoint [{contract.ENV_MODEL_URI}]")
    n.add_argument("--compile-cache-uri", help=f"s3://bucket/prefix for compiled artifacts [{contract.ENV_COMPILE_CACHE_URI}, default none: compile on every start]")
    n.add_argument("--instance-type", help="trn1.32xlarge | trn1n.32xlarge [FLOTILLA_INSTANCE_TYPE, default trn1.32xlarge]")
    n.add_argument("--neuron-model-dir", help="where the checkpoint is fetched [FLOTILLA_NEURON_MODEL_DIR, default /var/cache/flotilla/model]")
    n.add_argument("--neuron-compiled-dir", help="NxD Inference compiled artifacts [FLOTILLA_NEURON_COMPILED_DIR, default /var/cache/flotilla/neuron-compiled]")
    n.add_argument("--seq-len", help="prompt + output tokens (vLLM --max-model-len) [FLOTILLA_NEURON_SEQ_LEN, default 4096]")
    n.add_argument("--batch-size", help="sequences decoded together (vLLM --max-num-seqs) [FLOTILLA_NEURON_BATCH_SIZE, default 8]")
    n.add_argument("--cp-degree", help="context-parallel degree for prefill, or auto [FLOTILLA_NEURON_CP_DEGREE, default auto]")
    n.add_argument("--attention-dp-degree", help="attention data-parallel degree for decode, or auto [FLOTILLA_NEURON_ATTENTION_DP_DEGREE, default auto]")
    n.add_argument("--neuron-engine-port", help=f"leader's vLLM server port on 127.0.0.1 [FLOTILLA_NEURON_ENGINE_PORT, default {contract.NEURON_ENGINE_PORT}]")
    n.add_argument("--neuron-launcher", help="test stand-ins only: program replacing `python3 -m <module>` in the rank's command [FLOTILLA_NEURON_LAUNCHER]")
    return p


# flag dest -> (environment variable, default)
_ENV: dict[str, tuple[str, str | None]] = {
    "unit_id": (contract.ENV_UNIT_ID, "unit0"),
    "revision": (contract.ENV_REVISION, "dev"),
    "cell_id": (contract.ENV_CELL_ID, ""),
    "rendezvous": (contract.ENV_RENDEZVOUS, "static"),
    "peers": (contract.ENV_PEERS, None),
    "rank": (contract.ENV_RANK, None),
    "nodes_per_unit": (contract.ENV_NODES_PER_UNIT, None),
    "bind_host": ("FLOTILLA_BIND_HOST", "0.0.0.0"),
    "api_port": (contract.ENV_PORT, None),
    "dist_port": ("FLOTILLA_DIST_PORT", str(contract.DIST_PORT)),
    "engine": (contract.ENV_ENGINE, "reference"),
    "model": (contract.ENV_MODEL, "tiny"),
    "model_name": (contract.ENV_MODEL_NAME, None),
    "prefill_strategy": (contract.ENV_PREFILL_STRATEGY, "pipeline"),
    "decode_strategy": (contract.ENV_DECODE_STRATEGY, "tensor"),
    "cache_dir": (contract.ENV_CACHE_DIR, None),
    "drain_timeout_s": (contract.ENV_DRAIN_TIMEOUT, "30"),
    "rendezvous_timeout_s": ("FLOTILLA_RENDEZVOUS_TIMEOUT_S", "600"),
    "form_timeout_s": ("FLOTILLA_FORM_TIMEOUT_S", "600"),
    "live_budget_s": ("FLOTILLA_LIVE_BUDGET_S", "1800"),
    "max_restarts": ("FLOTILLA_MAX_RESTARTS", "10"),
    "restart_window_s": ("FLOTILLA_RESTART_WINDOW_S", "600"),
    "peer_dead_after_s": ("FLOTILLA_PEER_DEAD_AFTER_S", "3"),
    "rendezvous_watch_s": ("FLOTILLA_RENDEZVOUS_WATCH_S", "10"),
    "max_tokens_limit": ("FLOTILLA_MAX_TOKENS_LIMIT", "4096"),
    "torch_threads": ("FLOTILLA_TORCH_THREADS", "1"),
    "kv_budget_tokens": ("FLOTILLA_KV_BUDGET_TOKENS", "16384"),
    "max_running": ("FLOTILLA_MAX_RUNNING", "16"),
    "collective_timeout_s": ("FLOTILLA_COLLECTIVE_TIMEOUT_S", "30"),
    "engine_stall_s": ("FLOTILLA_ENGINE_STALL_S", "60"),
    # engine=neuron only
    "model_uri": (contract.ENV_MODEL_URI, None),
    "compile_cache_uri": (contract.ENV_COMPILE_CACHE_URI, None),
    "instance_type": (contract.ENV_INSTANCE_TYPE, "trn1.32xlarge"),
    "neuron_model_dir": ("FLOTILLA_NEURON_MODEL_DIR", "/var/cache/flotilla/model"),
    "neuron_compiled_dir": ("FLOTILLA_NEURON_COMPILED_DIR", "/var/cache/flotilla/neuron-compiled"),
    "seq_len": ("FLOTILLA_NEURON_SEQ_LEN", "4096"),
    "batch_size": ("FLOTILLA_NEURON_BATCH_SIZE", "8"),
    "cp_degree": ("FLOTILLA_NEURON_CP_DEGREE", "auto"),
    "attention_dp_degree": ("FLOTILLA_NEURON_ATTENTION_DP_DEGREE", "auto"),
    "neuron_engine_port": ("FLOTILLA_NEURON_ENGINE_PORT", str(contract.NEURON_ENGINE_PORT)),
    "neuron_launcher": ("FLOTILLA_NEURON_LAUNCHER", None),
}

# engine=neuron: compiling a large model takes far longer than the reference engine's warm-up, so
# a formation may take an hour and /health/live must outlast it (each still overridable).
NEURON_DEFAULTS = {"form_timeout_s": "3600", "live_budget_s": "5400"}


def _int(name: str, raw: str, *, lo: int, hi: int | None = None) -> int:
    try:
        v = int(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not an integer: give a whole number >= {lo}") from None
    if v < lo or (hi is not None and v > hi):
        rng = f"{lo}..{hi}" if hi is not None else f">= {lo}"
        raise SettingsError(f"{name}={v} is out of range: give a value in {rng}")
    return v


def _float(name: str, raw: str, *, lo: float) -> float:
    try:
        v = float(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a number: give seconds as a number >= {lo}") from None
    if not v >= lo or v != v or v == float("inf"):
        raise SettingsError(f"{name}={raw} is out of range: give a finite number >= {lo}")
    return v


def _choice(name: str, raw: str, choices: Sequence[str]) -> str:
    if raw not in choices:
        raise SettingsError(f"{name}={raw!r} is not known: use one of {', '.join(choices)}")
    return raw


def parse_peers(name: str, raw: str) -> tuple[Peer, ...]:
    peers = []
    for item in [s.strip() for s in raw.split(",")]:
        host, sep, port = item.rpartition(":")
        if not item or not sep or not host:
            raise SettingsError(f"{name}: {item!r} is not host:port: list every member as host:port, comma-separated, in rank order")
        peers.append(Peer(host=host, port=_int(f"{name} port of {item}", port, lo=1, hi=65535)))
    if len(set(peers)) != len(peers):
        raise SettingsError(f"{name}={raw!r} lists a member twice: give each member's host:port once")
    return tuple(peers)


def load_settings(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> NodeSettings:
    parser = build_parser()
    return settings_from_args(parser.parse_args(argv), env, parser=parser)


def settings_from_args(ns: argparse.Namespace, env: Mapping[str, str] | None = None, *,
                       parser: argparse.ArgumentParser) -> NodeSettings:
    env = os.environ if env is None else env
    flag_of = {a.dest: a.option_strings[0] for a in parser._actions if a.option_strings}
    raw: dict[str, str | None] = {}
    label: dict[str, str] = {}
    for dest, (var, default) in _ENV.items():
        flag = getattr(ns, dest)
        if flag is not None:
            raw[dest], label[dest] = flag, flag_of[dest]
        elif env.get(var, "") != "":
            raw[dest], label[dest] = env[var], var
        else:
            raw[dest], label[dest] = default, var

    if raw["engine"] == "neuron":
        for dest, default in NEURON_DEFAULTS.items():
            if label[dest] == _ENV[dest][0] and env.get(_ENV[dest][0], "") == "":
                raw[dest] = default

    def req(dest: str) -> str:
        assert raw[dest] is not None
        return raw[dest]  # type: ignore[return-value]

    rendezvous = _choice(label["rendezvous"], req("rendezvous"), RENDEZVOUS)
    peers: tuple[Peer, ...] = ()
    rank: int | None = None
    api_port: int | None = None
    if raw["api_port"] is not None:
        api_port = _int(label["api_port"], req("api_port"), lo=1, hi=65535)
    if rendezvous == "static":
        if not raw["peers"]:
            raise SettingsError(f"{contract.ENV_PEERS} (or --peers) is required with static rendezvous: "
                                "list every member as host:port, comma-separated, in rank order")
        peers = parse_peers(label["peers"], req("peers"))
        if raw["rank"] is None:
            raise SettingsError(f"{contract.ENV_RANK} (or --rank) is required with static rendezvous: "
                                f"give this member's index in the peer list, 0..{len(peers) - 1}")
        rank = _int(label["rank"], req("rank"), lo=0, hi=len(peers) - 1)
        if api_port is not None and api_port != peers[rank].port:
            raise SettingsError(f"{label['api_port']}={api_port} but the peer list gives rank {rank} port "
                                f"{peers[rank].port}: drop the port setting or make them agree")
        api_port = peers[rank].port
        nodes = len(peers)
        if raw["nodes_per_unit"] is not None and _int(label["nodes_per_unit"], req("nodes_per_unit"), lo=1) != nodes:
            raise SettingsError(f"{label['nodes_per_unit']}={raw['nodes_per_unit']} but {len(peers)} peers are listed: "
                                "make them agree or drop the node count")
    else:
        if raw["nodes_per_unit"] is None:
            raise SettingsError(f"{contract.ENV_NODES_PER_UNIT} (or --nodes) is required with ecs rendezvous: "
                                "give the number of members per unit")
        nodes = _int(label["nodes_per_unit"], req("nodes_per_unit"), lo=1, hi=64)
        if api_port is None:
            api_port = contract.NODE_API_PORT
    unit_id = req("unit_id").strip()
    if not unit_id:
        raise SettingsError(f"{label['unit_id']} is empty: give the unit an id such as cell0-unit0")
    revision = req("revision").strip()
    if not revision:
        raise SettingsError(f"{label['revision']} is empty: give the deployment revision (any non-empty string)")
    engine = _choice(label["engine"], req("engine"), ENGINES)
    model = req("model").strip()
    # engine=neuron fetches its checkpoint from the model URI; FLOTILLA_MODEL is not used.
    neuron = _neuron_settings(raw, label, api_port=api_port) if engine == "neuron" else None
    if neuron is None and not model:
        raise SettingsError(f"{label['model']} is empty: use tiny, smollm2 or a checkpoint directory")
    if neuron is None and model not in ("tiny", "smollm2") and not os.path.isdir(model):
        raise SettingsError(f"{label['model']}={model!r} is neither tiny, smollm2 nor an existing "
                            "checkpoint directory: fix the path or pick a built-in model")
    dist_port = _int(label["dist_port"], req("dist_port"), lo=1, hi=65535)
    if dist_port == api_port:
        raise SettingsError(f"{label['dist_port']}={dist_port} equals the HTTP port: give the collectives another port")
    return NodeSettings(
        unit_id=unit_id,
        revision=revision,
        cell_id=req("cell_id").strip(),
        rendezvous=rendezvous,
        peers=peers,
        rank=rank,
        nodes_per_unit=nodes,
        bind_host=req("bind_host"),
        api_port=api_port,
        dist_port=dist_port,
        engine=engine,
        model=model,
        model_name=(raw["model_name"] or "").strip() or os.path.basename(
            (neuron.model_uri if neuron else model).rstrip("/")),
        prefill_strategy=_choice(label["prefill_strategy"], req("prefill_strategy"), STRATEGIES),
        decode_strategy=_choice(label["decode_strategy"], req("decode_strategy"), STRATEGIES),
        cache_dir=raw["cache_dir"],
        drain_timeout_s=_float(label["drain_timeout_s"], req("drain_timeout_s"), lo=0.0),
        rendezvous_timeout_s=_float(label["rendezvous_timeout_s"], req("rendezvous_timeout_s"), lo=1.0),
        form_timeout_s=_float(label["form_timeout_s"], req("form_timeout_s"), lo=1.0),
        live_budget_s=_float(label["live_budget_s"], req("live_budget_s"), lo=1.0),
        max_restarts=_int(label["max_restarts"], req("max_restarts"), lo=0),
        restart_window_s=_float(label["restart_window_s"], req("restart_window_s"), lo=1.0),
        backoff_initial_s=0.5,
        backoff_max_s=30.0,
        peer_poll_s=0.25,
        rendezvous_watch_s=_float(label["rendezvous_watch_s"], req("rendezvous_watch_s"), lo=0.1),
        peer_dead_after_s=_float(label["peer_dead_after_s"], req("peer_dead_after_s"), lo=0.1),
        max_tokens_limit=_int(label["max_tokens_limit"], req("max_tokens_limit"), lo=1),
        torch_threads=_int(label["torch_threads"], req("torch_threads"), lo=1, hi=256),
        kv_budget_tokens=_int(label["kv_budget_tokens"], req("kv_budget_tokens"), lo=16),
        max_running=_int(label["max_running"], req("max_running"), lo=1, hi=4096),
        collective_timeout_s=_float(label["collective_timeout_s"], req("collective_timeout_s"), lo=1.0),
        engine_stall_s=_float(label["engine_stall_s"], req("engine_stall_s"), lo=0.5),
        neuron=neuron,
    )


def _s3_uri(name: str, raw: str) -> str:
    uri = raw.strip()
    try:
        parse_s3_uri(uri)   # the same rule fetch and publish apply
    except ManifestError:
        raise SettingsError(f"{name}={raw!r} is not an S3 URI: give s3://bucket/prefix") from None
    return uri


def _degree(name: str, raw: str) -> int | str:
    if raw.strip() == "auto":
        return "auto"
    try:
        return _int(name, raw, lo=1)
    except SettingsError:
        raise SettingsError(f"{name}={raw!r} is not a degree: give a whole number >= 1 or auto") from None


def _neuron_settings(raw: dict[str, str | None], label: dict[str, str], *, api_port: int) -> NeuronSettings:
    if not raw["model_uri"]:
        raise SettingsError(f"{contract.ENV_MODEL_URI} (or --model-uri) is required with engine=neuron: give the "
                            "s3://bucket/prefix the checkpoint was published to (python -m runtime artifacts publish)")
    instance_type = _choice(label["instance_type"], str(raw["instance_type"]), tuple(sorted(INSTANCES)))
    engine_port = _int(label["neuron_engine_port"], str(raw["neuron_engine_port"]), lo=1, hi=65535)
    if engine_port == api_port:
        raise SettingsError(f"{label['neuron_engine_port']}={engine_port} equals the HTTP port: give vLLM another port")
    for dest in ("neuron_model_dir", "neuron_compiled_dir"):
        if not str(raw[dest]).startswith("/"):
            raise SettingsError(f"{label[dest]}={raw[dest]!r} is not an absolute path: give a directory such as /var/cache/flotilla/...")
    return NeuronSettings(
        model_uri=_s3_uri(label["model_uri"], str(raw["model_uri"])),
        compile_cache_uri=_s3_uri(label["compile_cache_uri"], raw["compile_cache_uri"]) if raw["compile_cache_uri"] else None,
        instance_type=instance_type,
        model_dir=str(raw["neuron_model_dir"]),
        compiled_dir=str(raw["neuron_compiled_dir"]),
        seq_len=_int(label["seq_len"], str(raw["seq_len"]), lo=1),
        batch_size=_int(label["batch_size"], str(raw["batch_size"]), lo=1),
        cp_degree=_degree(label["cp_degree"], str(raw["cp_degree"])),
        attention_dp_degree=_degree(label["attention_dp_degree"], str(raw["attention_dp_degree"])),
        engine_port=engine_port,
        launcher=(raw["neuron_launcher"] or "").strip() or None,
    )
