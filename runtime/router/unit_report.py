"""Each unit's state as this router sees it, as JSON lines on stdout (one per cell, every
ready-units interval), so `flotilla status --health-via router-logs` can read unit health from
CloudWatch Logs where the nodes' port cannot be reached (outside the VPC), with no new network path.
"""

from __future__ import annotations

import asyncio
import logging

from prometheus_client import CollectorRegistry

from runtime import emf, logs
from runtime.router.counters_report import CounterDeltas
from runtime.router.fleet import Fleet

log = logging.getLogger("flotilla.router.unit_report")
EVENT = "unit_states"


def report(fleet: Fleet) -> list[dict]:
    """One record per cell: {unit: {routable, state, revision, queue_depth, running, in_flight,
    prefill_tokens}} (-1: the unit does not report it). A unit is
    routable when a member leading it is; a unit whose members answer but none leads is reported
    with the leaderless state, so "not routable" and "not seen" stay different things."""
    cells: dict[str, dict[str, dict]] = {}
    for member in fleet.members.values():
        if member.removed:
            continue
        units = cells.setdefault(member.cell or "", {})
        seen = units.get(member.unit)
        if member.role == "leader":
            units[member.unit] = {
                "routable": member.routable,
                "state": member.state,
                "revision": member.revision,
                "queue_depth": member.queue_depth,
                "running": member.running,
                "in_flight": member.in_flight,
                "prefill_tokens": member.prefill_tokens,
            }
        elif seen is None:
            units[member.unit] = {"routable": False, "state": "no leader", "revision": member.revision}
    return [logs.record(EVENT, cell=cell, units=units) for cell, units in sorted(cells.items())]


async def report_loop(fleet: Fleet, interval_s: float, registry: CollectorRegistry | None = None) -> None:
    """Every interval: the unit states, then the router's counters that moved (runtime/router/counters_report.py)."""
    counters = CounterDeltas(registry) if registry is not None else None
    while True:
        await asyncio.sleep(interval_s)
        try:
            records = report(fleet) + (counters.records() if counters is not None else [])
            emf.write_lines(logs.dumps(r) for r in records)
        except (OSError, ValueError):  # stdout gone: reporting must never stop routing
            log.exception("writing the unit states failed")
