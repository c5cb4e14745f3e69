"""The fleet rollout simulation (ops/rollout_sim.py): what the waves buy, what each mode guarantees,
what node failures and traffic cost, and the wave it recommends. Simulated seconds, not wall time."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ops.rollout_sim import FleetModel, StepTimes, recommend_wave, simulate, summarize

FLEET = FleetModel(units=160, nodes_per_unit=8, units_per_cell=20, load_s=600.0, traffic=0.8)


def test_the_default_waves_roll_the_160_unit_fleet_in_ten_steps_instead_of_160():
    one = simulate(replace(FLEET, units_per_wave=1))
    waves = simulate(FLEET)
    assert waves.units_per_wave == 16
    per_unit = 600.0 * 0.8  # the shortest a unit's rollout can be: its fastest model load
    assert one.duration_s >= 160 * per_unit
    assert waves.duration_s <= 10 * (600.0 * 1.2 + sum(vars(StepTimes()).values()))
    assert one.duration_s > 12 * waves.duration_s


def test_surge_never_takes_a_unit_out_of_rotation_without_failures():
    for wave in (1, 16, 32):
        r = simulate(replace(FLEET, rollout="surge", units_per_wave=wave))
        assert r.min_in_rotation == 160
        assert r.below_floor_s == 0 and r.shed_requests == 0


def test_replace_takes_exactly_one_wave_out_and_sheds_nothing_while_the_rest_covers_demand():
    r = simulate(replace(FLEET, rollout="replace"))
    assert r.min_in_rotation == 160 - 16
    assert r.below_floor_s == 0
    assert r.shed_requests == 0  # 144 units cover 80 % of 160 units' demand


def test_replace_sheds_when_the_wave_cuts_below_demand():
    busy = replace(FLEET, rollout="replace", traffic=0.95)
    assert simulate(busy).shed_requests > 0  # 144 of 160 units < 95 %
    assert simulate(replace(busy, units_per_wave=8)).shed_requests == 0  # 152 units cover 95 %


def test_node_failures_during_the_roll_cost_rotation_and_are_seeded():
    failing = replace(FLEET, rollout="replace", node_failures_per_node_day=0.05)
    a, b = simulate(failing, seed=3), simulate(failing, seed=3)
    assert a == b  # deterministic per seed
    assert a.node_failures > 0
    assert a.min_in_rotation < 160 - 16
    assert a.below_floor_s > 0


def test_a_longer_model_load_makes_every_rollout_longer():
    durations = [simulate(replace(FLEET, load_s=load)).duration_s for load in (300, 600, 1800)]
    assert durations == sorted(durations) and durations[0] < durations[-1]


def test_recommend_takes_the_default_wave_when_nothing_sheds():
    rec = recommend_wave(FLEET, seeds=range(2))
    assert rec.units_per_wave == 16
    assert any(s.units_per_wave == 1 for s in rec.table)


def test_recommend_stays_within_the_spare_nodes_surge_needs():
    # surge runs a second copy of each rolling unit: 8 nodes per unit in the wave
    rec = recommend_wave(FLEET, spare_nodes=64, seeds=range(2))
    assert rec.units_per_wave * 8 <= 64


def test_recommend_shrinks_the_wave_when_replace_would_shed():
    rec = recommend_wave(replace(FLEET, rollout="replace", traffic=0.95), seeds=range(2))
    assert rec.units_per_wave <= 8
    chosen = next(s for s in rec.table if s.units_per_wave == rec.units_per_wave)
    assert chosen.shed_requests == 0


def test_a_fleet_without_headroom_gets_told_to_add_units():
    rec = recommend_wave(replace(FLEET, rollout="replace", traffic=1.0), seeds=range(2))
    assert "add units" in rec.why


@pytest.mark.parametrize("bad", [{"rollout": "blue"}, {"units": 0}, {"load_spread": 1.0}])
def test_a_bad_model_is_refused_naming_the_field(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        replace(FLEET, **bad)


def test_summaries_report_the_worst_seed():
    s = summarize(replace(FLEET, rollout="replace", node_failures_per_node_day=0.05), seeds=range(3))
    worst = max(simulate(s.model, seed=i).shed_requests for i in range(3))
    assert s.shed_requests == worst and s.runs == 3


def test_calibration_reads_each_surge_handover_from_a_rotation_timeline():
    from ops.rollout_sim import calibrate

    # 3 units; each rollout: the new unit enters (4), then the old one leaves (3)
    rotation = [(0.0, 3), (100.0, 4), (160.0, 3), (400.0, 4), (470.0, 3), (700.0, 4), (752.0, 3)]
    cal = calibrate(rotation, settle_s=50.0, interval_s=30.0)
    assert cal.handovers == 3
    assert cal.check_phase_s == (10.0, 20.0, 2.0)
    assert cal.mean_check_phase_s == pytest.approx(32 / 3)
