"""The four ways of sizing the fleet the scaler benchmark compares, each called once a pass with what
the model's routers report (fleet_model.Snapshot).

- static: the oracle's peak for the whole day, all units up from the start.
- threshold: llm-d's workload-variant-autoscaler saturation analyzer as its documentation states it
  (llm-d/llm-d-workload-variant-autoscaler@14bed5d0 docs/saturation-analyzer.md): a replica is
  saturated at KV-cache use >= 0.80 or queue length >= 5; scale up by one ready replica when the
  non-saturated replicas' average spare KV (0.80 - use) < 0.10 or spare queue (5 - length) < 3,
  pending replicas included so no second one starts while one is pending; scale down by one when
  the load spread over one replica fewer still leaves spare KV >= 0.10 and spare queue >= 3, with
  at least two non-saturated replicas; once per 60 s. KV use is running / slots: on the pinned
  Neuron stack vLLM's KV blocks are the batch slots (--num-gpu-blocks-override = --max-num-seqs,
  runtime/engines/neuron/launch.py). It gets the same floors (booked peaks too) as flotilla's.
- flotilla: runtime/scaler/decide.py, the function the cloud runner and `make local` call.
- oracle: knows every future arrival; keeps at each pass the most units any minute of the next cold
  start needs (required_units: the most requests that overlap in any second of the minute, at the
  same target occupancy as flotilla's), so each unit it starts is ready when needed; no hold; it
  drains no more units than the others can take in their slots.
"""

from __future__ import annotations

import math

import numpy as np

from bench.scaler.fleet_model import Snapshot
from contract.scaling import ScalingPolicy
from runtime.scaler.decide import ScalerMemory, decide
from runtime.scaler.signals import FleetSignals, Traffic, UnitLoad

KV_THRESHOLD, QUEUE_THRESHOLD, KV_SPARE_TRIGGER, QUEUE_SPARE_TRIGGER = 0.80, 5, 0.10, 3


def _least_loaded(snap: Snapshot, count: int) -> list[str]:
    return [uid for uid, *_ in sorted(snap.loads, key=lambda x: (x[1] + x[2], x[0]))[:count]]


class Static:
    name = "static for the peak"

    def step(self, snap: Snapshot) -> tuple[int, list[str]]:
        return 0, []


class Flotilla:
    name = "flotilla"

    def __init__(self, policy: ScalingPolicy, slots: int) -> None:
        self.policy, self.slots = policy, slots
        self.memory = ScalerMemory()
        self.rules: dict[str, int] = {}
        self.changes: list[tuple[int, str, int, int, int, str]] = []  # each pass that changed the fleet

    def step(self, snap: Snapshot) -> tuple[int, list[str]]:
        signals = FleetSignals(
            now_s=snap.now,
            active=tuple(
                UnitLoad(uid, running=r, max_running=self.slots, queue_depth=q, wait_s=w) for uid, r, q, w in snap.loads
            ),
            pending=snap.pending,
            draining=snap.draining,
            traffic=Traffic(snap.request_rate, snap.busy_rate, snap.ttft_p99_s, snap.rate_history),
        )
        d = decide(signals, self.policy, self.memory)
        self.memory = d.memory
        self.rules[d.rule] = self.rules.get(d.rule, 0) + 1
        if d.add or d.remove:
            self.changes.append((round(snap.now), d.rule, d.active, d.pending, d.target, d.reason))
        return d.add, list(d.remove)


class Threshold:
    name = "threshold (llm-d WVA style)"

    def __init__(self, policy: ScalingPolicy, slots: int) -> None:
        self.policy, self.slots = policy, slots

    def step(self, snap: Snapshot) -> tuple[int, list[str]]:
        ready = len(snap.loads)
        minimum, _ = self.policy.minimum(snap.now)
        current = ready + snap.pending
        if current < minimum:
            return minimum - current, []
        kv = [r / self.slots for _, r, _, _ in snap.loads]
        queue = [q for _, _, q, _ in snap.loads]
        free = [(k, q) for k, q in zip(kv, queue) if k < KV_THRESHOLD and q < QUEUE_THRESHOLD]
        if not free:
            up = True
        else:
            spare_kv = sum(KV_THRESHOLD - k for k, _ in free) / len(free)
            spare_q = sum(QUEUE_THRESHOLD - q for _, q in free) / len(free)
            up = spare_kv < KV_SPARE_TRIGGER or spare_q < QUEUE_SPARE_TRIGGER
        if up:
            target = min(ready + 1, self.policy.ceiling)
            return max(0, target - current), []
        if len(free) >= 2 and ready - 1 >= minimum and not snap.pending:
            kv_after = sum(k for k, _ in free) / (len(free) - 1)
            q_after = sum(q for _, q in free) / (len(free) - 1)
            if KV_THRESHOLD - kv_after >= KV_SPARE_TRIGGER and QUEUE_THRESHOLD - q_after >= QUEUE_SPARE_TRIGGER:
                return 0, _least_loaded(snap, 1)
        return 0, []


class Oracle:
    name = "oracle (knows the future)"

    def __init__(
        self, required: np.ndarray, start_s: float, cold_start_s: float, pass_s: float, floor: int, slots: int
    ) -> None:
        self.required, self.start_s, self.slots = required, start_s, slots
        self.ahead = math.ceil((cold_start_s + pass_s) / 60)
        self.floor = floor

    def need(self, now: float) -> int:
        m = int((now - self.start_s) // 60)
        window = self.required[m : m + self.ahead + 1]
        return max(self.floor, int(window.max()) if len(window) else self.floor)

    def step(self, snap: Snapshot) -> tuple[int, list[str]]:
        need = self.need(snap.now)
        current = len(snap.loads) + snap.pending
        if need > current:
            return need - current, []
        # It never drains more than the others can take in their slots: a hand-over they refuse would
        # be a request dropped by scale-in, which no sizing is allowed.
        busy = sum(r + q for _, r, q, _ in snap.loads)
        keep = max(need, math.ceil(busy / self.slots))
        if len(snap.loads) > keep and not snap.pending:
            return 0, _least_loaded(snap, len(snap.loads) - keep)
        return 0, []
