"""The fleet model of overload (bench/fleet/overload_sim.py), run small: it runs the router's own unit
choice and "full" test and the leader's own wait estimate. With the shipped policy every unit stays in
rotation, goodput stays at capacity and every refusal is told at once; with the former policy (503 ->
eject) the same overload empties the rotation. A shorter queue timeout than the node's 25 s (5 s
here) lets the cascade show within a minute of simulated time."""

from __future__ import annotations

import pytest

from bench.fleet.overload_sim import OverloadParams, run

SMALL = dict(
    routers=3, units=10, slots=4, service_mean_s=2.0, step_s=0.05, queue_timeout_s=5.0, ramp_s=20.0, duration_s=60.0
)


@pytest.mark.parametrize("load", [1.2, 1.5])
def test_shedding_keeps_every_unit_in_rotation_at_capacity_and_tells_every_refusal_at_once(load):
    r = run(OverloadParams(load=load, **SMALL), "shed")
    assert r["in_rotation_min"] == SMALL["units"]  # no router ever took a unit out
    assert r["refused_503"] == 0 and r["no_unit_ready"] == 0
    assert r["refused_429"] > 0  # it was an overload: some requests were refused
    assert r["goodput"] >= 0.97  # the slots stayed busy
    assert r["told_within_1s"] >= 0.99


@pytest.mark.parametrize("load", [1.2, 1.5])
def test_the_former_503_then_eject_policy_turns_the_same_overload_into_an_outage(load):
    before = run(OverloadParams(load=load, **SMALL), "eject")
    after = run(OverloadParams(load=load, **SMALL), "shed")
    assert before["in_rotation_min"] < SMALL["units"]
    assert before["no_unit_ready"] > 0  # routers with nothing left in rotation
    assert before["goodput"] < after["goodput"] - 0.2
