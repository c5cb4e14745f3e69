"""What unit members report: the unit's state, /health/ready's body, and the formation handshake.

Supervisors exchange MemberStatus over STATUS_PATH (the leader's carries its Offer); the router reads
ReadyBody from /health/ready. Typed here, plain JSON on the wire with exactly these keys and strings.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

# The load figures (Load) and the readers' side of /health/ready live in contract/ready.py: the router
# and `flotilla status` (which must not import runtime/) read bodies with the one parser there.
from contract.ready import Load as Load
from contract.ready import Loading, Wire
from contract.ready import LoadReport as LoadReport
from contract.ready import ReadyReport as ReadyReport
from contract.ready import read_ready as read_ready
from runtime.membership import Role

STATUS_PATH = "/unit/status"  # member-to-member formation handshake (internal)


class UnitState(StrEnum):
    """The unit as one member sees it; the value is /health/ready's `state`."""

    FORMING = "forming"  # rendezvous, waiting for members, or the engine warming up
    READY = "ready"  # formed and serving
    BROKEN = "broken"  # the engine failed (the unit re-forms) or the restart budget is spent
    DRAINING = "draining"  # told to stop: finishing in-flight requests, taking no new ones
    STOPPED = "stopped"  # drained; the process is about to exit


class MemberReport(Wire):
    """A follower as its leader last saw it over STATUS_PATH: the router and `flotilla status` read
    followers through their leader instead of asking every follower themselves."""

    rank: int
    address: str  # host:port of the follower's HTTP server, as rendezvous gave it
    state: str  # a UnitState value, or "unreachable" when the leader's last ask got no answer
    ready: bool
    revision: str  # "" while unreachable
    loading: Loading | None = None  # the follower's own load progress, while its engine loads


class ReadyBody(Wire):
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


class Offer(Wire):
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
