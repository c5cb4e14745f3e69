"""Each unit's state as this router sees it, as JSON lines on stdout (one per cell, every
ready-units interval), so `flotilla status --health-via router-logs` can read unit health from
CloudWatch Logs where the nodes' port cannot be reached (outside the VPC), with no new network path;
and, in the same pass, this router's traffic of the interval (requests it answered or refused, and
those answered 429) as an EMF line: what the scaler reads (docs/scaling.md, "Signals").
"""

from __future__ import annotations

import asyncio
import logging

import contract
from contract.scaling import METRIC_BUSY_REFUSALS, METRIC_REQUESTS, TRAFFIC_EVENT
from runtime import emf, logs
from runtime.router.counters_report import CounterDeltas
from runtime.router.fleet import Fleet
from runtime.router.metrics import RouterMetrics

log = logging.getLogger("flotilla.router.unit_report")
EVENT = "unit_states"


def report(fleet: Fleet) -> list[dict]:
    """One record per cell: {unit: {routable, state, revision, queue_depth, running, in_flight,
    prefill_tokens, max_running, wait_s}} (-1: the unit does not report it). A unit is
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
                "max_running": member.max_running,
                "wait_s": round(member.wait_s, 3),
            }
        elif seen is None:
            units[member.unit] = {"routable": False, "state": "no leader", "revision": member.revision}
    return [logs.record(EVENT, cell=cell, units=units) for cell, units in sorted(cells.items())]


def traffic_totals(metrics: RouterMetrics) -> tuple[float, float]:
    """(requests this router answered or refused, those answered 429) since it started: every
    answer a unit gave plus every request it refused itself ('saturated' is its 429)."""
    total = busy = 0.0
    for family in metrics.routed.collect():
        for sample in family.samples:
            if sample.name.endswith("_total"):
                total += sample.value
                busy += sample.value if sample.labels.get("code") == str(contract.BUSY_STATUS) else 0.0
    for family in metrics.shed.collect():
        for sample in family.samples:
            if sample.name.endswith("_total"):
                total += sample.value
                busy += sample.value if sample.labels.get("reason") == "saturated" else 0.0
    return total, busy


def traffic_line(now: tuple[float, float], before: tuple[float, float], interval_s: float) -> str:
    """This router's traffic since the last line: the fleet-wide [Service] series only, so that the
    scaler sums it over routers, with the event name for a reader of the logs."""
    requests, busy = now[0] - before[0], now[1] - before[1]
    return emf.emf_line(
        {METRIC_REQUESTS: (requests, emf.COUNT), METRIC_BUSY_REFUSALS: (busy, emf.COUNT)},
        properties={"event": TRAFFIC_EVENT, "interval_s": interval_s},
    )


async def report_loop(fleet: Fleet, interval_s: float, metrics: RouterMetrics | None = None) -> None:
    """Every interval: the unit states, the router's counters that moved (runtime/router/counters_report.py)
    and its traffic line for the scaler."""
    counters = CounterDeltas(metrics.registry) if metrics is not None else None
    before = traffic_totals(metrics) if metrics is not None else (0.0, 0.0)
    while True:
        await asyncio.sleep(interval_s)
        try:
            records = report(fleet) + (counters.records() if counters is not None else [])
            lines = [logs.dumps(r) for r in records]
            if metrics is not None:
                now = traffic_totals(metrics)
                lines.append(traffic_line(now, before, interval_s))
                before = now
            emf.write_lines(lines)
        except (OSError, ValueError):  # stdout gone: reporting must never stop routing
            log.exception("writing the unit states failed")
