"""What unit members report: the unit's state, /health/ready's body, and the formation handshake.

Supervisors exchange MemberStatus over STATUS_PATH (the leader's carries its Offer); the router reads
ReadyBody from /health/ready. Typed here, plain JSON on the wire with exactly these keys and strings.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
)

from runtime.membership import Role

STATUS_PATH = "/unit/status"  # member-to-member formation handshake (internal)


class UnitState(StrEnum):
    """The unit as one member sees it; the value is /health/ready's `state`."""

    FORMING = "forming"  # rendezvous, waiting for members, or the engine warming up
    READY = "ready"  # formed and serving
    BROKEN = "broken"  # the engine failed (the unit re-forms) or the restart budget is spent
    DRAINING = "draining"  # told to stop: finishing in-flight requests, taking no new ones
    STOPPED = "stopped"  # drained; the process is about to exit


class _Wire(BaseModel):
    # Keys a newer member adds are ignored, so members of two revisions can still tell each other
    # which revision they run (and refuse to form).
    model_config = ConfigDict(frozen=True, extra="ignore")

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    @classmethod
    def from_dict(cls, d: Any) -> Any:
        """Raises pydantic.ValidationError (a ValueError) when `d` is not this shape."""
        return cls.model_validate(d)


class Load(_Wire):
    queue_depth: int = 0
    running: int = 0
    max_running: int = 0
    kv_cache_used: float = 0.0
    # Leader: API requests accepted and not finished, counted as they arrive and end (the engine's
    # queue_depth and running come ten times a second); what routers balance on. 0 on followers.
    in_flight: int = 0
    # Leader: prompt tokens of those requests not yet at their first token, counted like in_flight:
    # the prefill ahead of a new request, on which routers estimate its time to first token
    # (docs/routing.md). Whole prompts: the part a unit's prefix cache holds is not known at arrival.
    prefill_tokens: int = 0
    # Leader: seconds a request arriving now would wait for a batch slot (0.0 with a slot free or when
    # it cannot be told), and the queue timeout past which the leader refuses it at once (429). A
    # router sends nothing to a leader whose wait is past its timeout. 0.0 on followers.
    wait_s: float = 0.0
    queue_timeout_s: float = 0.0
    # The engine's prefix cache since it started, in prompt tokens (vLLM's vllm:prefix_cache_queries
    # and vllm:prefix_cache_hits): every admitted prompt token is queried, every token whose KV came
    # from the cache is a hit. hit_rate = hits / queries (0 before any query).
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    prefix_cache_hit_rate: float = 0.0


class Loading(_Wire):
    """A member's engine while it loads (docs/node.md): the phase (runtime.engines.base.LoadPhase),
    bytes on disk of the phase's total where the phase moves bytes (0 of 0 where it cannot count),
    and seconds in the phase. A load that is moving changes one of the three."""

    phase: str
    done_bytes: int = 0
    total_bytes: int = 0
    phase_s: float = 0.0


class MemberReport(_Wire):
    """A follower as its leader last saw it over STATUS_PATH: the router and `flotilla status` read
    followers through their leader instead of asking every follower themselves."""

    rank: int
    address: str  # host:port of the follower's HTTP server, as rendezvous gave it
    state: str  # a UnitState value, or "unreachable" when the leader's last ask got no answer
    ready: bool
    revision: str  # "" while unreachable
    loading: Loading | None = None  # the follower's own load progress, while its engine loads


class ReadyBody(_Wire):
    """/health/ready's body; the router routes to members whose role is leader (docs/node.md)."""

    ready: bool
    state: UnitState
    unit: str  # contract.ATTR_UNIT
    revision: str  # contract.ATTR_REVISION
    rank: int  # -1 before rendezvous ranked this member
    world_size: int
    role: Role  # contract.ATTR_ROLE
    cell: str  # contract.ATTR_CELL: FLOTILLA_CELL_ID, "" locally
    load: Load
    # contract.ATTR_MEMBERS: the leader's followers (empty on a follower and before rendezvous);
    # contract.ATTR_LEADER: a ranked follower's leader as host:port ("" on the leader).
    members: list[MemberReport] = []
    leader: str = ""
    # The leader's engine once ready: the prefill/decode strategies in use, how they were chosen
    # and the formation's timings behind the choice (runtime.engines.calibrate); None otherwise.
    strategies: dict[str, Any] | None = None
    # This member's engine while it loads (compile, fetch, load, warm-up), None otherwise: a unit
    # that takes many minutes to load is seen moving, not stuck.
    loading: Loading | None = None


class Offer(_Wire):
    """The leader's offer of one formation; a follower joins it when its boot id is named."""

    formation: str
    dist_port: int
    boot_ids: dict[int, str]  # follower rank -> the boot id it had when the offer was made (JSON: "1": ...)


class MemberStatus(ReadyBody):
    """STATUS_PATH's body: the member's ready body plus where it is in the handshake."""

    boot_id: str  # new each process start: a restarted member is a different member
    formation: str | None  # the formation this member is part of, None while waiting
    offer: Offer | None  # leader: the formation on offer
    draining: bool
    engine_alive: bool
    engine_ready: bool


# --- reading a ready body --------------------------------------------------------------------------
# What readers (the router, `flotilla status`) take from a member's /health/ready or a watch line.
# Lenient where members of other revisions differ, strict where a body cannot be used: a member of
# an older revision sends no role (rank 0 leads) and none of the newer keys; a watch line for a load
# change carries only `load` (and `keys`). Values convert as int() / float() / bool() / str() would;
# one that does not (a load figure that is a list, a rank of "x") makes the body unreadable.


def _as(kind: type) -> Any:
    def convert(v: Any) -> Any:
        try:
            return kind(v)
        except (TypeError, ValueError) as e:  # pydantic reports ValueErrors only
            raise ValueError(f"{v!r} is not {kind.__name__}: {e}") from None

    return BeforeValidator(convert)


def _text(v: Any) -> str:
    return str(v) if v else ""  # null, "" and 0 all mean "not said": the reader keeps what it knew


def _rank(v: Any) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else -1  # anything else: not ranked


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


_Int = Annotated[int, _as(int)]
_Float = Annotated[float, _as(float)]


class LoadReport(BaseModel):
    """A leader's `load` as a router reads it; -1: an older revision does not say."""

    model_config = ConfigDict(extra="ignore")

    in_flight: _Int = -1
    queue_depth: _Int = 0
    running: _Int = 0
    max_running: _Int = 0
    kv_cache_used: _Float = 0.0
    wait_s: _Float = 0.0
    queue_timeout_s: _Float = 0.0
    prefill_tokens: _Int = -1


class ReadyReport(BaseModel):
    """A ready body (or a watch line) as readers take it. `state` None: a load-only watch line."""

    model_config = ConfigDict(extra="ignore")

    ready: Annotated[bool, BeforeValidator(bool)] = False
    state: Annotated[str | None, BeforeValidator(lambda v: None if v is None else str(v))] = None
    unit: Annotated[str, BeforeValidator(_text)] = ""
    revision: Annotated[str, BeforeValidator(_text)] = ""
    cell: Annotated[str, BeforeValidator(_text)] = ""
    rank: Annotated[int, BeforeValidator(_rank)] = -1
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
