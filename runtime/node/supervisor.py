"""The unit lifecycle on every member: rendezvous, formation handshake, watch, re-form, drain.

Group semantics (the one place they are spelled out, like LeaderWorkerSet's recreate policy):
- A formation is one attempt to run the unit: the leader offers it (an id and the collectives port)
  only when every follower of the same unit and revision is waiting; each follower then starts its
  worker and the leader its engine, each in a fresh child process (engine_host).
- Any member dying, restarting (new boot id), leaving the deployment, or any engine process
  failing ends the formation on every member: children are killed and the unit re-forms after a
  backoff. More than max_restarts re-forms inside restart_window_s exhausts the budget: the member
  reports broken (liveness fails) and exits 1 so its orchestrator replaces it.
- An engine that can never serve (its process exits with a contract/node_exit.py CANNOT_SERVE status:
  the layout cannot run the model, the model is not published as its manifest says or cannot be read)
  spends no budget: the member logs why in one line and exits at once with that status, so ECS counts
  a failed task within seconds and its deployment circuit breaker stops the rollout (docs/node.md).
- A member is dead when it misses its status polls for peer_dead_after_s, unless the engines show
  every rank alive meanwhile (a completed step on the leader, a command received on a follower:
  _engines_in_step): a slow node is not a dead one. The time counts only while the member asking
  could hear (HeardClock): its own node held up is not its peer's silence.
- A member never forms with a member of another revision.
- SIGTERM drains: not-ready at once, in-flight requests finish within the drain timeout, exit 0.
  A unit drains as a group: when a follower is told to drain (e.g. its task is replaced in a
  rolling update), the leader stops taking requests, lets its in-flight ones finish, then ends the
  formation, which releases the follower; the unit then re-forms with the replacement.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
import uuid
from collections.abc import Awaitable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

import aiohttp
from pydantic import ValidationError

from contract import node_exit
from contract.watch import RoutePrompt
from runtime import emf
from runtime.engines.base import EngineState
from runtime.logs import jlog
from runtime.membership import Member, Membership, Role
from runtime.node import engine_protocol
from runtime.node.engine_config import EngineConfig
from runtime.node.engine_process import EngineProcess
from runtime.node.handshake import (
    STATUS_PATH,
    Load,
    MemberReport,
    MemberStatus,
    Offer,
    ReadyBody,
    UnitState,
)
from runtime.node.metrics import NodeMetrics
from runtime.node.queue_wait import QueueWait
from runtime.node.settings import NodeSettings
from runtime.node.speculation import SpeculationLine, speculation_report
from runtime.rendezvous import Rendezvous, RendezvousError

log = logging.getLogger("flotilla.node")
T = TypeVar("T")
# One deadline for all of a tick's status polls (they run at once): a member slower than this counts
# as not answering for that tick.
STATUS_DEADLINE_S = 1.0
# A wait that ends this much past its own bound means this member was held up (HeardClock): far above
# a loop's ordinary lateness (milliseconds), far below peer_dead_after_s (3 s by default).
HELD_UP_S = 0.5
# Routing keys a leader keeps for its watch streams: a stream that falls further behind (about 50 ms
# of a busy unit's admissions) skips the oldest; the routers then lose only an estimate.
ROUTE_KEYS_KEPT = 256
# A completion prompt a router sent under a routing key: its bytes and tail hash as the router gave them
# (contract.ROUTE_PROMPT_HEADER), its token count as the engine counted it, and its checkpoint hashes
# (contract.ROUTE_MARKS_HEADER; empty when the router sent none).


class CannotServe(Exception):
    """The engine process exited with a CANNOT_SERVE status: the member stops with it (no re-form)."""

    def __init__(self, reason: str, *, exit_code: int) -> None:
        super().__init__(reason)
        self.exit_code = exit_code


class FormationEnded(Exception):
    """The current formation is over; the reason is the message.

    `clean` marks an orderly end (the leader shut the unit down, e.g. it is being replaced in a
    rolling update): the member re-forms without spending its restart budget."""

    def __init__(self, reason: str, *, clean: bool = False) -> None:
        super().__init__(reason)
        self.clean = clean


class HeardClock:
    """The time during which this member could hear its peers: monotonic time less what its own waits
    overran their bounds by. A member whose node was held up itself (its process stopped, its host
    starved) heard nothing meanwhile, and on waking every wait it was in ends at once, past its
    deadline, before any answer is read: that time is its own silence, not its peers'. Counted as
    theirs, it ended the formation of a unit whose every rank was alive (a leader's node stopped for
    longer than peer_dead_after_s re-formed its unit the moment it ran again)."""

    def __init__(self) -> None:
        self.lost = 0.0  # seconds this member's waits ran past their bounds

    def now(self) -> float:
        return time.monotonic() - self.lost

    async def within(self, wait: Awaitable[T], bound_s: float) -> T:
        """`wait`'s result. It is itself bounded by bound_s: when it ends more than HELD_UP_S past that,
        this member was held up, and the whole overrun is lost time (less is a loop's usual lateness)."""
        started = time.monotonic()
        try:
            return await wait
        finally:
            over = time.monotonic() - started - bound_s
            if over > HELD_UP_S:
                self.lost += over


class SlowPeers:
    """Peers whose node misses its status polls past peer_dead_after_s while the engines step together
    (UnitSupervisor._engines_in_step): the unit serves on, but a slow node is a symptom (an overloaded
    host, a loop held up) an operator should see. One `peer_slow` line when it starts, one
    `peer_slow_ended` with how long the node was silent once it answers again."""

    def __init__(self, unit: str, rank: int, clock: HeardClock) -> None:
        self.unit, self.rank, self.clock = unit, rank, clock
        self._since: dict[int, float] = {}  # peer rank -> when its node last answered (clock.now())

    def silent(self, peer: int, last_answer: float) -> None:
        if peer not in self._since:
            self._since[peer] = last_answer
            jlog(
                "peer_slow",
                logging.WARNING,
                logger=log,
                unit=self.unit,
                rank=self.rank,
                peer=peer,
                silent_s=round(self.clock.now() - last_answer, 1),
                detail="its node misses its status polls, but the engines step together: slow, not dead",
            )

    def answered(self, peer: int) -> None:
        since = self._since.pop(peer, None)
        if since is not None:
            silent_s = round(self.clock.now() - since, 1)
            jlog("peer_slow_ended", logger=log, unit=self.unit, rank=self.rank, peer=peer, silent_s=silent_s)


class UnitSupervisor:
    def __init__(self, *, settings: NodeSettings, rendezvous: Rendezvous, metrics: NodeMetrics) -> None:
        self.s = settings
        self.rendezvous = rendezvous
        self.metrics = metrics
        self.boot_id = uuid.uuid4().hex
        self.state = UnitState.FORMING
        self.membership: Membership | None = None
        self.engine: EngineProcess | None = None
        self.formation: str | None = None
        self.offer: Offer | None = None  # leader: the formation on offer
        self.unit_load = engine_protocol.Load(state=EngineState.STARTING)  # followers: the leader's load, relayed
        self.leader_ready = False
        self.draining = False
        self.unit_draining: str | None = None  # leader: why the unit drains for a follower
        self.in_flight = 0
        self.prefill_tokens = 0  # leader: prompt tokens of API requests accepted and not yet at their first token
        # leader: the routing keys of the latest admitted requests (contract.ROUTE_KEY_HEADER), each with
        # its completion prompt's (bytes, tokens, tail, marks) when the router sent one (ROUTE_PROMPT_HEADER),
        # and how many were ever admitted: each watch stream sends those it has not sent yet.
        self.route_keys: collections.deque[tuple[int, RoutePrompt | None]] = collections.deque(maxlen=ROUTE_KEYS_KEPT)
        self.route_keys_seen = 0
        self.queue_wait = QueueWait()  # leader: the API's requests, to tell the wait for a batch slot
        self.speculation_line = SpeculationLine()  # leader: the engine's speculation, a minute's line at a time
        self._reported_wait = (-1.0, -1, 0.0)  # (when, requests held, wait): see reported_wait()
        self.not_ready_since = time.monotonic()
        self.ready_since: float | None = None  # when the unit last became ready (None: not ready now)
        self.started = False  # the unit has been ready (for ready_settle_s) once in this process's life
        self._restarts: collections.deque[float] = collections.deque()
        self._drained = asyncio.Event()
        self._stop = asyncio.Event()
        self._session: aiohttp.ClientSession | None = None
        self._complained: dict[str, float] = {}
        self._joined: set[str] = set()
        self.followers: dict[int, MemberReport] = {}  # leader: each follower as last asked

    # -- what the HTTP server reports ---------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self.membership.rank if self.membership else (self.s.rank if self.s.rank is not None else -1)

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    def ready(self) -> bool:
        if self.draining or self.state is not UnitState.READY or self.engine is None or not self.engine.alive:
            return False
        if self.engine.load.state == EngineState.BROKEN or self.unit_draining:
            return False
        return self.engine.ready.is_set() if self.is_leader else self.leader_ready

    def stalled(self) -> bool:
        """The leader's engine holds running sequences but made no progress (no token, no completed
        step) past its stall bound, progress_stall_s or more on an engine whose recent steps were long
        (contract.ready.stall_bound; a stopped member, a stuck collective). The ready body then says
        not ready, so routers stop sending work here and its streams move (docs/node.md); the leader
        itself still admits: a busy machine's slow step must not turn into refusals."""
        return (
            self.is_leader
            and self.engine is not None
            and self.engine.stalled(self.s.progress_stall_s, self.s.progress_stall_max_s)
        )

    def step_s(self) -> float:
        """The leader's engine's longest recent step (EngineProcess.step_s), to 0.1 s: what routers
        derive a stream's silence bound from. A rounded figure, so a watch line goes out only when it
        moves by a tenth."""
        return round(self.engine.step_s(), 1) if self.is_leader and self.engine is not None else 0.0

    def live(self) -> bool:
        if self.state is UnitState.BROKEN:
            return False
        if self.state is UnitState.FORMING and time.monotonic() - self.not_ready_since > self.s.live_budget_s:
            return False
        return True

    def container_healthy(self) -> bool:
        """What the ECS container health check asks (/health/container), in two phases: false until
        the unit has been ready for ready_settle_s once in this member's life (so a rolling update
        never stops the old revision before the new one serves; the service's health-check grace
        period bounds loading), then the same as live() (a unit re-forming after a member died
        stays healthy for live_budget_s instead of being killed member by member)."""
        self._note_started()
        return self.started and self.live()

    def _note_started(self) -> None:
        if (
            not self.started
            and self.ready_since is not None
            and time.monotonic() - self.ready_since >= self.s.ready_settle_s
        ):
            self.started = True
            jlog("unit_started", unit=self.s.unit_id, rank=self.rank, settle_s=self.s.ready_settle_s)

    def load(self) -> engine_protocol.Load:
        if self.is_leader:
            return self.engine.load if self.engine is not None else engine_protocol.Load(state=EngineState.STARTING)
        return self.unit_load

    def expected_wait(self) -> float | None:
        """Seconds a request arriving now would wait for a batch slot (runtime/node/queue_wait.py)."""
        return self.queue_wait.expected_wait(int(self.load().max_running), time.monotonic())

    def reported_wait(self) -> float:
        """expected_wait() for the ready body, worked out at most every 50 ms while the requests held
        stay the same: every watcher's line asks for it, and it walks every request held."""
        when, held, wait = self._reported_wait
        now = time.monotonic()
        if now - when > 0.05 or held != len(self.queue_wait):
            wait = round(self.expected_wait() or 0.0, 1)  # rounded: a watch line goes out when it changes
            self._reported_wait = (now, len(self.queue_wait), wait)
        return wait

    def effective_state(self) -> UnitState:
        # Between an engine failure and the supervisor's next look, the unit is already broken.
        if self.state is UnitState.READY and self.unit_draining:
            return UnitState.DRAINING
        if self.state is UnitState.READY and not self.ready():
            return UnitState.BROKEN
        return self.state

    def _ready_fields(self) -> dict[str, Any]:
        ld = self.load()
        m = self.membership
        # role and cell: the router routes to leaders only and counts ready units per cell
        # (docs/discovery.md: ECS registers members in Cloud Map without either). members and
        # leader: the router watches leaders only and learns the followers from them.
        members = [self.followers[r] for r in sorted(self.followers)] if self.is_leader else []
        if self.engine is not None and self.engine.ready.is_set():
            # The leader's engine is ready only once every node has loaded: a follower's last word
            # on its load (asked before that) is over.
            members = [f.model_copy(update={"loading": None}) if f.loading else f for f in members]
        leader = f"{m.members[0].host}:{m.members[0].api_port}" if m and m.members and not self.is_leader else ""
        return {
            "ready": self.ready() and not self.stalled(),
            "state": self.effective_state(),
            "unit": self.s.unit_id,
            "revision": self.s.revision,
            "rank": self.rank,
            "world_size": self.s.world_size,
            "role": Role.LEADER if self.is_leader else Role.FOLLOWER,
            "cell": self.s.cell_id,
            "load": Load(
                queue_depth=int(ld.queue_depth),
                running=int(ld.running),
                max_running=int(ld.max_running),
                kv_cache_used=float(ld.kv_cache_used),
                in_flight=self.in_flight if self.is_leader else 0,
                prefill_tokens=self.prefill_tokens if self.is_leader else 0,
                wait_s=self.reported_wait() if self.is_leader else 0.0,
                queue_timeout_s=self.s.queue_timeout_s if self.is_leader else 0.0,
                step_s=self.step_s(),
                prefix_cache_queries=int(ld.prefix_cache_queries),
                prefix_cache_hits=int(ld.prefix_cache_hits),
                prefix_cache_hit_rate=ld.prefix_cache_hits / ld.prefix_cache_queries
                if ld.prefix_cache_queries
                else 0.0,
                **speculation_report(ld) if self.is_leader else {},
            ),
            "members": members,
            "leader": leader,
            "strategies": self.engine.strategies if self.is_leader and self.engine is not None else None,
            # A follower's engine never says ready: it has loaded once its unit is (or went past) ready.
            "loading": self.engine.load_progress()
            if self.engine is not None and self.state is UnitState.FORMING
            else None,
        }

    def note_route_key(self, key: int, prompt: RoutePrompt | None = None) -> None:
        """A request with this routing key (and completion prompt) was admitted (leader)."""
        self.route_keys.append((key, prompt))
        self.route_keys_seen += 1

    def route_keys_since(self, seen: int) -> list[tuple[int, RoutePrompt | None]]:
        """The routing keys admitted after the first `seen` (at most the ROUTE_KEYS_KEPT latest)."""
        new = min(self.route_keys_seen - seen, len(self.route_keys))
        return list(self.route_keys)[-new:] if new > 0 else []

    def ready_body(self) -> ReadyBody:
        return ReadyBody(**self._ready_fields())

    def status_body(self) -> MemberStatus:
        return MemberStatus(
            **self._ready_fields(),
            boot_id=self.boot_id,
            formation=self.formation,
            offer=self.offer,
            draining=self.draining,
            engine_alive=bool(self.engine and self.engine.alive),
            engine_ready=bool(self.engine and self.engine.ready.is_set()),
        )

    def _set_state(self, state: UnitState, **why: Any) -> None:
        if self.draining and state not in (UnitState.DRAINING, UnitState.STOPPED, UnitState.BROKEN):
            return  # once told to drain, a member never reports itself forming or ready again
        if state is not self.state:
            jlog("unit_state", unit=self.s.unit_id, rank=self.rank, old=self.state, new=state, **why)
            if state is not UnitState.READY and self.state is UnitState.READY:
                self._note_started()  # ready long enough before this change counts too
                self.not_ready_since = time.monotonic()
                self.ready_since = None
            elif state is UnitState.READY:
                self.ready_since = time.monotonic()
            self.state = state
        self.metrics.ready.set(1 if self.ready() else 0)

    # -- lifecycle ------------------------------------------------------------------------------------
    async def run(self) -> int:
        """Run until drained (returns 0), the restart budget is exhausted (returns 1) or the engine can
        never serve (returns its contract/node_exit.py CANNOT_SERVE status)."""
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=STATUS_DEADLINE_S))
        try:
            while not self.draining:
                try:
                    self.membership = await self._join()
                    if self.membership.is_leader:
                        await self._lead(self.membership)
                    else:
                        await self._follow(self.membership)
                except CannotServe as e:
                    return self._cannot_serve(e)
                except FormationEnded as e:
                    if self.draining:
                        break
                    if not await self._after_failure(str(e), count=not e.clean):
                        return node_exit.RESTART_BUDGET_EXHAUSTED
                except RendezvousError as e:
                    if self.draining:
                        break
                    if not await self._after_failure(f"rendezvous: {e}"):
                        return 1
            await self._drain()
            return 0
        finally:
            await self._end_formation()
            await self._session.close()

    def _cannot_serve(self, e: CannotServe) -> int:
        """Stop for good: the same settings and model would fail the same way on every re-form. The
        task stops before it is healthy, which ECS's circuit breaker counts (contract/node_exit.py)."""
        self._set_state(UnitState.BROKEN, reason=str(e))
        jlog(
            node_exit.CANNOT_SERVE_EVENT,
            logging.ERROR,
            unit=self.s.unit_id,
            rank=self.rank,
            exit_code=e.exit_code,
            meaning=node_exit.meaning(e.exit_code),
            reason=str(e),
        )
        return e.exit_code

    def _stop_if_engine_cannot_serve(self) -> None:
        code = self.engine.returncode if self.engine is not None else None
        if code in node_exit.CANNOT_SERVE:
            assert self.engine is not None and code is not None
            raise CannotServe(self.engine.failure or f"engine process exited with code {code}", exit_code=code)

    async def _join(self) -> Membership:
        self._set_state(UnitState.FORMING)
        join = asyncio.ensure_future(self.rendezvous.join())
        stop = asyncio.ensure_future(self._stop.wait())
        done, _ = await asyncio.wait(
            {join, stop}, timeout=self.s.rendezvous_timeout_s, return_when=asyncio.FIRST_COMPLETED
        )
        stop.cancel()
        if join not in done:
            join.cancel()
            if self.draining:
                raise FormationEnded("draining")
            raise RendezvousError(f"not every member appeared within {self.s.rendezvous_timeout_s:.0f}s")
        m = join.result()
        if m.revision != self.s.revision or m.unit_id != self.s.unit_id:
            raise RendezvousError("rendezvous returned another unit or revision")
        return m

    async def _after_failure(self, reason: str, *, count: bool = True) -> bool:
        """Count a re-form against the budget; back off. False when the budget is exhausted."""
        await self._end_formation()
        now = time.monotonic()
        if count:
            self._restarts.append(now)
        while self._restarts and now - self._restarts[0] > self.s.restart_window_s:
            self._restarts.popleft()
        self.metrics.reforms.inc()
        n = len(self._restarts)
        if n > self.s.max_restarts:
            self._set_state(UnitState.BROKEN, reason=reason)
            jlog(
                "restart_budget_exhausted",
                logging.ERROR,
                unit=self.s.unit_id,
                rank=self.rank,
                restarts=n,
                window_s=self.s.restart_window_s,
                fix="see earlier unit_reform events; the orchestrator will replace this member",
            )
            return False
        delay = min(self.s.backoff_max_s, self.s.backoff_initial_s * 2 ** max(0, n - 1))
        self._set_state(UnitState.FORMING, reason=reason)
        jlog(
            "unit_reform",
            logging.WARNING,
            unit=self.s.unit_id,
            rank=self.rank,
            reason=reason,
            restarts_in_window=n,
            backoff_s=delay,
        )
        try:
            await asyncio.wait_for(self._stop.wait(), delay)
        except asyncio.TimeoutError:
            pass
        return True

    async def _end_formation(self) -> None:
        self.offer = None
        self.formation = None
        self.followers = {}  # no longer current: the next formation's handshake asks them again
        self.leader_ready = False
        self.unit_draining = None
        if self.engine is not None:
            await self.engine.kill_and_wait()
            self.engine = None
        self.metrics.ready.set(0)

    async def _status(self, member: Member) -> MemberStatus | None:
        """The member's handshake status, or None when it does not answer (or not in this shape)."""
        assert self._session is not None
        try:
            async with self._session.get(f"http://{member.host}:{member.api_port}{STATUS_PATH}") as r:
                if r.status != 200:
                    return None
                body = await r.json()
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            return None
        try:
            return MemberStatus.from_dict(body)
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(x) for x in first["loc"]) or "body"
            self._complain(
                member,
                f"answers {STATUS_PATH} in another shape ({where}: {first['msg']})",
                unit=self.s.unit_id,
                rank=self.rank,
            )
            return None

    async def _statuses(self, members: Sequence[Member]) -> list[MemberStatus | None]:
        """Every member's status, asked all at once under one deadline: a slow member costs the tick
        at most STATUS_DEADLINE_S, however many members the unit has (None: no answer in time)."""
        polls = [asyncio.ensure_future(self._status(f)) for f in members]
        if not polls:
            return []
        _, late = await asyncio.wait(polls, timeout=STATUS_DEADLINE_S)
        for p in late:
            p.cancel()
        await asyncio.gather(*late, return_exceptions=True)
        return [None if p in late else p.result() for p in polls]

    def _note_follower(self, member: Member, st: MemberStatus | None) -> None:
        """Keep the leader's last word on a follower for its ready body (router, `flotilla status`)."""
        self.followers[member.rank] = MemberReport(
            rank=member.rank,
            address=f"{member.host}:{member.api_port}",
            state=st.state.value if st else "unreachable",
            ready=bool(st and st.ready),
            revision=st.revision if st else "",
            loading=st.loading if st else None,
        )

    def _compatible(self, st: MemberStatus, member: Member, m: Membership) -> bool:
        if st.unit != m.unit_id:
            problem = f"belongs to unit {st.unit!r}"
        elif st.revision != m.revision:
            problem = f"runs revision {st.revision!r}, this unit is {m.revision!r}"
        elif st.rank != member.rank or st.world_size != m.world_size:
            return False  # not joined yet, or its view of the unit is a step behind: ask again later
        else:
            return True
        self._complain(member, problem, unit=m.unit_id, rank=m.rank)
        return False

    def _complain(self, member: Member, problem: str, *, unit: str, rank: int) -> None:
        """Log a member this one refuses to form with, at most every 10 s per member and problem."""
        key = f"{member.host}:{member.api_port}:{problem}"
        if time.monotonic() - self._complained.get(key, -1e9) > 10:
            self._complained[key] = time.monotonic()
            jlog(
                "refusing_member",
                logging.ERROR,
                unit=unit,
                rank=rank,
                member=f"{member.host}:{member.api_port}",
                expected_rank=member.rank,
                problem=problem,
                fix="every member of a unit must run the same revision and rendezvous settings",
            )

    async def _watch_rendezvous(self, m: Membership, last: list[float]) -> None:
        if time.monotonic() - last[0] >= self.s.rendezvous_watch_s:
            last[0] = time.monotonic()
            if await self.rendezvous.changed(m):
                raise FormationEnded("membership changed")

    async def _tick(self) -> None:
        try:
            await asyncio.wait_for(self._stop.wait(), self.s.peer_poll_s)
        except asyncio.TimeoutError:
            pass
        if self.draining:
            raise FormationEnded("draining")

    # -- leader -----------------------------------------------------------------------------------
    async def _lead(self, m: Membership) -> None:
        followers = m.members[1:]
        self.followers = {}
        boot_ids: dict[int, str] = {}
        last_rdv = [time.monotonic()]
        while len(boot_ids) < len(followers):  # every follower alive, compatible and waiting
            boot_ids = {}
            for f, st in zip(followers, await self._statuses(followers)):
                self._note_follower(f, st)
                if st and self._compatible(st, f, m) and st.formation is None and not st.draining:
                    boot_ids[f.rank] = st.boot_id
            if len(boot_ids) < len(followers):
                await self._watch_rendezvous(m, last_rdv)
                await self._tick()
        formation = uuid.uuid4().hex[:12]
        self.formation = formation
        self.offer = Offer(formation=formation, dist_port=m.dist_port, boot_ids=boot_ids)
        jlog("formation_offered", unit=m.unit_id, formation=formation, world_size=m.world_size)
        self.engine = EngineProcess(config=EngineConfig.from_settings(self.s, m))
        await self.engine.start()
        started = time.monotonic()
        clock = HeardClock()  # a follower's silence counts only while this node could hear it
        last_ok = {f.rank: clock.now() for f in followers}
        slow = SlowPeers(m.unit_id, self.rank, clock)
        drain_until = 0.0
        while True:
            if not self.engine.alive:
                self._stop_if_engine_cannot_serve()
                raise FormationEnded(f"engine process ended: {self.engine.load.detail}")
            if self.engine.load.state == EngineState.BROKEN:
                raise FormationEnded(f"engine broken: {self.engine.load.detail}")
            if self.engine.ready.is_set():
                # A ready engine reports its load ten times a second; silence means it is wedged.
                stalled = time.monotonic() - self.engine.last_report
                if stalled > self.s.engine_stall_s:
                    raise FormationEnded(f"engine process silent for {stalled:.0f}s (wedged)")
                # It reports, but holds work and makes no progress (no token, no completed step): out
                # of routing since the progress stall bound (stalled()); this long, it will not come
                # back by itself (a collective stuck without a timeout, a request the engine lost), so
                # the unit re-forms.
                hung = self.engine.held_without_progress_s()
                if hung > self.s.engine_stall_s:
                    raise FormationEnded(f"engine held requests without progress for {hung:.0f}s (hung)")
                self._set_state(UnitState.READY, formation=formation)
                self.engine.canary(self.s.canary_idle_s)  # an idle unit's engine is still asked now and then
                if line := self.speculation_line.tick(self.engine.load, self.s.cell_id):
                    emf.write_lines([line])
            elif time.monotonic() - started > self.s.form_timeout_s:
                raise FormationEnded(f"engine not ready after {self.s.form_timeout_s:.0f}s")
            for f, st in zip(followers, await clock.within(self._statuses(followers), STATUS_DEADLINE_S)):
                self._note_follower(f, st)
                if st and st.draining and not self.unit_draining and not self.draining:
                    self.unit_draining = f"follower rank {f.rank} is draining"
                    drain_until = time.monotonic() + self.s.drain_timeout_s
                    jlog(
                        "unit_drain_started",
                        unit=m.unit_id,
                        reason=self.unit_draining,
                        in_flight=self.in_flight,
                        timeout_s=self.s.drain_timeout_s,
                    )
                if st and st.boot_id == boot_ids[f.rank] and st.formation == formation:
                    last_ok[f.rank] = clock.now()
                    slow.answered(f.rank)
                elif st and st.boot_id != boot_ids[f.rank]:
                    raise FormationEnded(f"follower rank {f.rank} restarted")
                elif clock.now() - last_ok[f.rank] > self.s.peer_dead_after_s:
                    if not self._engines_in_step():
                        raise FormationEnded(f"follower rank {f.rank} at {f.host}:{f.api_port} is gone")
                    slow.silent(f.rank, last_ok[f.rank])
            if self.unit_draining and (self.in_flight == 0 or time.monotonic() > drain_until):
                raise FormationEnded(f"{self.unit_draining}; {self.in_flight} request(s) unfinished", clean=True)
            await self._watch_rendezvous(m, last_rdv)
            await clock.within(self._tick(), self.s.peer_poll_s)

    # -- follower ---------------------------------------------------------------------------------
    async def _follow(self, m: Membership) -> None:
        leader = m.members[0]
        last_rdv = [time.monotonic()]
        while True:  # wait for an offer naming this boot
            st = await self._status(leader)
            offer = st.offer if st and self._compatible(st, leader, m) else None
            if offer and offer.boot_ids.get(m.rank) == self.boot_id and offer.formation not in self._joined:
                break
            await self._watch_rendezvous(m, last_rdv)
            await self._tick()
        formation = offer.formation
        self._joined.add(formation)  # a formation is joined once: a new attempt needs a new offer
        self.formation = formation
        m = replace(m, dist_port=offer.dist_port)
        jlog("formation_joined", unit=m.unit_id, rank=m.rank, formation=formation)
        self.engine = EngineProcess(config=EngineConfig.from_settings(self.s, m))
        await self.engine.start()
        clock = HeardClock()  # the leader's silence counts only while this node could hear it
        last_seen = clock.now()
        slow = SlowPeers(m.unit_id, m.rank, clock)
        while True:
            if not self.engine.alive:
                self._stop_if_engine_cannot_serve()
                rc = self.engine.returncode
                raise FormationEnded(f"worker process ended: {self.engine.load.detail}", clean=rc == 0)
            st = await clock.within(self._status(leader), STATUS_DEADLINE_S)  # the session's own timeout
            if st is not None:
                if st.formation != formation:
                    raise FormationEnded("the leader ended the formation")
                last_seen = clock.now()
                slow.answered(0)
                self.leader_ready = st.ready
                self.unit_load = engine_protocol.Load(
                    state=EngineState.READY if st.ready else EngineState.STARTING,
                    queue_depth=st.load.queue_depth,
                    running=st.load.running,
                    max_running=st.load.max_running,
                    kv_cache_used=st.load.kv_cache_used,
                )
                unit_state = (
                    UnitState.READY
                    if self.leader_ready
                    else UnitState.DRAINING
                    if st.state is UnitState.DRAINING
                    else UnitState.FORMING
                )
                self._set_state(unit_state, formation=formation)
            elif self._engines_in_step():  # the leader's node is slow to answer, but its engine drives ours
                if clock.now() - last_seen > self.s.peer_dead_after_s:
                    slow.silent(0, last_seen)
            elif clock.now() - last_seen > self.s.peer_dead_after_s:
                raise FormationEnded(f"leader {leader.host}:{leader.api_port} is gone")
            else:
                self.leader_ready = False
                self._set_state(UnitState.FORMING, formation=formation)
            await self._watch_rendezvous(m, last_rdv)
            await clock.within(self._tick(), self.s.peer_poll_s)

    def _engines_in_step(self) -> bool:
        """Whether this member's engine showed, within peer_dead_after_s, that every rank's engine lives:
        the leader's completed a step (every rank's engine takes part in one), a follower's received a
        command from the leader's. Then a peer whose node misses its status polls is a slow node (a
        busy host, a loop held up), not a dead one, and ending the formation would fail every request
        in flight for nothing. Were the peer's node dead, its engine would follow within a second
        (engine_host._exit_when_orphaned) and the collectives fail at once; were its host gone, no step
        or command would come and the status rule applies after peer_dead_after_s. An idle leader's
        engine shows no step (its keep-alives prove nothing on the leader's side): there the status
        rule alone decides."""
        engine = self.engine
        if engine is None or not engine.alive:
            return False
        seen = engine.leader_heard_at if not self.is_leader else engine.stepped_at
        return time.monotonic() - seen <= self.s.peer_dead_after_s

    # -- drain ----------------------------------------------------------------------------------------
    def begin_drain(self) -> None:
        if not self.draining:
            self.draining = True
            self.offer = None  # no new member joins a unit that is going away
            self._set_state(UnitState.DRAINING)
            jlog(
                "drain_started",
                unit=self.s.unit_id,
                rank=self.rank,
                in_flight=self.in_flight,
                timeout_s=self.s.drain_timeout_s,
            )
            self._stop.set()

    def request_finished(self) -> None:
        if self.draining and self.in_flight == 0:
            self._drained.set()

    async def _drain(self) -> None:
        deadline = time.monotonic() + self.s.drain_timeout_s
        if self.is_leader:
            while self.in_flight > 0 and time.monotonic() < deadline:
                self._drained.clear()
                try:
                    await asyncio.wait_for(self._drained.wait(), max(0.0, deadline - time.monotonic()))
                except asyncio.TimeoutError:
                    break
            left = self.in_flight
            if self.engine is not None:
                # In-flight stragglers end with a 503 (an SSE error event once streaming), never as
                # a short answer that looks whole.
                await self.engine.stop(
                    grace_s=10.0,
                    reason="the unit drained for shutdown and this request did not finish within the "
                    f"drain timeout ({self.s.drain_timeout_s:g} s); retry on another unit",
                )
        else:
            # A follower keeps its shard serving while its leader finishes in-flight work, and stops
            # as soon as the leader has released it (or is gone, or moved on to another formation).
            left = 0
            leader = self.membership.members[0] if self.membership and self.membership.members else None
            deadline += 5.0
            last_seen = time.monotonic()
            while self.engine is not None and self.engine.alive:
                if time.monotonic() > deadline:
                    left = 1
                    break
                st = await self._status(leader) if leader is not None else None
                if st is not None:
                    last_seen = time.monotonic()
                    if st.formation != self.formation or self.formation is None:
                        break
                elif time.monotonic() - last_seen > self.s.peer_dead_after_s:
                    break
                try:
                    await asyncio.wait_for(self.engine.exited.wait(), self.s.peer_poll_s)
                except asyncio.TimeoutError:
                    pass
        jlog("drain_finished", unit=self.s.unit_id, rank=self.rank, unfinished=left)
        self._set_state(UnitState.STOPPED)
