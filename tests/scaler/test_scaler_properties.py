"""The scaler's rules as properties over any signals (hypothesis): the bounds hold for every input,
not only for the cases tests/scaler/test_scaler_decide.py picked."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from contract.scaling import ScalingPolicy, ScheduledMinimum, TemporaryFloor
from runtime.scaler.decide import DOWN, UP, ScalerMemory, decide
from runtime.scaler.signals import FleetSignals, Traffic, UnitLoad

NOW = 1_000_000.0


@st.composite
def unit_loads(draw, max_units: int = 40) -> tuple[UnitLoad, ...]:
    n = draw(st.integers(0, max_units))
    slots = draw(st.sampled_from([0, 4, 16, 32]))
    return tuple(
        UnitLoad(
            f"u{i}",
            running=draw(st.integers(0, max(slots, 1))),
            max_running=slots,
            queue_depth=draw(st.integers(0, 20)),
            prefill_tokens=draw(st.integers(0, 50_000)),
            wait_s=draw(st.floats(0, 30)),
        )
        for i in range(n)
    )


@st.composite
def traffic(draw) -> Traffic:
    rate = draw(st.floats(0, 500))
    busy = draw(st.floats(0, rate)) if draw(st.booleans()) else 0.0
    slope = draw(st.floats(-2, 2))
    history = tuple((NOW - 60 * k, max(0.0, rate - slope * k)) for k in range(10, -1, -1))
    ttft = draw(st.none() | st.floats(0, 20))
    return Traffic(request_rate=rate, busy_rate=busy, ttft_p99_s=ttft, history=history)


@st.composite
def policies(draw) -> ScalingPolicy:
    floor = draw(st.integers(1, 10))
    ceiling = draw(st.integers(floor, 60))
    cold = draw(st.floats(60, 1800))
    schedule = ()
    if draw(st.booleans()):
        start = NOW + draw(st.floats(-7200, 7200))
        schedule = (ScheduledMinimum("peak", start, start + draw(st.floats(60, 7200)), draw(st.integers(1, ceiling))),)
    temp = None
    if draw(st.booleans()):
        temp = TemporaryFloor(draw(st.integers(0, 80)), NOW + draw(st.floats(-600, 600)))
    return ScalingPolicy(floor=floor, ceiling=ceiling, cold_start_s=cold, schedule=schedule).with_temporary_floor(temp)


@st.composite
def signals(draw) -> FleetSignals:
    return FleetSignals(
        NOW,
        draw(unit_loads()),
        pending=draw(st.integers(0, 10)),
        draining=draw(st.integers(0, 3)),
        traffic=draw(traffic()),
        unavailable=draw(st.integers(0, 5)),
    )


memories = st.builds(
    ScalerMemory,
    last_up_s=st.none() | st.floats(NOW - 7200, NOW),
    last_down_s=st.none() | st.floats(NOW - 7200, NOW),
)


@settings(max_examples=400, deadline=None)
@given(signals(), policies(), memories)
def test_the_target_stays_within_the_floor_in_force_and_what_capacity_allows(s, p, m):
    d = decide(s, p, m)
    usable = max(0, p.ceiling - s.unavailable)
    assert d.target <= max(usable, s.current - len(d.remove))  # never starts a unit beyond the ceiling
    assert d.add == 0 or d.target <= usable
    minimum, _ = p.minimum(NOW)
    assert d.target >= min(minimum, usable) or s.current < minimum  # ... and never sheds below the floor
    if d.remove:
        assert s.current - len(d.remove) >= minimum
    # Wanting more than capacity allows is said, in numbers and in words.
    if max(d.wanted, minimum) > usable:
        assert d.unmet > 0 and "more than capacity allows" in d.reason
    else:
        assert d.unmet == 0


@settings(max_examples=400, deadline=None)
@given(signals(), policies(), memories)
def test_a_removal_leaves_survivors_that_hold_the_demand_within_the_scale_in_occupancy(s, p, m):
    d = decide(s, p, m)
    if not d.remove:
        return
    survivors = len(s.active) - len(d.remove)
    assert survivors >= 1
    assert d.demand_slots <= survivors * d.slots_per_unit * p.scale_in_occupancy + 1e-6
    assert s.pending == 0 and s.draining == 0 and s.traffic.busy_rate == 0
    assert not (m.last_up_s is not None and NOW - m.last_up_s < p.hold)


@settings(max_examples=200, deadline=None)
@given(unit_loads(max_units=20), traffic(), policies())
def test_pressure_that_lasts_while_units_start_never_runs_away(active, t, p):
    """Pass after pass the same pressed fleet: the units added go to pending and stay there (their
    cold start has not passed). The total never exceeds what the first pass asked for (or the floor)."""
    s = FleetSignals(NOW, active, traffic=t)
    memory = ScalerMemory()
    first = decide(s, p, memory)
    pending = first.add
    memory = first.memory
    for minute in range(1, 15):
        s = FleetSignals(NOW + 60 * minute, active, pending=pending, traffic=t)
        d = decide(s, p, memory)
        minimum, _ = p.minimum(s.now_s)
        assert len(active) + pending + d.add <= max(first.target, minimum, len(active) + pending), d.reason
        pending += d.add
        memory = d.memory


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(unit_loads(max_units=12), traffic(), st.integers(0, 2)), min_size=2, max_size=25), policies())
def test_no_direction_reversal_within_the_hold_unless_clients_are_refused_or_slow(steps, p):
    memory = ScalerMemory()
    last: tuple[str, float] | None = None
    for minute, (active, t, pending) in enumerate(steps):
        now = NOW + 60 * minute
        d = decide(FleetSignals(now, active, pending=pending, traffic=t), p, memory)
        if d.direction in (UP, DOWN):
            if last is not None and last[0] != d.direction and now - last[1] < p.hold:
                assert d.direction == UP, "a removal within the hold after an addition"
                assert d.rule == "floor" or "overrides the hold" in d.reason, d.reason
            last = (d.direction, now)
        memory = d.memory
