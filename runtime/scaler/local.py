"""The scaler for `make local LOCAL_ARGS="--scaler ..."`: every pass it reads what the router and the
leaders know (each unit's load from its leader, requests and 429s from the router's /metrics), calls
decide(), and starts or drains whole local units (local_units.py). Each decision is one JSON line
(event scaler_decision) on stdout and in <state-dir>/scaler.jsonl.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

import contract
from contract.scaling import DECISION_EVENT, ScalingPolicy
from runtime.scaler.decide import Decision, ScalerMemory, decide
from runtime.scaler.local_units import ACTIVE, DRAINING, PENDING, LocalUnits
from runtime.scaler.signals import FleetSignals, Traffic

# How long a unit that could not start counts against what capacity allows (decide()'s
# `unavailable`): long enough not to retry at once what just failed, short enough to try again.
GIVEN_BACK_S = 120.0


def router_traffic(router_url: str, timeout: float = 2.0) -> tuple[float, float] | None:
    """(requests the router has answered or refused, requests answered 429) since it started, from
    its /metrics: every answer a unit gave (flotilla_router_requests by code) plus every request it
    refused itself (flotilla_router_shed; 'saturated' is its 429). None when it does not answer."""
    try:
        with urllib.request.urlopen(router_url + contract.METRICS_PATH, timeout=timeout) as r:  # noqa: S310
            text = r.read().decode()
    except OSError:
        return None
    total = busy = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "flotilla_router_requests_total":
                total += sample.value
                if sample.labels.get("code") == str(contract.BUSY_STATUS):
                    busy += sample.value
            elif sample.name == "flotilla_router_shed_total":
                total += sample.value
                if sample.labels.get("reason") == "saturated":
                    busy += sample.value
    return total, busy


@dataclass
class LocalScaler:
    units: LocalUnits
    policy: ScalingPolicy
    router_url: str
    interval_s: float = 5.0
    log_path: Path | None = None
    memory: ScalerMemory = field(default_factory=ScalerMemory)
    history: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=64))
    decisions: list[Decision] = field(default_factory=list)
    _last: tuple[float, float, float] | None = None  # (time, requests, 429s) at the previous pass
    _next_at: float = 0.0

    def traffic(self, now: float) -> Traffic:
        seen = router_traffic(self.router_url)
        if seen is None:
            return Traffic(history=tuple(self.history))
        last, self._last = self._last, (now, *seen)
        if last is None or now <= last[0]:
            return Traffic(history=tuple(self.history))
        span = now - last[0]
        rate, busy = (seen[0] - last[1]) / span, (seen[1] - last[2]) / span
        self.history.append((now, rate))
        return Traffic(request_rate=rate, busy_rate=busy, history=tuple(self.history))

    def tick(self, now: float | None = None) -> Decision | None:
        """One pass when its time has come; None otherwise."""
        now = time.monotonic() if now is None else now
        self.units.poll(now)
        if now < self._next_at:
            return None
        self._next_at = now + self.interval_s
        signals = FleetSignals(
            now_s=now,
            active=self.units.loads(),
            pending=len(self.units.in_state(PENDING)),
            draining=len(self.units.in_state(DRAINING)),
            traffic=self.traffic(now),
            unavailable=self.units.given_back_since(now - GIVEN_BACK_S),
        )
        d = decide(signals, self.policy, self.memory)
        self.memory = d.memory
        for _ in range(d.add):
            self.units.start(now)
        active = {u.unit_id for u in self.units.in_state(ACTIVE)}
        for unit_id in d.remove:
            if unit_id in active:
                self.units.drain(unit_id, now)
        self.decisions.append(d)
        if d.add or d.remove or len(self.decisions) == 1:
            self._log(d)
        return d

    def _log(self, d: Decision) -> None:
        line = json.dumps({"ts": round(time.time(), 3), "event": DECISION_EVENT, **d.record()}, default=str)
        print(line, flush=True)
        if self.log_path is not None:
            with self.log_path.open("a") as f:
                f.write(line + "\n")


def summary(scaler: LocalScaler, now: float | None = None) -> dict[str, Any]:
    """What the local benchmark reports of a run: unit-seconds paid and the scaler's changes."""
    return {
        "unit_seconds": round(scaler.units.unit_seconds(now), 1),
        "passes": len(scaler.decisions),
        "added": sum(d.add for d in scaler.decisions),
        "removed": sum(len(d.remove) for d in scaler.decisions),
        "given_back": sum(1 for e in scaler.units.events if e["event"] == "unit_given_back"),
    }
