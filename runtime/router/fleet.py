"""The router's view of every unit: discovered members, their health and load, live outstanding counts.

The router watches leaders only: one long-lived /health/watch stream per leader brings its ready body
within change_report_s of a change of its load, and at least every keepalive_s (an empty line when
nothing changed); that body lists the leader's followers
as the leader sees them, so followers are not asked at all while their leader vouches for them. A
member is asked once (GET /health/ready) when discovered, and again only while no live leader lists
it. A leader that falls silent for stale_after_s, closes its stream, or turns unready stops taking
new requests at once. The balancer picks among routable leaders by the power of d choices
(runtime/router/balance.py). Every ready_units_interval_s the fleet writes the ReadyUnits EMF lines.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar
from urllib.parse import urlsplit

import aiohttp

import contract
from contract.ready import LoadFigures, ReadyReport, load_figures, read_ready, take_figures
from contract.watch import read_watch_line
from runtime import emf
from runtime.router import balance, overload
from runtime.router.admission import AdmissionControl
from runtime.router.discovery import Discovery, DiscoveryError, MemberEndpoint
from runtime.router.settings import RouterSettings
from runtime.router.watch_stream import WatchStream

log = logging.getLogger("flotilla.router.fleet")


# A member no live leader vouches for (new, re-forming, or whose leader is gone) is asked this many
# times less often than a leader reports: the router needs from it only its role and, from a
# follower, where its leader is.
FOLLOWER_POLL_FACTOR = 4
# Polls (and watch dials) in flight at once. A router that starts in front of 5,000 members would
# otherwise open 5,000 connections at once, time most of them out on its own CPU, and retry them
# all a second later: a storm that never settles.
_CONCURRENT_ASKS = 64
# How often the fleet's mean requests per unit (the cache-aware policy's load bound) is recomputed.
MEAN_LOAD_EVERY_S = 0.05


class _RoutingIndex:
    """The routable units as a list the balancer samples from; rebuilt only after a unit's routability
    changed (load reports, which arrive thousands of times a second, do not touch it)."""

    __slots__ = ("dirty", "mean_at", "mean_load", "ring", "ring_stale", "sent_since_mean", "units")

    def __init__(self) -> None:
        self.dirty = True
        self.units: list[Member] = []
        self.ring: balance.Ring[Member] = balance.Ring([], Member.ring_points)
        self.ring_stale = True  # updated at the first keyed pick after a change of the routable units
        self.mean_load = 0.0  # requests per routable unit, as last computed (for the load bound)
        self.mean_at = -1e9
        self.sent_since_mean = 0  # requests this router sent since then


class Member:
    """One discovered unit member as the router sees it (routable only if it leads). Mutated only
    on the event loop."""

    __slots__ = (
        "url",
        "unit",
        "revision",
        "state",
        "_ready",
        "in_flight",
        "queue_depth",
        "running",
        "max_running",
        "kv_cache_used",
        "prefill_tokens",
        "wait_s",
        "queue_timeout_s",
        "step_s",
        "tokens_per_step",
        "outstanding",
        "outstanding_at_report",
        "sent_tokens",
        "sent_tokens_at_report",
        "_points",
        "reported_at",
        "_removed",
        "session",
        "poll_task",
        "cell",
        "role",
        "rank",
        "watchable",
        "watch",
        "vouched_by",
        "followers",
        "members_seen",
        "wake",
        "_index",
    )

    def __init__(self, endpoint: MemberEndpoint, index: _RoutingIndex | None = None) -> None:
        self.url = endpoint.url
        self.unit = endpoint.unit or endpoint.url
        self.revision = ""  # from the ready body (contract.ATTR_REVISION)
        self.state = "unknown"  # as the unit reports it, or "unreachable" / "silent"
        self._ready = False
        self.in_flight = -1  # reported by leaders of this revision on; -1: use queue_depth + running
        self.queue_depth = self.running = 0
        self.max_running = 0
        self.kv_cache_used = 0.0
        self.prefill_tokens = -1  # reported: prompt tokens accepted, not yet at their first token; -1: not said
        self.wait_s = 0.0  # reported: the wait for a batch slot a request arriving now would have
        self.queue_timeout_s = 0.0  # reported: past this wait the leader refuses (0: it does not say)
        self.step_s = 0.0  # reported: its longest recent step, what a stream's silence bound derives from
        self.tokens_per_step = 0.0  # reported: tokens an answer gains per step (speculation); 0: not said
        self.outstanding = 0  # requests this router has in flight to the unit
        self.outstanding_at_report = 0  # the same count when the last report arrived
        self.sent_tokens = 0  # estimated prompt tokens this router sent to the unit, ever (whole prompts)
        self.sent_tokens_at_report = 0  # the same when the last report arrived
        self._points: tuple[str, list[int]] | None = None  # the unit's ring points, by the name they came from
        self.reported_at = 0.0  # time.monotonic() of the last report (watch line or poll)
        self._removed = False  # gone from discovery; closes once idle
        self.session: aiohttp.ClientSession | None = None  # for requests; leaders only
        self.poll_task: asyncio.Task | None = None  # the member's health loop
        self.cell = ""  # from the ready body (contract.ATTR_CELL); "" locally
        self.role = "unknown"  # leader | follower, from the ready body
        self.rank = -1
        self.watchable = True  # False: the member has no /health/watch (an older revision): poll it
        self.watch: WatchStream | None = None
        self.vouched_by: Member | None = None  # follower: the live leader whose report lists it
        self.followers: set[str] = set()  # leader: URLs of the members its last report listed
        self.members_seen: object = None  # leader: the last `members` value, to skip unchanged ones
        self.wake = asyncio.Event()  # cuts a follower's wait short (its leader went away)
        self._index = index

    @property
    def ready(self) -> bool:
        return self._ready

    @ready.setter
    def ready(self, value: bool) -> None:
        if value != self._ready:
            self._ready = value
            if self._index is not None:
                self._index.dirty = True

    @property
    def removed(self) -> bool:
        return self._removed

    @removed.setter
    def removed(self, value: bool) -> None:
        if value != self._removed:
            self._removed = value
            if self._index is not None:
                self._index.dirty = True

    @property
    def routable(self) -> bool:
        return self._ready and not self._removed

    def ring_points(self) -> list[int]:
        """Its points on the routers' hash ring, from the unit's id (the same in every router)."""
        if self._points is None or self._points[0] != self.unit:
            self._points = (self.unit, balance.ring_points(self.unit))
        return self._points[1]

    def has_free_slot(self) -> bool:
        """A batch slot free by its last report and this router's sends since: a continuation sent
        here starts at once, where a queued one could time out in the unit's queue. True when the
        unit reports no slot count (an older revision)."""
        if self.max_running <= 0:
            return True
        sent_since = max(0, self.outstanding - self.outstanding_at_report)
        return self.queue_depth == 0 and self.running + sent_since < self.max_running

    def mark_unready(self, state: str) -> None:
        if self._ready:
            log.warning("unit %s (%s) is no longer routable: %s", self.unit, self.url, state)
        self.ready = False
        self.state = state

    # A leader's load figures (contract.ready.load_figures, LoadReport.figures), each to the attribute
    # of its name: built from the declaration (contract.ready.Load's Routed figures), so a figure added
    # there is taken here, and a figure without its attribute above fails at the first report.
    take_load: ClassVar[Callable[[Member, LoadFigures], None]] = take_figures

    def apply_report(self, status: int, report: ReadyReport) -> None:
        """Take a ready body (/health/ready or a watch line): routable means it leads (role leader,
        or rank 0 when the body has no role), answered 200 with ready=true and state=ready.

        A follower is never routable; its state reads "follower" (expected, not an error)."""
        self.rank = report.rank
        leads = report.leads
        if not leads and self.role != "follower":
            log.debug(
                "member %s is rank %d of unit %s, a follower: never routed to",
                self.url,
                self.rank,
                report.unit or self.unit,
            )
        self.role = "leader" if leads else "follower"
        self.cell = report.cell or self.cell
        self.unit = report.unit or self.unit
        self.revision = report.revision or self.revision
        if not leads:
            if self._ready:
                log.warning(
                    "member %s of unit %s no longer leads (rank %d); not routable", self.url, self.unit, self.rank
                )
            self.ready = False
            self.state = "follower"
            return
        self.take_load(report.load.figures())
        state = report.state if report.state is not None else "unknown"
        ready = status == 200 and report.ready and state == "ready"
        if state == "ready" and not ready:
            # In state ready but not ready: its engine made no progress past its stall bound (the
            # leader's progress watch, docs/node.md). Named so, not "ready", in logs and errors.
            state = "stalled"
        if ready and not self._ready:
            log.info("unit %s (%s, revision %s) is routable", self.unit, self.url, self.revision)
        if not ready:
            self.mark_unready(state)
        self.ready = ready
        self.state = state


@dataclass(frozen=True)
class Pick:
    unit: Member | None
    reason: str  # "ok" | "saturated" | "no_unit"


class Fleet:
    """All known members, kept in step with discovery; leaders watched, followers learned from them."""

    def __init__(self, *, settings: RouterSettings, discovery: Discovery) -> None:
        self._settings = settings
        self._discovery = discovery
        self.members: dict[str, Member] = {}
        self.cells: set[str] = set()  # every cell a member ever reported: a cell whose members
        #                                 all vanished still reports ReadyUnits 0, never silence
        self._index = _RoutingIndex()
        self._watching: set[Member] = set()  # units with an open watch stream
        self._asks = asyncio.Semaphore(_CONCURRENT_ASKS)
        self._rng = random.Random()
        self._ready_units_task: asyncio.Task | None = None
        self._stale_task: asyncio.Task | None = None
        self._poll_session: aiohttp.ClientSession | None = None
        self._discovery_task: asyncio.Task | None = None
        self._closing = False
        self.discovery_errors = 0
        self.admission: AdmissionControl | None = None  # an operator's fleet-wide limit (flotilla shed)
        # What health costs: polls by the member's role at the time, watch lines received.
        self.polls = {"leader": 0, "follower": 0, "unknown": 0}
        self.watch_lines = 0
        # Cache-aware picks by outcome, ever: to the key's own unit, elsewhere by work, without a key.
        self.routes = {"preferred": 0, "by_work": 0, "unkeyed": 0}
        # The unit that took each routing key's latest request: this router's sends and the keys units
        # report they admitted (from every router).
        self.holders: balance.KeyHolders[Member] = balance.KeyHolders()
        # The last completion prompt this router sent under each key: what a later prompt resends of it.
        self.prompts = balance.KeyPrompts()
        self._routes_reported = (0, 0)  # (preferred, by_work) at the last routing EMF line
        # A line on every change (within `changes`), a heartbeat when nothing changed for `interval`.
        interval, changes = settings.keepalive_s, min(settings.change_report_s, settings.keepalive_s)
        self._watch_request = (
            f"GET {contract.NODE_WATCH_PATH}?interval={interval:g}&changes={changes:g} HTTP/1.0\r\n"
            f"User-Agent: flotilla-router\r\nAccept: application/x-ndjson\r\n\r\n"
        ).encode()

    # --- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        s = self._settings
        self._poll_session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=60),
            timeout=aiohttp.ClientTimeout(total=s.poll_timeout_s, sock_connect=s.connect_timeout_s),
            auto_decompress=False,
        )
        await self.refresh_discovery()
        self._discovery_task = asyncio.create_task(self._discovery_loop(), name="discovery")
        self._ready_units_task = asyncio.create_task(self._ready_units_loop(), name="ready units")
        self._stale_task = asyncio.create_task(self._stale_loop(), name="stale reports")

    async def close(self) -> None:
        self._closing = True
        tasks = [
            t
            for t in [self._discovery_task, self._ready_units_task, self._stale_task]
            + [u.poll_task for u in self.members.values()]
            if t
        ]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for unit in self.members.values():
            if unit.session is not None:
                await unit.session.close()
        if self._poll_session is not None:
            await self._poll_session.close()

    # --- discovery ---------------------------------------------------------------------------
    async def refresh_discovery(self) -> None:
        try:
            endpoints = await asyncio.to_thread(self._discovery.discover)
        except DiscoveryError as exc:
            self.discovery_errors += 1
            log.warning("%s; keeping the last %d known members", exc, len(self.members))
            return
        self.apply_endpoints(endpoints)

    def apply_endpoints(self, endpoints: list[MemberEndpoint]) -> None:
        wanted = {e.url: e for e in endpoints}
        added = False
        for url, endpoint in wanted.items():
            unit = self.members.get(url)
            if unit is None:
                unit = Member(endpoint, self._index)
                self.members[url] = unit
                added = True
                log.debug("discovered member %s of %s", url, unit.unit)
                unit.poll_task = asyncio.create_task(self._member_loop(unit), name=f"health {url}")
            elif unit.removed:
                unit.removed = False  # came back before its old session was closed
                log.info("unit at %s is back in discovery", url)
        for url, unit in list(self.members.items()):
            if url not in wanted and not unit.removed:
                log.info("member %s of %s left discovery; no new requests go there", url, unit.unit)
                unit.removed = True
                self.retire_if_idle(unit)
        if added:  # a leader's next report may now vouch for members discovery had not shown yet
            for unit in self.members.values():
                unit.members_seen = None

    def retire_if_idle(self, unit: Member) -> None:
        """A member gone from discovery is closed once its last in-flight request ends."""
        if not unit.removed or unit.outstanding or self._closing:
            return
        if unit.poll_task is not None:
            unit.poll_task.cancel()  # its finally closes the watch and releases the followers
            unit.poll_task = None
        if self.members.get(unit.url) is unit:
            del self.members[unit.url]
        self._release_followers(unit)
        if unit.vouched_by is not None:
            unit.vouched_by.followers.discard(unit.url)
            unit.vouched_by = None
        session, unit.session = unit.session, None
        if session is not None:
            asyncio.get_running_loop().create_task(session.close())

    def _new_unit_session(self) -> aiohttp.ClientSession:
        s = self._settings
        # One keep-alive pool per unit; its size is the per-unit outstanding cap, so the pool
        # never makes a request wait for a connection (shedding happens before, at the balancer).
        connector = aiohttp.TCPConnector(
            limit=s.max_outstanding_per_unit, limit_per_host=0, ttl_dns_cache=60, keepalive_timeout=30
        )
        return aiohttp.ClientSession(
            connector=connector,
            auto_decompress=False,
            skip_auto_headers=("User-Agent",),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=s.connect_timeout_s),
        )

    async def _discovery_loop(self) -> None:
        while True:
            await asyncio.sleep(self._settings.discovery_interval_s)
            try:
                await self.refresh_discovery()
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug in discovery must not stop routing to known units
                log.exception("discovery pass failed")

    # --- health ------------------------------------------------------------------------------
    async def _member_loop(self, unit: Member) -> None:
        """Watch a leader; leave a vouched follower alone; ask anyone else now and then."""
        s = self._settings
        retry = s.poll_interval_s
        try:
            while True:  # cancelled by retire_if_idle or close
                if unit.role == "leader" and unit.watchable:
                    outcome = await self._watch(unit)
                    if outcome == "lost":  # dead, silent or refused: try again, backing off to 1 s
                        await self._pause(unit, retry)
                        retry = min(retry * 2, s.poll_interval_s * FOLLOWER_POLL_FACTOR)
                    else:
                        retry = s.poll_interval_s
                    continue
                if unit.vouched_by is not None:
                    unit.wake.clear()
                    await unit.wake.wait()  # until its leader stops listing it or goes away
                    continue
                started = time.monotonic()
                await self.poll_once(unit)
                if unit.role == "leader" and unit.watchable:
                    continue  # learned it leads: watch it from now on
                interval = s.poll_interval_s if unit.role == "leader" else s.poll_interval_s * FOLLOWER_POLL_FACTOR
                await self._pause(unit, interval - (time.monotonic() - started))
        finally:
            if unit.watch is not None:
                unit.watch.close("lost")
            self._release_followers(unit)

    @staticmethod
    async def _pause(unit: Member, seconds: float) -> None:
        unit.wake.clear()
        try:
            await asyncio.wait_for(unit.wake.wait(), max(0.0, seconds))
        except asyncio.TimeoutError:
            pass

    async def _watch(self, unit: Member) -> str:
        """Hold the leader's watch stream until it ends; returns why: lost | follower | unsupported."""
        s = self._settings
        parts = urlsplit(unit.url)
        loop = asyncio.get_running_loop()
        proto = WatchStream(self, unit, self._watch_request)
        try:
            async with self._asks:
                await asyncio.wait_for(
                    loop.create_connection(lambda: proto, parts.hostname or "", parts.port or 80), s.connect_timeout_s
                )
        except (OSError, asyncio.TimeoutError) as exc:
            unit.mark_unready("unreachable")
            self._release_followers(unit)
            log.debug("watch of %s failed: %r", unit.url, exc)
            return "lost"
        unit.watch = proto
        unit.reported_at = max(unit.reported_at, time.monotonic())  # the silence clock starts now
        self._watching.add(unit)
        try:
            outcome = await proto.ended
        finally:
            self._watching.discard(unit)
            unit.watch = None
            proto.close(proto.outcome)
        if outcome == "unsupported":
            log.info("member %s has no %s (an older revision): polling it", unit.url, contract.NODE_WATCH_PATH)
            unit.watchable = False
        elif outcome == "lost" and unit.state != "silent":
            # A stream the silence sweep closed keeps that reason: the host still accepts connections
            # (a hung host), which "unreachable" would misstate; a reconnect that fails says so itself.
            unit.mark_unready("unreachable")
        self._release_followers(unit)
        return outcome

    def on_watch_line(self, unit: Member, line: bytes) -> bool:
        """One line of a leader's watch (contract.watch): its ready body, its load alone, or empty when
        nothing changed since the last. False when the member no longer leads (the stream is then closed)."""
        self.watch_lines += 1
        report = None
        try:
            read = read_watch_line(line)
            if read is not None:
                keys, prompts, load, body = read
                note = self.holders.note
                for k in keys:  # routing keys the unit admitted since its last line (balance.KeyHolders)
                    note(k, unit)
                note_prompt = self.prompts.note
                for k, length, tokens, tail, marks in prompts:  # and their prompts (balance.KeyPrompts)
                    note_prompt(k, length, tokens, tail, marks)
                if load is not None:  # only the load changed: the rest of the last body holds
                    unit.take_load(load_figures(load))
                else:  # a whole body: typed (load-only lines stay on the fast path above)
                    report = read_ready(body)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            unit.mark_unready("bad_health_body")
            log.warning("unit at %s sent an unreadable %s line: %r", unit.url, contract.NODE_WATCH_PATH, exc)
            return False
        if report is None:  # a heartbeat or a load: the rest of the last body holds
            unit.reported_at = time.monotonic()
            unit.outstanding_at_report = unit.outstanding
            unit.sent_tokens_at_report = unit.sent_tokens
            return True
        self._take_report(unit, 200 if report.ready else 503, report)
        return unit.role == "leader"

    async def poll_once(self, unit: Member) -> None:
        """Ask a member's /health/ready once (a new member, one no leader vouches for, or a leader
        of an older revision without the watch)."""
        assert self._poll_session is not None
        async with self._asks:
            if unit.vouched_by is not None:
                # Its leader listed it while this ask waited for its turn (a fleet starting: hundreds
                # of members asked at once, a few at a time): there is nothing left to ask.
                return
            self.polls[unit.role if unit.role in self.polls else "unknown"] += 1
            try:
                async with self._poll_session.get(unit.url + contract.NODE_READY_PATH) as resp:
                    raw = await resp.read()
                    status = resp.status
            except asyncio.CancelledError:
                raise
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                unit.mark_unready("unreachable")
                log.debug("poll of %s failed: %r", unit.url, exc)
                return
        try:
            report = read_ready(json.loads(raw) if raw else {})
        except ValueError as exc:
            unit.mark_unready("bad_health_body")
            log.warning("unit at %s answered %s with an unreadable body: %s", unit.url, contract.NODE_READY_PATH, exc)
            return
        self._take_report(unit, status, report)

    def _take_report(self, unit: Member, status: int, report: ReadyReport) -> None:
        unit.apply_report(status, report)
        unit.reported_at = time.monotonic()
        unit.outstanding_at_report = unit.outstanding
        unit.sent_tokens_at_report = unit.sent_tokens
        if unit.cell:
            self.cells.add(unit.cell)
        if unit.role == "leader":
            if unit.session is None:
                unit.session = self._new_unit_session()
            members = report.members
            if members != unit.members_seen:
                self._vouch(unit, members)
        else:
            self._release_followers(unit)
            hint = report.leader
            leader = self.members.get(f"http://{hint}") if isinstance(hint, str) and hint else None
            if leader is not None and leader is not unit and leader.role != "leader":
                leader.wake.set()  # ask the member its follower names as leader now, not in a second

    def _vouch(self, leader: Member, members: object) -> None:
        """The leader's report lists its followers: they need no asking while it stays live."""
        leader.members_seen = members
        listed: set[str] = set()
        for m in members if isinstance(members, list) else []:
            if not isinstance(m, dict):
                continue
            f = self.members.get(f"http://{m.get('address')}")
            if f is None or f is leader or (f.role == "leader" and f.watch is not None):
                continue  # unknown to discovery, or leading a formation of its own (its word wins)
            listed.add(f.url)
            f.vouched_by = leader
            f.role, f.state = "follower", "follower"
            f.ready = False
            rank = m.get("rank")
            f.rank = rank if isinstance(rank, int) else f.rank
            f.unit, f.cell = leader.unit, leader.cell
            f.revision = str(m.get("revision") or f.revision)
        for url in leader.followers - listed:
            f = self.members.get(url)
            if f is not None and f.vouched_by is leader:
                f.vouched_by = None
                f.wake.set()
        leader.followers = listed

    def _release_followers(self, leader: Member) -> None:
        """The leader went away or stopped leading: its followers must be asked again."""
        leader.members_seen = None
        for url in leader.followers:
            f = self.members.get(url)
            if f is not None and f.vouched_by is leader:
                f.vouched_by = None
                f.wake.set()
        leader.followers = set()

    async def _stale_loop(self) -> None:
        """A leader whose reports stopped (a hung host sends no FIN) stops taking new requests once
        its last report is stale_after_s old, found within a fifth of that more; its watch is dropped
        and dialled again (polled members: their next failed poll says the same).

        Only here, never in pick(): after the router's own loop stalled (a long GC pause, a busy
        core) every leader's lines wait unread in their sockets and all would look silent at once.
        A sweep that itself woke late skips its turn: the queued lines are read before the next."""
        stale_after = self._settings.stale_after_s
        period = stale_after / 5
        while True:
            due = time.monotonic() + period
            await asyncio.sleep(period)
            now = time.monotonic()
            if now - due > period:
                continue
            limit = now - stale_after
            for unit in list(self._routable()):
                if unit.reported_at < limit:
                    unit.mark_unready("silent")
            # Also a stream that connected but never spoke (a hung host accepts, then says nothing).
            for unit in list(self._watching):
                if unit.reported_at < limit and unit.watch is not None:
                    unit.mark_unready("silent")
                    unit.watch.close("lost")

    # --- balancing ---------------------------------------------------------------------------
    def saturated(self, unit: Member) -> bool:
        s = self._settings
        max_outstanding, max_queue = s.max_outstanding_per_unit, s.max_queue_depth
        if self.admission is not None:
            max_outstanding, max_queue = self.admission.caps(max_outstanding, max_queue)
        return unit.outstanding >= max_outstanding or unit.queue_depth >= max_queue or overload.full(unit)

    def retry_after_s(self) -> int:
        """Retry-After when every routable unit is saturated: the shortest wait any of them reports
        (runtime/router/overload.py), at least --retry-after."""
        return overload.retry_after_s(self._routable(), self._settings.retry_after_s)

    def _routable(self) -> list[Member]:
        index = self._index
        if index.dirty:
            index.units = [u for u in self.members.values() if u.routable]
            index.ring_stale = True
            index.mean_at = -1e9
            index.dirty = False
        return index.units

    def _mean_load(self, units: list[Member]) -> float:
        """Requests per routable unit: the sum over every unit recomputed at most every
        MEAN_LOAD_EVERY_S (a sum per request would cost at 625 units), plus this router's sends since,
        which the units' own estimates count at once. Without them a burst inside one period met the
        mean of before it: at an idle fleet a bound of 1, so a conversation's second request in the
        burst left its unit although the paper's bound for the requests placed allows it."""
        index = self._index
        now = time.monotonic()
        if now - index.mean_at >= MEAN_LOAD_EVERY_S:
            index.mean_load = sum(balance.estimated_load(u) for u in units) / len(units)
            index.mean_at = now
            index.sent_since_mean = 0
        return index.mean_load + index.sent_since_mean / len(units)

    def pick(self, exclude: tuple[Member, ...] = (), request: balance.RequestKey | None = None) -> Pick:
        """A routable, unsaturated leader by the router's policy (runtime/router/balance.py,
        docs/routing.md); `request` is what the proxy read of the request (without it: the fewest
        requests of a sample). A full scan when sampling finds none, which also tells "every unit
        saturated" (429) from "no unit routable" (503)."""
        units = self._routable()
        if not units:
            return Pick(None, "no_unit")

        def usable(u: Member) -> bool:
            return u not in exclude and u.routable and not self.saturated(u)

        policy = self._settings.balance
        if request is None or policy == "least_requests":
            best = balance.sample_choices(units, usable, self._rng)
        elif policy == "least_work":
            best = balance.least_work(units, usable, self._rng, request.tokens)
        else:
            index = self._index
            if index.ring_stale:
                index.ring.update(units)
                index.ring_stale = False
            holder = self.holders.get(request.key) if request.key is not None else None
            cached = request.cached
            if request.key is not None and request.prompt:
                cached = max(cached, min(request.tokens, self.prompts.cached(request.key, request.prompt)))
            best = balance.by_cache_and_work(
                index.ring,
                units,
                usable,
                self._rng,
                key=request.key,
                tokens=request.tokens,
                cached=cached,
                mean_load=self._mean_load(units),
                holder=holder,
                lead=request.lead_tokens,
            )
            if request.key is None:
                self.routes["unkeyed"] += 1
            elif best is not None:
                preferred = holder or next(index.ring.walk(request.key), None)
                self.routes["preferred" if best is preferred else "by_work"] += 1
                self.holders.note(request.key, best)
                if request.prompt:
                    length, tail, marks = request.prompt_summary
                    self.prompts.note(request.key, length, request.tokens, tail, marks)
        if best is None:
            best = balance.least_loaded(units, usable, self._rng)
        if best is not None:
            if request is not None:
                # Whole, though the unit may hold some of it: a prompt resent before the one it resends
                # has been prefilled there (a burst of one prompt) finds nothing cached, and the unit's
                # next report, within 50 ms, counts it net of what its cache does hold.
                best.sent_tokens += request.tokens
            self._index.sent_since_mean += 1
            return Pick(best, "ok")
        routable = any(u.routable and u not in exclude for u in units)
        return Pick(None, "saturated" if routable else "no_unit")

    def routable_count(self) -> int:
        return len(self._routable())

    def routable_besides(self, exclude: tuple[Member, ...]) -> bool:
        """Whether a routable leader not in `exclude` exists (full or not): somewhere a moving stream
        could go, now or once a slot frees."""
        return any(u not in exclude for u in self._routable())

    def full_units(self, exclude: tuple[Member, ...] = ()) -> list[Member]:
        """Routable leaders, not in `exclude`, without a free batch slot (Member.has_free_slot): the
        units a moving stream must not be sent to yet. A scan of the routable index, not of every member."""
        return [u for u in self._routable() if u not in exclude and not u.has_free_slot()]

    @property
    def watching(self) -> set[Member]:
        return self._watching

    # --- ReadyUnits (EMF) --------------------------------------------------------------------
    def ready_units(self) -> tuple[dict[str, int], int]:
        """Routable units per cell (every cell ever seen, 0 included) and fleet-wide."""
        per_cell = dict.fromkeys(self.cells, 0)
        routable = self._routable()
        for u in routable:
            if u.cell:
                per_cell[u.cell] = per_cell.get(u.cell, 0) + 1
        return per_cell, len(routable)

    def routing_figures(self) -> tuple[float | None, float | None]:
        """Since the last call: the share of keyed requests sent to their key's unit (None: none came);
        now: the busiest routable unit's estimated requests as a percentage of the mean (None: idle)."""
        preferred, by_work = self.routes["preferred"], self.routes["by_work"]
        last_preferred, last_by_work = self._routes_reported
        self._routes_reported = (preferred, by_work)
        keyed = (preferred - last_preferred) + (by_work - last_by_work)
        share = 100.0 * (preferred - last_preferred) / keyed if keyed else None
        loads = [balance.estimated_load(u) for u in self._routable()]
        mean = sum(loads) / len(loads) if loads else 0.0
        return share, (100.0 * max(loads) / mean if mean > 0 else None)

    def write_ready_units(self) -> None:
        per_cell, fleet = self.ready_units()
        lines = emf.ready_units_lines(per_cell=per_cell, fleet=fleet)
        share, busiest = self.routing_figures()
        routing = emf.routing_line(routed_to_preferred_pct=share, busiest_unit_load_pct=busiest)
        emf.write_lines(lines + ([routing] if routing else []))

    async def _ready_units_loop(self) -> None:
        while True:
            await asyncio.sleep(self._settings.ready_units_interval_s)
            try:
                self.write_ready_units()
            except (OSError, ValueError):  # stdout gone: metrics must never stop routing
                log.exception("writing the ReadyUnits metric failed")
