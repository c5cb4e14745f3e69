"""The router's view of every unit: discovered endpoints, polled health and load, live outstanding counts.

One poll loop per discovered member reads its /health/ready; a failed poll marks it unready at once.
The balancer picks the least-loaded routable unit; a member is routable only when it leads its unit
(rank 0 / role leader), is ready and not draining. Every ready_units_interval_s the fleet writes the
ReadyUnits EMF lines (per cell and fleet-wide, runtime/emf.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from dataclasses import dataclass

import aiohttp

import contract
from runtime import emf
from runtime.router.admission import AdmissionControl
from runtime.router.discovery import Discovery, DiscoveryError, UnitEndpoint
from runtime.router.settings import RouterSettings

log = logging.getLogger("flotilla.router.fleet")


# Followers are polled this many times less often than leaders: the router needs only their cell and
# a change of leadership from them (a unit that re-forms may elect another rank 0, which is not ready
# before its model loads anyway).
FOLLOWER_POLL_FACTOR = 4


class Unit:
    """One discovered unit member as the router sees it (routable only if it leads). Mutated only
    on the event loop."""

    __slots__ = (
        "url",
        "unit",
        "revision",
        "state",
        "ready",
        "queue_depth",
        "running",
        "kv_cache_used",
        "outstanding",
        "removed",
        "session",
        "poll_task",
        "cell",
        "role",
        "rank",
    )

    def __init__(self, endpoint: UnitEndpoint) -> None:
        self.url = endpoint.url
        self.unit = endpoint.unit or endpoint.url
        self.revision = ""  # from the ready body (contract.ATTR_REVISION)
        self.state = "unknown"  # as the unit reports it, or "unreachable"
        self.ready = False
        self.queue_depth = 0
        self.running = 0
        self.kv_cache_used = 0.0
        self.outstanding = 0  # requests this router has in flight to the unit
        self.removed = False  # gone from discovery; closes once idle
        self.session: aiohttp.ClientSession | None = None
        self.poll_task: asyncio.Task | None = None
        self.cell = ""  # from the ready body (contract.ATTR_CELL); "" locally
        self.role = "unknown"  # leader | follower, from the ready body
        self.rank = -1

    @property
    def routable(self) -> bool:
        return self.ready and not self.removed

    def mark_unready(self, state: str) -> None:
        if self.ready:
            log.warning("unit %s (%s) is no longer routable: %s", self.unit, self.url, state)
        self.ready = False
        self.state = state

    def apply_report(self, status: int, body: dict) -> None:
        """Take a /health/ready answer: routable means it leads (role leader, or rank 0 when the
        body has no role), answered 200 with ready=true and state=ready.

        A follower is never routable; its state reads "follower" (expected, not an error)."""
        rank = body.get("rank")
        self.rank = rank if isinstance(rank, int) and not isinstance(rank, bool) else -1
        role = body.get(contract.ATTR_ROLE)
        leads = role == "leader" if role is not None else self.rank == 0
        if not leads and self.role != "follower":
            log.info(
                "member %s is rank %d of unit %s, a follower: polled, never routed to",
                self.url,
                self.rank,
                body.get(contract.ATTR_UNIT) or self.unit,
            )
        self.role = "leader" if leads else "follower"
        self.cell = str(body.get(contract.ATTR_CELL) or self.cell)
        self.unit = str(body.get(contract.ATTR_UNIT) or self.unit)
        self.revision = str(body.get(contract.ATTR_REVISION) or self.revision)
        if not leads:
            if self.ready:
                log.warning(
                    "member %s of unit %s no longer leads (rank %d); not routable", self.url, self.unit, self.rank
                )
            self.ready = False
            self.state = "follower"
            return
        load = body.get("load") or {}
        self.queue_depth = int(load.get("queue_depth", 0))
        self.running = int(load.get("running", 0))
        self.kv_cache_used = float(load.get("kv_cache_used", 0.0))
        state = str(body.get("state", "unknown"))
        ready = status == 200 and bool(body.get("ready")) and state == "ready"
        if ready and not self.ready:
            log.info("unit %s (%s, revision %s) is routable", self.unit, self.url, self.revision)
        if not ready:
            self.mark_unready(state)
        self.ready = ready
        self.state = state


@dataclass(frozen=True)
class Pick:
    unit: Unit | None
    reason: str  # "ok" | "saturated" | "no_unit"


class Fleet:
    """All known units, kept in step with discovery, each polled on its own loop."""

    def __init__(self, *, settings: RouterSettings, discovery: Discovery) -> None:
        self._settings = settings
        self._discovery = discovery
        self.units: dict[str, Unit] = {}
        self.cells: set[str] = set()  # every cell a member ever reported: a cell whose members
        #                                 all vanished still reports ReadyUnits 0, never silence
        self._ready_units_task: asyncio.Task | None = None
        self._poll_session: aiohttp.ClientSession | None = None
        self._discovery_task: asyncio.Task | None = None
        self._closing = False
        self.discovery_errors = 0
        self.admission: AdmissionControl | None = None  # an operator's fleet-wide limit (flotilla shed)

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

    async def close(self) -> None:
        self._closing = True
        tasks = [
            t for t in [self._discovery_task, self._ready_units_task] + [u.poll_task for u in self.units.values()] if t
        ]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for unit in self.units.values():
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
            log.warning("%s; keeping the last %d known units", exc, len(self.units))
            return
        self.apply_endpoints(endpoints)

    def apply_endpoints(self, endpoints: list[UnitEndpoint]) -> None:
        wanted = {e.url: e for e in endpoints}
        for url, endpoint in wanted.items():
            unit = self.units.get(url)
            if unit is None:
                unit = Unit(endpoint)
                unit.session = self._new_unit_session()
                self.units[url] = unit
                log.info("discovered unit %s at %s", unit.unit, url)
                unit.poll_task = asyncio.create_task(self._poll_loop(unit), name=f"poll {url}")
            elif unit.removed:
                unit.removed = False  # came back before its old session was closed
                log.info("unit at %s is back in discovery", url)
        for url, unit in list(self.units.items()):
            if url not in wanted and not unit.removed:
                log.info("unit %s at %s left discovery; no new requests go there", unit.unit, url)
                unit.removed = True
                self.retire_if_idle(unit)

    def retire_if_idle(self, unit: Unit) -> None:
        """A unit gone from discovery is closed once its last in-flight request ends."""
        if not unit.removed or unit.outstanding or self._closing:
            return
        if unit.poll_task is not None:
            unit.poll_task.cancel()
            unit.poll_task = None
        if self.units.get(unit.url) is unit:
            del self.units[unit.url]
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

    # --- polling -----------------------------------------------------------------------------
    async def _poll_loop(self, unit: Unit) -> None:
        base = self._settings.poll_interval_s
        while True:  # cancelled by retire_if_idle or close
            started = time.monotonic()
            await self.poll_once(unit)
            interval = base * FOLLOWER_POLL_FACTOR if unit.role == "follower" else base
            await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))

    async def poll_once(self, unit: Unit) -> None:
        assert self._poll_session is not None
        try:
            async with self._poll_session.get(unit.url + contract.NODE_READY_PATH) as resp:
                raw = await resp.read()
                status = resp.status
            body = json.loads(raw) if raw else {}
            if not isinstance(body, dict):
                raise ValueError("readiness body is not a JSON object")
        except asyncio.CancelledError:
            raise
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            unit.mark_unready("unreachable")
            log.debug("poll of %s failed: %r", unit.url, exc)
            return
        except ValueError as exc:
            unit.mark_unready("bad_health_body")
            log.warning("unit at %s answered %s with an unreadable body: %s", unit.url, contract.NODE_READY_PATH, exc)
            return
        unit.apply_report(status, body)
        if unit.cell:
            self.cells.add(unit.cell)

    # --- balancing ---------------------------------------------------------------------------
    def saturated(self, unit: Unit) -> bool:
        s = self._settings
        max_outstanding, max_queue = s.max_outstanding_per_unit, s.max_queue_depth
        if self.admission is not None:
            max_outstanding, max_queue = self.admission.caps(max_outstanding, max_queue)
        return unit.outstanding >= max_outstanding or unit.queue_depth >= max_queue

    def pick(self, exclude: tuple[Unit, ...] = ()) -> Pick:
        """The least-loaded routable unit: reported queue + running plus this router's outstanding.

        KV-cache use breaks ties, then chance (so idle units share a burst instead of the first one
        in the table taking it all before the next poll).
        """
        best: Unit | None = None
        best_key: tuple[float, float, float] | None = None
        any_routable = False
        for unit in self.units.values():
            if not unit.ready or unit.removed or unit in exclude:
                continue
            any_routable = True
            if self.saturated(unit):
                continue
            key = (unit.queue_depth + unit.running + unit.outstanding, unit.kv_cache_used, random.random())
            if best_key is None or key < best_key:
                best, best_key = unit, key
        if best is not None:
            return Pick(best, "ok")
        return Pick(None, "saturated" if any_routable else "no_unit")

    def routable_count(self) -> int:
        return sum(1 for u in self.units.values() if u.routable)

    # --- ReadyUnits (EMF) --------------------------------------------------------------------
    def ready_units(self) -> tuple[dict[str, int], int]:
        """Routable units per cell (every cell ever seen, 0 included) and fleet-wide."""
        per_cell = dict.fromkeys(self.cells, 0)
        for u in self.units.values():
            if u.routable and u.cell:
                per_cell[u.cell] = per_cell.get(u.cell, 0) + 1
        return per_cell, self.routable_count()

    def write_ready_units(self) -> None:
        per_cell, fleet = self.ready_units()
        emf.write_lines(emf.ready_units_lines(per_cell=per_cell, fleet=fleet))

    async def _ready_units_loop(self) -> None:
        while True:
            await asyncio.sleep(self._settings.ready_units_interval_s)
            try:
                self.write_ready_units()
            except (OSError, ValueError):  # stdout gone: metrics must never stop routing
                log.exception("writing the ReadyUnits metric failed")
