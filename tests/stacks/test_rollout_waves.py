"""Rollout waves as CloudFormation will run them, read back from the synthesized templates: the
DependsOn graph between unit services inside each Cell stack and the stack dependencies between
cells. CloudFormation updates resources without a dependency between them in parallel and a
resource only after those it DependsOn ("With the DependsOn attribute you can specify that the
creation of a specific resource follows another", AWS::CloudFormation DependsOn attribute docs);
`cdk deploy --concurrency N` deploys up to N stacks at once, "dependency permitting" (cdk deploy
--help, CLI 2.1148.1). Each unit rollout counts as one step here."""

from __future__ import annotations

import pytest
from synth_helpers import config_with, synthesize

from contract.rollout import default_units_per_wave, plan_waves


def schedule(synth) -> dict[str, tuple[int, str]]:
    """Unit service logical id -> (step it rolls in, its cell stack), with unlimited stack concurrency."""
    finish: dict[str, int] = {}  # stack id -> step after its last unit
    steps: dict[str, tuple[int, str]] = {}
    for stack in synth.stacks:  # dependency order
        sid = stack.node.id
        begin = max((finish.get(d.node.id, 0) for d in stack.dependencies), default=0)
        services = synth.resources(sid, "AWS::ECS::Service") if sid.startswith("Cell-") else {}
        done: dict[str, int] = {}

        def step(logical: str) -> int:
            if logical not in done:
                after = [d for d in services[logical].get("DependsOn", []) if d in services]
                done[logical] = max([begin] + [step(d) + 1 for d in after])
            return done[logical]

        for logical in services:
            steps[f"{sid}/{logical}"] = (step(logical), sid)
        finish[sid] = max([begin] + [s + 1 for s in done.values()])
    return steps


def per_step(steps: dict[str, tuple[int, str]]) -> list[int]:
    n = max(s for s, _ in steps.values()) + 1
    return [sum(1 for s, _ in steps.values() if s == t) for t in range(n)]


def test_the_320_unit_example_rolls_in_ten_waves_of_thirty_two(fleet_synth):
    steps = schedule(fleet_synth)
    assert len(steps) == 320
    counts = per_step(steps)
    # At most 16 sequential waves (10 here), never more than 10 % of the fleet at once.
    assert len(counts) == 10 <= 16
    assert counts == [32] * 10
    # 8 cells at once, 4 units of each.
    for t in range(10):
        cells = {cell for s, cell in steps.values() if s == t}
        assert len(cells) == 8
    assert fleet_synth.deployment.config.wave_plan.parallel_cells == 8


def test_first_creation_uses_the_same_waves(fleet_synth):
    # The DependsOn graph orders creation exactly as it orders updates: nothing else orders services.
    for cell in fleet_synth.deployment.cells:
        services = fleet_synth.resources(cell.node.id, "AWS::ECS::Service")
        for logical, service in services.items():
            unit_deps = [d for d in service.get("DependsOn", []) if d in services]
            index = int(logical.split("Unit")[1].split("Service")[0])
            assert len(unit_deps) == (0 if index < 4 else 4), logical


def test_one_unit_per_wave_rolls_the_fleet_strictly_one_unit_at_a_time(tmp_path):
    synth = synthesize(config_with(units=5, units_per_cell=2, units_per_wave=1), tmp_path)
    steps = schedule(synth)
    assert per_step(steps) == [1] * 5
    order = [cell for _, cell in sorted(steps.values())]
    assert order == ["Cell-0", "Cell-0", "Cell-1", "Cell-1", "Cell-2"]


def test_a_wave_larger_than_a_cell_rolls_several_cells_side_by_side(tmp_path):
    synth = synthesize(config_with(units=6, units_per_cell=2, units_per_wave=4), tmp_path)
    counts = per_step(schedule(synth))
    assert counts == [4, 2] and max(counts) <= 4
    deps = {s.node.id: {d.node.id for d in s.dependencies} for s in synth.stacks}
    assert "Cell-0" not in deps["Cell-1"] and "Cell-0" in deps["Cell-2"]


@pytest.mark.parametrize("units", [1, 3, 9, 10, 11, 160, 10000])
def test_the_default_wave_is_about_ten_percent_and_at_least_one(units):
    wave = default_units_per_wave(units)
    assert wave >= 1
    assert wave == max(1, -(-units // 10))


@pytest.mark.parametrize(
    "units,per_cell,wave",
    [(160, 20, None), (160, 20, 1), (160, 20, 7), (1000, 20, None), (37, 5, 6), (21, 20, 3), (3, 20, 3)],
)
def test_a_wave_plan_never_rolls_more_than_its_budget_and_covers_every_unit(units, per_cell, wave):
    plan = plan_waves(units, per_cell, wave)
    budget = wave or default_units_per_wave(units)
    assert plan.most_units_at_once <= budget
    assert sum(plan.units_in_cell(c) for c in range(plan.cells)) == units
    # Never slower than one unit at a time, never faster than the budget allows.
    assert -(-units // budget) <= plan.sequential_waves <= units
