"""/health/ready's body as its readers take it: the router (runtime/router) and `flotilla status`
(ops/fleet.py) read every member's body with read_ready here, and the node writes it
(runtime/node/handshake.py ReadyBody). Lenient where members of other revisions differ, strict
where a body cannot be used. Each fact a body carries is declared once here: a loading engine's
progress (Loading, which the engine itself makes and sends its node) and a member's load (Load, which
routers read as LoadReport and load_figures, both derived from it)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    create_model,
)


class Wire(BaseModel):
    """The node's wire models: frozen, and keys a newer member adds are ignored, so members of two
    revisions can still tell each other which revision they run (and refuse to form)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    @classmethod
    def from_dict(cls, d: Any) -> Any:
        """Raises pydantic.ValidationError (a ValueError) when `d` is not this shape."""
        return cls.model_validate(d)


# --- a loading engine's progress -------------------------------------------------------------------


class LoadPhase(StrEnum):
    """Where a starting engine is in its load; the value is the ready body's `loading.phase`. The
    neuron engine's loop (runtime/engines/neuron/loop_wire.py, standard library only) spells the
    phases it reports itself: a test keeps them values of this."""

    FETCH_MODEL = "fetch_model"  # weights from S3 to local disk (bytes counted)
    FETCH_COMPILED = "fetch_compiled"  # compiled artifacts from the compile cache (bytes counted)
    COMPILE = "compile"  # no cached compile: NxD Inference traces and compiles (not counted)
    LOAD = "load"  # this node's ranks: weights sharded and put on the NeuronCores (not counted)
    WARMUP = "warmup"  # one forward per compiled model, across every node of the unit (not counted)
    JOIN = "join"  # loaded; waiting for the unit's other nodes to load


class Loading(Wire):
    """A member's engine while it loads (docs/node.md), so a long load is seen moving: the phase,
    bytes on disk of the phase's total where the phase moves bytes (0 of 0 where it cannot count),
    and seconds in the phase. The one type from the engine to the reader: the engine makes it
    (runtime/engines/neuron/loading.py), its process sends it to the node as the engine protocol's
    "progress" line (runtime/node/engine_protocol.py), the node puts it in its ready body, and readers
    take it back from there. A phase this revision does not know (a newer member's) makes a reader
    drop the body's `loading`, never the body (ReadyReport.loading)."""

    phase: LoadPhase
    done_bytes: int = 0
    total_bytes: int = 0
    phase_s: float = 0.0


# --- a member's load -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Routed:
    """Marks a Load figure routers route on: LoadReport.figures and load_figures give it, in Load's
    order, and the router keeps it per leader (runtime/router/fleet.py Member). `unsaid` is what a
    router takes when a member leaves the figure out: the figure's default, or -1 where a revision
    before the figure must be told from a member that has none."""

    unsaid: int | float | None = None


ROUTED = Routed()


class Load(Wire):
    """A member's `load` as it writes it in its ready body and watch lines (0 where it has nothing to
    say: a follower, an engine that does not count): each figure declared once, here. Readers take it
    as LoadReport and load_figures (below), both derived from these fields; the figures marked Routed
    are those routers route on."""

    queue_depth: Annotated[int, ROUTED] = 0
    running: Annotated[int, ROUTED] = 0
    max_running: Annotated[int, ROUTED] = 0
    kv_cache_used: Annotated[float, ROUTED] = 0.0
    # Leader: API requests accepted and not finished, counted as they arrive and end (the engine's
    # queue_depth and running come ten times a second); what routers balance on. 0 on followers.
    in_flight: Annotated[int, Routed(unsaid=-1)] = 0
    # Leader: prompt tokens of those requests not yet at their first token, counted like in_flight:
    # the prefill ahead of a new request, on which routers estimate its time to first token
    # (docs/routing.md). Whole prompts: the part a unit's prefix cache holds is not known at arrival.
    prefill_tokens: Annotated[int, Routed(unsaid=-1)] = 0
    # Leader: seconds a request arriving now would wait for a batch slot (0.0 with a slot free or when
    # it cannot be told), and the queue timeout past which the leader refuses it at once (429). A
    # router sends nothing to a leader whose wait is past its timeout. 0.0 on followers.
    wait_s: Annotated[float, ROUTED] = 0.0
    queue_timeout_s: Annotated[float, ROUTED] = 0.0
    # The engine's prefix cache since it started, in prompt tokens (vLLM's vllm:prefix_cache_queries
    # and vllm:prefix_cache_hits): every admitted prompt token is queried, every token whose KV came
    # from the cache is a hit. hit_rate = hits / queries (0 before any query).
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    prefix_cache_hit_rate: float = 0.0
    # Leader: its engine's longest step in seconds while it held work (the wait between two of its
    # tokens, or for a step that yielded none: EngineProcess._loaded), over the last minute or two
    # (contract.ready.stall_bound): how long a healthy stream of this unit may go without a token.
    # Routers and the leader itself count silence as a hang only past a bound derived from it. 0.0
    # before any step and on followers.
    step_s: Annotated[float, ROUTED] = 0.0
    # Leader: speculative decoding (docs/engine.md): draft tokens verified and kept since the engine
    # started (vLLM's vllm:spec_decode_num_draft_tokens / _num_accepted_tokens), acceptance = kept /
    # verified (0 before any), and the tokens a decoding answer gained per step lately: 1.0 without
    # speculation, more with it. Routers count a unit's answers that much faster (docs/routing.md).
    # 0 on followers and engines that do not say.
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    spec_acceptance_rate: float = 0.0
    tokens_per_step: Annotated[float, ROUTED] = 0.0


# --- how long a unit may stay silent ---------------------------------------------------------------
# Our own rule (docs/node.md, "Gray failures leave routing"): a leader reports step_s, its engine's
# longest step while it held work over the last minute or two: the wait between two of its tokens (a
# decode step, or a step that also prefilled new prompts: the longest gap a healthy client of this
# unit has just seen), or for a step that yielded none (a chunk of a long prompt's prefill). Silence
# counts as a hang only past twice that plus a margin: a busy unit (long prefills of other requests,
# a big batch, a loaded host) is slow, not hung. A setting is the floor (the bound on a unit whose
# steps are short) and another the ceiling, so a unit that reports long steps is still found when it
# hangs.
STALL_STEP_FACTOR = 2.0
STALL_MARGIN_S = 1.0


def stall_bound(floor_s: float, step_s: float, ceiling_s: float) -> float:
    """Seconds of silence past which a unit whose longest recent step took step_s counts as hung:
    STALL_STEP_FACTOR x step_s + STALL_MARGIN_S, at least floor_s, at most ceiling_s (floor_s wins
    over a lower ceiling)."""
    derived = STALL_STEP_FACTOR * max(0.0, step_s) + STALL_MARGIN_S
    return max(floor_s, min(ceiling_s, derived))


# --- reading a ready body --------------------------------------------------------------------------
# What readers (the router, `flotilla status`) take from a member's /health/ready or a watch line.
# Lenient where members of other revisions differ, strict where a body cannot be used: a member of
# an older revision sends no role (rank 0 leads) and none of the newer keys; a watch line for a load
# change carries only `load` (and `keys`). Values convert as int() / float() / bool() / str() would;
# one that does not (a load figure that is a list, a rank of "x") makes the body unreadable.


def _text(v: Any) -> str:
    return str(v) if v else ""  # null, "" and 0 all mean "not said": the reader keeps what it knew


def _known_int(v: Any) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else -1  # anything else: not said


def _listed(v: Any) -> list[Any]:
    if not v:
        return []
    try:
        return list(v)
    except TypeError:
        raise ValueError(f"{v!r} is not a list") from None


def _or_none(v: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    try:
        return handler(v)
    except ValidationError:
        return None


# --- a leader's load as routers read it: derived from Load ------------------------------------------
# (name, kind, unsaid) of each figure marked Routed, in Load's order: what LoadReport.figures and
# load_figures give, and what a router keeps of each leader (runtime/router/fleet.py Member.take_load).
ROUTED_FIGURES: tuple[tuple[str, type, int | float], ...] = tuple(
    (name, info.annotation, info.default if mark.unsaid is None else mark.unsaid)  # type: ignore[misc]
    for name, info in Load.model_fields.items()
    for mark in info.metadata
    if isinstance(mark, Routed)
)
ROUTED_NAMES = tuple(name for name, _, _ in ROUTED_FIGURES)
# A leader's routed figures in ROUTED_NAMES' order (ints and floats as Load declares each).
LoadFigures = tuple[int | float, ...]


class LoadReading(Load):
    """What a reader can ask of a member's `load` beyond its figures (LoadReport, below, is this with
    every figure read leniently)."""

    def figures(self) -> LoadFigures:
        """The routed figures, as load_figures reads them (whole bodies: not the hot path)."""
        return tuple(getattr(self, name) for name in ROUTED_NAMES)

    def given(self, name: str) -> bool:
        """Whether the member sent this figure: a follower or an older revision leaves some out, and
        a reader that shows figures shows those as not said rather than as their default."""
        return name in self.model_fields_set


def _as(kind: type) -> Any:
    def convert(v: Any) -> Any:
        try:
            return kind(v)
        except (TypeError, ValueError) as e:  # pydantic reports ValueErrors only
            raise ValueError(f"{v!r} is not {kind.__name__}: {e}") from None

    return BeforeValidator(convert)


_UNSAID = {name: unsaid for name, _, unsaid in ROUTED_FIGURES}
if TYPE_CHECKING:  # type checkers see the base, which has every name; pydantic the class built from it
    LoadReport = LoadReading
else:
    LoadReport = create_model(
        "LoadReport",
        __base__=LoadReading,
        __module__=__name__,
        __doc__="A member's `load` as readers take it: each of Load's figures converted as int() / float()"
        ' would (a leader that sends "0.5" reports half its KV cache), and a Routed figure the member leaves'
        " out read as its `unsaid`. Built from Load's fields, so a figure added to Load is one readers take.",
        **{
            name: (Annotated[info.annotation, _as(info.annotation)], _UNSAID.get(name, info.default))
            for name, info in Load.model_fields.items()
        },
    )


def _compiled(name: str, source: str) -> Callable[..., Any]:
    """A function built from its source, as collections.namedtuple and dataclasses build theirs: the
    reading of a load-only line, unrolled figure by figure from ROUTED_FIGURES, is what a router runs
    for thousands of lines a second, where a loop over the figures costs it about a microsecond more."""
    namespace: dict[str, Any] = {}
    exec(source, namespace)  # the source is made below from Load's own field names and defaults
    return namespace[name]  # type: ignore[no-any-return]


# load_figures(load) -> LoadFigures: the routed figures read straight from a parsed `load`, each as
# kind(load.get(name, unsaid)): the router takes a load-only watch line this way at a third of the
# typed model's cost (bench/router/ready_parse.py), and a test holds it equal to LoadReport.figures.
load_figures: Callable[[dict[str, Any]], LoadFigures] = _compiled(
    "load_figures",
    "def load_figures(load):\n    g = load.get\n    return ("
    + "".join(f"{kind.__name__}(g({name!r}, {unsaid!r})), " for name, kind, unsaid in ROUTED_FIGURES)
    + ")\n",
)
# take_figures(target, figures): each routed figure to the attribute of its name, in one assignment
# (the router's Member keeps them so; its balancer reads them by name on every pick).
take_figures: Callable[[Any, LoadFigures], None] = _compiled(
    "take_figures",
    "def take_figures(target, figures):\n    " + "".join(f"target.{name}, " for name in ROUTED_NAMES) + "= figures\n",
)


class ReadyReport(BaseModel):
    """A ready body (or a watch line) as readers take it. `state` None: a load-only watch line."""

    model_config = ConfigDict(extra="ignore")

    ready: Annotated[bool, BeforeValidator(bool)] = False
    state: Annotated[str | None, BeforeValidator(lambda v: None if v is None else str(v))] = None
    unit: Annotated[str, BeforeValidator(_text)] = ""
    revision: Annotated[str, BeforeValidator(_text)] = ""
    cell: Annotated[str, BeforeValidator(_text)] = ""
    rank: Annotated[int, BeforeValidator(_known_int)] = -1
    world_size: Annotated[int, BeforeValidator(_known_int)] = -1  # the members the unit forms with
    role: str | None = None  # None: a revision before roles (rank 0 leads)
    load: Annotated[LoadReport, BeforeValidator(lambda v: v or {})] = LoadReport()
    # Routing keys the leader admitted since its last line (balance.KeyHolders), taken as listed.
    keys: Annotated[list[Any], BeforeValidator(_listed)] = []
    # The leader's followers and a follower's leader, as sent: the router takes the usable entries
    # (runtime.router.fleet.Fleet._vouch) and compares the list to the last one to skip repeats.
    members: Any = None
    leader: Any = None
    # Not read by routers: a malformed one is dropped, never the whole body.
    loading: Annotated[Loading | None, WrapValidator(_or_none)] = None

    @property
    def leads(self) -> bool:
        return self.role == "leader" if self.role is not None else self.rank == 0


def read_ready(doc: Any) -> ReadyReport:
    """A parsed ready body or watch line as a ReadyReport; ValueError (naming what is wrong) when it
    is not a JSON object or a field cannot be used."""
    if not isinstance(doc, dict):
        raise ValueError(f"a ready body must be a JSON object, not {type(doc).__name__}")
    try:
        return ReadyReport.model_validate(doc)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise ValueError(f"ready body field {where!r}: {first['msg']}") from None
