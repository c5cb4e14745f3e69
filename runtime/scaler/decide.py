"""decide(): how many whole units the fleet should have, from one pass of signals.

The rules, each a sentence of docs/scaling.md and a test in tests/scaler/:
- Demand is the batch slots the units are asked to fill: sequences running plus requests queued
  (Little's law: that concurrency grows with the request rate), scaled up by the share of requests
  refused with 429, whose demand the units never saw.
- Add early enough: a unit takes the stated cold start to serve, so units are sized for the rate the
  short-term trend predicts a cold start ahead, at `target_occupancy` of their slots.
- No runaway: units already starting count as capacity; a pass adds only what demand asks beyond
  the units serving and starting (AIBrix #2670's 2 -> 4 -> 8 -> 16 is what counting only ready
  units does while pressure lasts).
- Remove only what the rest absorb with headroom: after the removal, the demand the trend predicts
  over the hold must fit the survivors at `scale_in_occupancy` (< target_occupancy: removing a unit
  can never by itself call for one back). None while units start or drain, or while the fleet is
  pressed (429s, slow first tokens, long waits for a slot).
- No reversal within the hold (twice the cold start unless stated): no removal that soon after an
  addition, no addition that soon after a removal unless the fleet is pressed (then it says so).
- Never below the floor in force (the floor, a booked peak from a cold start before it, an
  operator's temporary floor) and never above the ceiling; wanting more says so (`unmet`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from contract.scaling import ScalingPolicy
from runtime.scaler.predict import growth
from runtime.scaler.signals import FleetSignals, UnitLoad

UP, DOWN, HOLD = "up", "down", "hold"


@dataclass(frozen=True)
class ScalerMemory:
    """What one pass leaves for the next: when the fleet last grew and last shrank, and how long a
    request holds a batch slot (learned while nothing queued or was refused)."""

    last_up_s: float | None = None
    last_down_s: float | None = None
    service_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: Any) -> ScalerMemory:
        if not isinstance(doc, dict):
            return cls()
        known = ("last_up_s", "last_down_s", "service_s")
        return cls(**{k: float(v) for k, v in doc.items() if k in known and v is not None})


@dataclass(frozen=True)
class Decision:
    now_s: float
    active: int
    pending: int
    draining: int
    target: int  # units serving or starting once this pass is carried out
    add: int  # units to start
    remove: tuple[str, ...]  # units to drain, least loaded first
    wanted: int  # what demand asks for, before the floor and the ceiling
    minimum: int  # the floor in force
    unmet: int  # units wanted beyond what capacity allows (the ceiling, less units EC2 could not give)
    rule: str  # which rule decided: floor, demand, ahead, refusals, pressure, pending, hold, absorb, steady, ...
    reason: str  # one sentence an operator reads (logs, `flotilla scale`)
    demand_slots: float
    slots_per_unit: float
    growth: float
    memory: ScalerMemory

    @property
    def direction(self) -> str:
        return UP if self.add else DOWN if self.remove else HOLD

    def record(self) -> dict[str, Any]:
        """The pass as one flat log record (JSON-ready)."""
        doc = asdict(self)
        doc["remove"] = list(self.remove)
        doc["memory"] = self.memory.to_json()
        doc["direction"] = self.direction
        return doc


def _slots_per_unit(units: tuple[UnitLoad, ...], policy: ScalingPolicy) -> float:
    reported = [u.max_running for u in units if u.max_running > 0]
    return sum(reported) / len(reported) if reported else float(policy.slots_per_unit)


def _pressure(signals: FleetSignals, policy: ScalingPolicy) -> str | None:
    """Why the fleet counts as pressed (clients refused or slow), or None."""
    traffic = signals.traffic
    if traffic.busy_rate > 0:
        return f"{traffic.busy_rate:.2f} requests/s refused with 429"
    if traffic.ttft_p99_s is not None and traffic.ttft_p99_s > policy.ttft_target_s:
        return f"p99 time to first token {traffic.ttft_p99_s:.2f} s above the target {policy.ttft_target_s:g} s"
    slow = [u for u in signals.active if u.wait_s > policy.wait_target_s]
    if slow and len(slow) * 2 >= len(signals.active):
        worst = max(u.wait_s for u in slow)
        return (
            f"{len(slow)} of {len(signals.active)} units expect waits for a batch slot above "
            f"{policy.wait_target_s:g} s (up to {worst:.1f} s)"
        )
    return None


# How far one clear pass moves the learned time a request holds a slot (an exponential average).
SERVICE_SMOOTHING = 0.2
# "Nothing queued": at most this share of the running sequences waits for a slot.
CLEAR_QUEUE_SHARE = 0.05
# Below one request a minute the rate is too thin for Little's law: running / rate would learn a
# time in a slot of hours (or, for a rate near zero, an infinite one that no unit count can hold).
MIN_LEARNING_RATE = 1 / 60


def _busy(signals: FleetSignals) -> tuple[float, float]:
    """(sequences running, requests queued) over the units serving, the unseen at the seen's mean."""
    running = float(sum(u.running for u in signals.active))
    queued = float(sum(u.queue_depth for u in signals.active))
    if signals.unreported and signals.active:
        scale = signals.serving / len(signals.active)
        running, queued = running * scale, queued * scale
    return running, queued


def service_time(signals: FleetSignals, memory: ScalerMemory) -> float | None:
    """The time a request holds a batch slot, by Little's law (running = arrival rate x time in a
    slot) from the passes where every request got a slot at once: nothing refused, (almost) nothing
    queued. Averaged over passes; the one remembered while the fleet is saturated."""
    running, queued = _busy(signals)
    traffic = signals.traffic
    clear = traffic.busy_rate <= 0 and queued <= CLEAR_QUEUE_SHARE * running
    if not clear or traffic.request_rate < MIN_LEARNING_RATE or running <= 0:
        return memory.service_s
    sample = running / traffic.request_rate
    if memory.service_s is None:
        return sample
    return memory.service_s + SERVICE_SMOOTHING * (sample - memory.service_s)


def _demand(signals: FleetSignals, policy: ScalingPolicy, slots: float, service_s: float | None) -> float:
    """Batch slots demanded now. With a learned time in a slot, the offered rate times it (Little's
    law: what the requests arriving now would hold, however many wait or are refused; a queue is
    a backlog, not a rate, and counting it whole would buy units for a burst already past). Without
    one (a new fleet), running plus queued, grown by the share refused with 429."""
    running, queued = _busy(signals)
    traffic = signals.traffic
    if service_s is not None and traffic.request_rate > 0:
        return max(running, traffic.request_rate * service_s)
    busy = running + queued
    if traffic.busy_rate <= 0 or traffic.request_rate <= 0:
        return busy
    served = traffic.request_rate - traffic.busy_rate
    factor = traffic.request_rate / served if served > 0 else policy.max_growth
    if busy == 0:  # refusing everything with nothing running: at least one unit's worth is wanted
        busy = slots * policy.target_occupancy
    return busy * min(factor, policy.max_growth)


def _within(last: float | None, now: float, span: float) -> bool:
    return last is not None and now - last < span


@dataclass(frozen=True)
class _View:
    """One pass's figures, computed once from the signals and the policy."""

    signals: FleetSignals
    policy: ScalingPolicy
    slots: float
    demand: float
    up_growth: float
    hold_growth: float
    wanted: int
    rule: str  # what `wanted` comes from: demand, ahead, refusals or pressure
    why: str
    pressure: str | None
    minimum: int
    floor_why: str
    usable: int

    @classmethod
    def of(cls, signals: FleetSignals, policy: ScalingPolicy, service_s: float | None) -> _View:
        slots = _slots_per_unit(signals.active, policy)
        demand = _demand(signals, policy, slots, service_s)
        history = signals.traffic.history
        up = growth(history, policy.predict_window_s, policy.cold_start_s, policy.max_growth)
        hold = growth(history, policy.predict_window_s, policy.hold, policy.max_growth)
        wanted_now = policy.units_for(demand, slots, policy.target_occupancy)
        wanted = policy.units_for(demand * up, slots, policy.target_occupancy)
        rule = "ahead" if wanted > wanted_now else "refusals" if signals.traffic.busy_rate > 0 else "demand"
        why = (
            f"{demand:.0f} batch slots demanded, x{up:.2f} a cold start ahead: {wanted} unit(s) of "
            f"{slots:.0f} slots at {policy.target_occupancy:.0%}"
        )
        pressure = _pressure(signals, policy)
        active = signals.serving
        if pressure and signals.pending == 0 and wanted <= active:
            wanted = active + max(1, math.ceil(active * policy.pressure_step_fraction))
            rule, why = "pressure", f"{pressure} with no unit starting: {wanted} unit(s)"
        minimum, floor_why = policy.minimum(signals.now_s)
        usable = max(0, policy.ceiling - signals.unavailable)
        return cls(signals, policy, slots, demand, up, hold, wanted, rule, why, pressure, minimum, floor_why, usable)


def decide(signals: FleetSignals, policy: ScalingPolicy, memory: ScalerMemory = ScalerMemory()) -> Decision:
    memory = replace(memory, service_s=service_time(signals, memory))
    view = _View.of(signals, policy, memory.service_s)
    rule, target, remove, reason = _choose(view, memory)
    return _finish(view, memory, rule, target, remove, reason)


def _choose(view: _View, memory: ScalerMemory) -> tuple[str, int, tuple[str, ...], str]:
    """(rule, target units, units to remove, reason) before the ceiling is applied."""
    signals, policy = view.signals, view.policy
    now, current = signals.now_s, signals.current
    below = f"{current} units serving or starting, below {view.floor_why} ({view.minimum})"
    if current < view.minimum and view.wanted <= view.minimum:
        return "floor", view.minimum, (), below
    if view.wanted > current:
        if _within(memory.last_down_s, now, policy.hold):
            ago = now - (memory.last_down_s or now)
            if not view.pressure:
                held = f"held: a unit left {ago:.0f} s ago (hold {policy.hold:.0f} s)"
                if current < view.minimum:  # the floor is not a reversal: it is the operator's
                    return "floor", view.minimum, (), f"{view.why}; {held}; {below}"
                return "hold", current, (), f"{view.why}; {held}"
            return view.rule, view.wanted, (), f"{view.why}; {view.pressure}: overrides the hold ({ago:.0f} s ago)"
        return view.rule, view.wanted, (), view.why
    if view.wanted == current or current <= view.minimum:
        note = f"; {view.floor_why} is {view.minimum}" if view.wanted < current else ""
        return "steady", current, (), f"{view.why}; {current} serving or starting{note}"
    blocker = _scale_in_blocker(view, memory)
    if blocker:
        return blocker[0], current, (), f"{view.why}; none removed: {blocker[1]}"
    return _scale_in(view)


def _scale_in_blocker(view: _View, memory: ScalerMemory) -> tuple[str, str] | None:
    signals = view.signals
    if signals.pending:
        return "pending", f"{signals.pending} unit(s) still starting"
    if signals.unreported:
        return "unreported", f"{signals.unreported} unit(s) in rotation with no recent load report"
    if signals.draining:
        return "draining", f"{signals.draining} unit(s) still handing their streams over"
    if view.pressure:
        return "pressure", view.pressure
    if _within(memory.last_up_s, signals.now_s, view.policy.hold):
        ago = signals.now_s - (memory.last_up_s or signals.now_s)
        return "hold", f"units were added {ago:.0f} s ago (hold {view.policy.hold:.0f} s)"
    return None


def _scale_in(view: _View) -> tuple[str, int, tuple[str, ...], str]:
    """The least loaded units the others absorb with headroom, at most a step of them."""
    signals, policy = view.signals, view.policy
    active = len(signals.active)
    ahead = view.demand * view.hold_growth
    needed = policy.units_for(ahead, view.slots, policy.scale_in_occupancy)
    keep, keep_why = policy.minimum(signals.now_s, within_s=policy.hold)
    survivors = max(keep, needed, 1)
    count = min(active - survivors, max(1, math.floor(active * policy.step_down_fraction)))
    if count <= 0:
        if needed < survivors:
            return "floor", signals.current, (), f"{view.why}; none removed: {keep_why} is {keep}"
        fill = ahead / (max(active - 1, 1) * view.slots)
        return (
            "absorb",
            signals.current,
            (),
            (
                f"{view.why}; none removed: {active - 1} unit(s) would fill {fill:.0%} of their slots over the hold, "
                f"above {policy.scale_in_occupancy:.0%}"
            ),
        )
    order = sorted(signals.active, key=lambda u: (u.running + u.queue_depth, u.prefill_tokens, u.unit))
    remove = tuple(u.unit for u in order[:count])
    fill = ahead / ((active - count) * view.slots)
    return (
        "absorb",
        signals.current - count,
        remove,
        (
            f"{view.why}; {count} unit(s) leave: the other {active - count} fill {fill:.0%} of their slots over the "
            f"hold, within {policy.scale_in_occupancy:.0%}"
        ),
    )


def _finish(
    view: _View, memory: ScalerMemory, rule: str, target: int, remove: tuple[str, ...], reason: str
) -> Decision:
    signals = view.signals
    asked = max(view.wanted, view.minimum)
    unmet = max(0, asked - view.usable)
    if unmet:
        lacking = ""
        if signals.unavailable:
            lacking = f", {signals.unavailable} given back: they could not get their instances"
        reason += (
            f"; wants {asked} units, more than capacity allows ({view.usable}: ceiling {view.policy.ceiling}{lacking})"
        )
    target = min(target, view.usable) if not remove else target
    add = max(0, target - signals.current)
    now = signals.now_s
    if add:
        memory = replace(memory, last_up_s=now)
    if remove:
        memory = replace(memory, last_down_s=now)
    return Decision(
        now_s=now,
        active=signals.serving,
        pending=signals.pending,
        draining=signals.draining,
        target=target,
        add=add,
        remove=remove,
        wanted=view.wanted,
        minimum=view.minimum,
        unmet=unmet,
        rule=rule,
        reason=reason,
        demand_slots=round(view.demand, 3),
        slots_per_unit=view.slots,
        growth=round(view.up_growth, 4),
        memory=memory,
    )
