"""The scaler's decision function, rule by rule (docs/scaling.md, "The rules"): each test names the
rule it holds and fails when that rule is taken out of runtime/scaler/decide.py."""

from __future__ import annotations

import pytest

from contract.scaling import ScalingPolicy, ScheduledMinimum, TemporaryFloor
from runtime.scaler.decide import ScalerMemory, decide
from runtime.scaler.signals import FleetSignals, Traffic, UnitLoad

SLOTS = 16
COLD = 600.0  # a stated cold start of ten minutes
NOW = 100_000.0


def policy(**kw) -> ScalingPolicy:
    base = dict(floor=1, ceiling=50, cold_start_s=COLD)
    base.update(kw)
    return ScalingPolicy(**base)


def units(n: int, running: int, queue: int = 0, *, wait_s: float = 0.0) -> tuple[UnitLoad, ...]:
    return tuple(
        UnitLoad(f"u{i:02d}", running=running, max_running=SLOTS, queue_depth=queue, wait_s=wait_s) for i in range(n)
    )


def rising(rate_now: float, per_minute: float, minutes: int = 10) -> tuple[tuple[float, float], ...]:
    """Rates sampled once a minute, ending at NOW with rate_now, rising `per_minute` a minute."""
    return tuple((NOW - 60 * k, rate_now - per_minute * k) for k in range(minutes, -1, -1))


def flat(rate: float, minutes: int = 10) -> tuple[tuple[float, float], ...]:
    return rising(rate, 0.0, minutes)


# --- demand: batch slots running and queued -------------------------------------------------------
def test_demand_beyond_the_target_occupancy_adds_the_units_it_needs_in_one_pass():
    # 4 units x 16 slots, every slot busy and 8 queued each: 96 slots of demand, which at 75 % of
    # 16 slots needs 8 units. One pass asks for all of them, not one more per minute.
    d = decide(FleetSignals(NOW, units(4, 16, 8), traffic=Traffic(40, history=flat(40))), policy())
    assert d.target == 8 and d.add == 4 and d.rule == "demand"


def test_a_fleet_within_its_target_occupancy_stays_as_it_is():
    d = decide(FleetSignals(NOW, units(4, 11), traffic=Traffic(40, history=flat(40))), policy())
    assert d.add == 0 and d.remove == () and d.target == 4


def test_requests_refused_with_429_count_as_demand_the_units_never_saw():
    # Half the requests are refused: the units see half the demand. 4 x 12 busy slots look like 4
    # units at 75 %; with the refused half they are 96 slots, 8 units.
    d = decide(FleetSignals(NOW, units(4, 12), traffic=Traffic(80, busy_rate=40, history=flat(80))), policy())
    assert d.target == 8 and d.rule == "refusals"


# --- add early enough to cover the cold start ---------------------------------------------------
def test_a_rising_rate_adds_units_a_cold_start_before_they_are_needed():
    # Today 4 units at 11 of 16 slots (69 %, within 75 %); the rate rises 10 % of today's every
    # minute, so in a cold start (10 min) demand doubles: those units must start now.
    d = decide(FleetSignals(NOW, units(4, 11), traffic=Traffic(40, history=rising(40, 4))), policy())
    assert d.rule == "ahead"
    assert d.add >= 3, d.reason
    # The same fleet with a flat rate needs nothing: the addition came from the prediction alone.
    flat_d = decide(FleetSignals(NOW, units(4, 11), traffic=Traffic(40, history=flat(40))), policy())
    assert flat_d.add == 0


def test_a_falling_rate_never_lowers_what_is_measured_now():
    d = decide(FleetSignals(NOW, units(4, 16, 4), traffic=Traffic(40, history=rising(40, -3))), policy())
    assert d.target == 7  # 80 slots at 12 per unit (75 % of 16) is 6.7: the measured demand, not the forecast


# --- no runaway while units are pending ---------------------------------------------------------
def test_units_starting_count_as_capacity_so_pressure_that_lasts_adds_nothing_more():
    # Demand wants 8 units; 4 serve and 4 are starting. The fleet stays pressed (queues, 429s) until
    # they are ready, pass after pass: the scaler must not add again and again (2 -> 4 -> 8 -> 16).
    pressed = FleetSignals(NOW, units(4, 16, 8, wait_s=5.0), pending=4, traffic=Traffic(40, history=flat(40)))
    memory = ScalerMemory(last_up_s=NOW - 60)
    for minute in range(10):
        d = decide(pressed, policy(), memory)
        assert d.add == 0 and d.target == 8, f"minute {minute}: {d.reason}"
        memory = d.memory
        pressed = FleetSignals(pressed.now_s + 60, pressed.active, pending=4, traffic=pressed.traffic)


def test_pressure_with_nothing_starting_and_content_arithmetic_still_adds_a_step():
    # Slots look fine (9 of 16) but every unit reports a 3 s wait for a slot (long prompts): with
    # nothing starting, a step more is asked for.
    d = decide(FleetSignals(NOW, units(10, 9, wait_s=3.0), traffic=Traffic(40, history=flat(40))), policy())
    assert d.rule == "pressure" and d.add == 1
    # With a unit already starting, the same pressure waits for it.
    d = decide(FleetSignals(NOW, units(10, 9, wait_s=3.0), pending=1, traffic=Traffic(40, history=flat(40))), policy())
    assert d.add == 0


# --- remove only what the rest absorb with headroom -----------------------------------------------
def test_a_unit_leaves_only_when_the_others_absorb_its_load_within_the_scale_in_occupancy():
    # 5 units at 7 of 16 slots: 35 slots. Four would hold 35 at 55 % (within 60 %): one leaves.
    d = decide(FleetSignals(NOW, units(5, 7), traffic=Traffic(20, history=flat(20))), policy())
    assert len(d.remove) == 1 and d.target == 4
    # 5 units at 8 of 16: four would be at 62.5 %, above 60 %, though five are below the 75 % that
    # would add one: nothing leaves (and nothing comes back: the gap is the no-flap margin).
    d = decide(FleetSignals(NOW, units(5, 8), traffic=Traffic(20, history=flat(20))), policy())
    assert d.remove == () and d.add == 0 and d.rule == "absorb"


def test_the_least_loaded_units_leave_first():
    fleet = (
        UnitLoad("busy", running=9, max_running=SLOTS),
        UnitLoad("idle", running=0, max_running=SLOTS),
        UnitLoad("some", running=3, max_running=SLOTS),
        UnitLoad("more", running=4, max_running=SLOTS),
    )
    d = decide(FleetSignals(NOW, fleet, traffic=Traffic(5, history=flat(5))), policy())
    assert d.remove == ("idle",)


def test_nothing_leaves_while_units_start_or_drain_or_the_fleet_is_pressed():
    quiet = units(10, 2)
    base = dict(traffic=Traffic(10, history=flat(10)))
    assert decide(FleetSignals(NOW, quiet, **base), policy()).remove  # the control: it would remove
    assert decide(FleetSignals(NOW, quiet, pending=1, **base), policy()).rule == "pending"
    assert decide(FleetSignals(NOW, quiet, draining=1, **base), policy()).rule == "draining"
    slow = FleetSignals(NOW, quiet, traffic=Traffic(10, ttft_p99_s=9.0, history=flat(10)))
    assert decide(slow, policy()).remove == ()


def test_a_rising_rate_over_the_hold_keeps_units_the_current_load_would_let_go():
    # 6 units at 6 of 16 slots: 36 slots. Five would hold that at 45 %; but the rate rises 5 % of
    # today's a minute and the hold is 20 minutes: 72 slots by then need 8 units at 60 %.
    d = decide(FleetSignals(NOW, units(6, 6), traffic=Traffic(20, history=rising(20, 1))), policy())
    assert d.remove == ()


# --- never reverse direction within the hold ------------------------------------------------------
def test_no_removal_within_the_hold_after_units_were_added():
    quiet = FleetSignals(NOW, units(10, 2), traffic=Traffic(10, history=flat(10)))
    hold = policy().hold
    assert hold == 2 * COLD
    assert decide(quiet, policy(), ScalerMemory(last_up_s=NOW - hold + 1)).rule == "hold"
    assert decide(quiet, policy(), ScalerMemory(last_up_s=NOW - hold - 1)).remove


def test_no_addition_within_the_hold_after_a_removal_unless_the_fleet_is_pressed():
    # Demand now wants 6 of 5 units (the rate jumped), no 429s, first tokens on time.
    busy = FleetSignals(NOW, units(5, 14), traffic=Traffic(40, ttft_p99_s=0.5, history=flat(40)))
    just_removed = ScalerMemory(last_down_s=NOW - 120)
    d = decide(busy, policy(), just_removed)
    assert d.add == 0 and d.rule == "hold"
    # Past the hold it adds.
    assert decide(busy, policy(), ScalerMemory(last_down_s=NOW - 2 * COLD - 1)).add == 1
    # Refusing clients overrides the hold, and says so.
    refusing = FleetSignals(NOW, units(5, 14), traffic=Traffic(40, busy_rate=4, history=flat(40)))
    d = decide(refusing, policy(), just_removed)
    assert d.add > 0 and "overrides the hold" in d.reason


# --- floors: the floor, booked peaks, an operator's temporary floor ----------------------------
def test_never_below_the_floor():
    d = decide(FleetSignals(NOW, units(3, 0), traffic=Traffic(0, history=flat(0))), policy(floor=3))
    assert d.remove == () and d.target == 3
    d = decide(FleetSignals(NOW, units(1, 0)), policy(floor=3))
    assert d.add == 2 and d.rule == "floor"


def test_a_booked_peak_starts_its_units_a_cold_start_before_it_begins():
    peak = ScheduledMinimum(name="prime-day", start_s=NOW + COLD - 1, end_s=NOW + 7200, units=30)
    quiet = FleetSignals(NOW, units(2, 1), traffic=Traffic(2, history=flat(2)))
    d = decide(quiet, policy(schedule=(peak,)))
    assert d.target == 30 and d.add == 28 and "prime-day" in d.reason
    # Before its lead time it is not in force yet.
    early = ScheduledMinimum(name="prime-day", start_s=NOW + COLD + 60, end_s=NOW + 7200, units=30)
    assert decide(quiet, policy(schedule=(early,))).add == 0


def test_no_unit_leaves_below_a_booked_peak_while_it_lasts():
    peak = ScheduledMinimum(name="prime-day", start_s=NOW - 3600, end_s=NOW + 3600, units=30)
    idle = FleetSignals(NOW, units(30, 0), traffic=Traffic(1, history=flat(1)))
    assert decide(idle, policy(schedule=(peak,))).remove == ()
    after = FleetSignals(NOW + 3601, units(30, 0), traffic=Traffic(1, history=flat(1)))
    assert decide(after, policy(schedule=(peak,))).remove  # over: units may leave


def test_a_temporary_floor_holds_until_it_lapses():
    temp = TemporaryFloor(units=12, until_s=NOW + 600, reason="incident 42")
    idle = FleetSignals(NOW, units(8, 0))
    d = decide(idle, policy().with_temporary_floor(temp))
    assert d.target == 12 and "temporary floor" in d.reason
    lapsed = FleetSignals(NOW + 601, units(8, 0))
    assert decide(lapsed, policy().with_temporary_floor(temp)).add == 0


# --- never above the ceiling, and say so ---------------------------------------------------------
def test_never_above_the_ceiling_and_the_decision_says_it_wants_more():
    d = decide(FleetSignals(NOW, units(4, 16, 16), traffic=Traffic(40, history=flat(40))), policy(ceiling=6))
    assert d.target == 6 and d.add == 2
    assert d.unmet == 5  # 128 slots at 75 % of 16 = 11 units wanted
    assert "more than capacity allows" in d.reason


def test_units_ec2_could_not_give_lower_what_capacity_allows():
    d = decide(
        FleetSignals(NOW, units(4, 16, 16), unavailable=3, traffic=Traffic(40, history=flat(40))), policy(ceiling=10)
    )
    assert d.target == 7 and d.unmet == 4
    assert "3 given back: they could not get their instances" in d.reason


def test_a_schedule_above_the_ceiling_is_refused_when_the_policy_is_made():
    peak = ScheduledMinimum(name="prime-day", start_s=NOW, end_s=NOW + 60, units=60)
    with pytest.raises(ValueError, match="above the ceiling"):
        policy(ceiling=50, schedule=(peak,))


def test_the_policy_round_trips_through_its_json_form():
    peak = ScheduledMinimum(name="prime-day", start_s=NOW, end_s=NOW + 60, units=6, reservation="cr-0123456789abcdef0")
    p = policy(schedule=(peak,), ttft_target_s=1.5)
    assert ScalingPolicy.loads(p.dumps()) == p


# --- blind spots: units in rotation whose load nobody reported ----------------------------------
def test_no_unit_leaves_while_a_unit_in_rotation_has_not_reported_its_load():
    quiet = units(10, 2)
    assert decide(FleetSignals(NOW, quiet, traffic=Traffic(5, history=flat(5))), policy()).remove  # control
    d = decide(FleetSignals(NOW, quiet, unreported=1, traffic=Traffic(5, history=flat(5))), policy())
    assert d.remove == () and d.rule == "unreported"


def test_units_that_did_not_report_count_at_the_mean_load_of_those_that_did():
    # 2 units seen at 16 running + 8 queued each, 2 unseen: 4 x 24 = 96 slots of demand, 8 units.
    d = decide(FleetSignals(NOW, units(2, 16, 8), unreported=2, traffic=Traffic(40, history=flat(40))), policy())
    assert d.target == 8 and d.add == 4


# --- demand by Little's law once the time a request holds a slot is known ----------------------
def test_the_time_in_a_slot_is_learned_only_while_every_request_gets_a_slot_at_once():
    clear = decide(FleetSignals(NOW, units(4, 10), traffic=Traffic(20, history=flat(20))), policy())
    assert clear.memory.service_s == pytest.approx(2.0)  # 40 running / 20 requests/s
    queued = decide(FleetSignals(NOW, units(4, 16, 6), traffic=Traffic(40, history=flat(40))), policy(), clear.memory)
    assert queued.memory.service_s == pytest.approx(2.0)  # a queue: kept, not learned


def test_a_rate_too_thin_for_littles_law_teaches_no_time_in_a_slot():
    # One sequence running at a rate near zero: running / rate is a time in a slot of ages (or, at a
    # subnormal rate, infinite, which no unit count holds). Such a pass learns nothing and decides.
    for rate in (2.2e-311, 1e-9, 0.01):
        d = decide(FleetSignals(NOW, units(1, 1), traffic=Traffic(rate, history=flat(rate))), policy())
        assert d.memory.service_s is None, rate
        assert d.target >= 1
    learned = decide(FleetSignals(NOW, units(1, 1), traffic=Traffic(0.5, history=flat(0.5))), policy())
    assert learned.memory.service_s == pytest.approx(2.0)  # from one request a minute up, it learns


def test_a_saturated_fleet_asks_for_the_offered_rate_times_the_time_in_a_slot_not_its_backlog():
    # Known: a request holds a slot 2 s. Now 40 requests/s arrive (80 slots of demand), 4 units are
    # full with 30 queued each and a fifth of the requests refused. 80 slots at 12 a unit: 7 units.
    # Counting the queue whole (64 + 120 = 184, x1.25 for the refusals) would start 20.
    memory = ScalerMemory(service_s=2.0)
    d = decide(
        FleetSignals(NOW, units(4, 16, 30), traffic=Traffic(40, busy_rate=8, history=flat(40))), policy(), memory
    )
    assert d.target == 7, d.reason


def test_a_step_already_in_the_load_is_not_predicted_again_a_cold_start_ahead():
    # The rate stepped from 20 to 40 requests/s five minutes ago and has been flat since: what the
    # units run already holds the step. A line through the ten minutes would see +2 requests/s a
    # minute and ask for the doubling again a cold start ahead; neither half of the window rises.
    step = tuple((NOW - 60 * k, 20.0 if k > 5 else 40.0) for k in range(10, -1, -1))
    d = decide(FleetSignals(NOW, units(8, 9), traffic=Traffic(40, history=step)), policy())
    assert d.add == 0 and d.growth == 1.0, d.reason
