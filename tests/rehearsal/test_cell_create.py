"""A cell created while one unit cannot get capacity: the CloudFormation model (ops/rehearsal/
cloudformation.py) over the ECS emulator (ops/rehearsal/ecs.py) on the synthesized Cell-0 template,
with stand-in tasks (no processes).

`cdk deploy --no-rollback` (CloudFormation's "Preserve successfully provisioned resources") leaves
the units that launched serving and the stack recoverable by deploying again once capacity is there
(docs/runbooks/partial-cell.md); a create that rolls back ends ROLLBACK_FAILED with nothing serving,
because the served units' Auto Scaling groups hold instances protected from scale-in
(docs/runbooks/rollback-failed.md).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from ops.rehearsal import cloudformation as cfn
from ops.rehearsal.ecs import Clock, DeploymentStatus, HealthStatus, Revision, Service, TaskState
from ops.rehearsal.template import CellStack, UnitService, read_fleet

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "stacks"))
from synth_helpers import LLAMA_70B, config_with, synthesize  # noqa: E402

pytestmark = pytest.mark.timeout(120)

SHORT = "cell0-unit1"
GIVE_UP_S = 1.5  # real seconds the model's CloudFormation waits for a service (its stabilization timeout)


class StandInTask:
    def __init__(self, name: str) -> None:
        self.name, self.alive = name, True

    def running(self) -> bool:
        return self.alive

    def terminate(self) -> None:
        self.alive = False  # exits at once on SIGTERM

    def kill(self) -> None:
        self.alive = False


class Capacity:
    """Every unit gets instances except those in `short` (InsufficientInstanceCapacity in its AZ)."""

    def __init__(self, short: set[str]) -> None:
        self.short = short
        self.launched: list[str] = []

    def launch(self, service: UnitService, deployment, slot: int) -> StandInTask | None:
        if service.unit_id in self.short:
            return None
        self.launched.append(service.unit_id)
        return StandInTask(f"{service.unit_id}/{deployment.revision.label}/{slot}")

    def register(self, handle) -> None:
        pass

    def deregister(self, handle) -> None:
        pass

    async def probe(self, handle, path: str, timeout_s: float) -> bool:
        return handle.alive


@pytest.fixture(scope="module")
def cell0(tmp_path_factory) -> CellStack:
    """Cell-0 of three units of two nodes, all three in the first wave (created in parallel)."""
    out = tmp_path_factory.mktemp("cell-create") / "cdk.out"
    synthesize(config_with(units=3, units_per_cell=3, units_per_wave=3, nodes_per_unit=2, model=LLAMA_70B), out)
    (stack,) = [s for s in read_fleet(out).stacks if s.name.endswith("Cell-0")]
    assert [s.unit_id for s in stack.services] == ["cell0-unit0", "cell0-unit1", "cell0-unit2"]
    assert all(s.depends_on == () for s in stack.services)
    return stack


def serving(service: Service) -> bool:
    tasks = [t for t in service.tasks if t.state is TaskState.RUNNING]
    return len(tasks) == service.spec.desired_count and all(t.health.status is HealthStatus.HEALTHY for t in tasks)


def create(stack: CellStack, capacity: Capacity, *, preserve: bool, then_capacity_arrives: bool = False):
    """Create the cell; optionally give the short unit its capacity and deploy again (preserve)."""

    async def main():
        clock = Clock(scale=0.001)  # 30 s health-check interval: 0.03 s
        events: list[str] = []
        services = {
            s.unit_id: Service(s, clock=clock, launcher=capacity, log=lambda e: events.append(e.text))
            for s in stack.services
        }
        loops = [asyncio.ensure_future(s.run()) for s in services.values()]
        revision = Revision(stack.services[0].revision, 0.0)
        try:
            first = await cfn.update_stack(
                stack,
                services,
                revision,
                lambda e: events.append(e.text),
                clock.now,
                preserve=preserve,
                give_up_s=GIVE_UP_S,
            )
            seen = {u: serving(s) for u, s in services.items()}
            kept = {u: s.primary for u, s in services.items()}
            second = None
            if then_capacity_arrives:
                capacity.short.clear()
                second = await cfn.update_stack(
                    stack, services, revision, lambda e: events.append(e.text), clock.now, preserve=True, give_up_s=10.0
                )
            return first, seen, second, {u: serving(s) for u, s in services.items()}, kept, services, events
        finally:
            for loop in loops:
                loop.cancel()
            await asyncio.gather(*loops, return_exceptions=True)
            for s in services.values():
                await s.close()

    return asyncio.run(main())


def test_one_unit_short_of_capacity_leaves_the_others_serving_with_no_rollback(cell0):
    outcome, seen, _, _, _, services, events = create(cell0, Capacity({SHORT}), preserve=True)
    assert outcome is cfn.StackOutcome.FAILED_PRESERVED
    assert seen == {"cell0-unit0": True, SHORT: False, "cell0-unit2": True}
    assert services[SHORT].tasks == []  # never placed: nothing to clean up
    assert any("no container instance met all of its requirements" in e for e in events)


def test_the_partial_cell_completes_by_deploying_again_once_capacity_is_there(cell0):
    capacity = Capacity({SHORT})
    _, _, second, after, kept, services, _ = create(cell0, capacity, preserve=True, then_capacity_arrives=True)
    assert second is cfn.StackOutcome.COMPLETE
    assert after == {"cell0-unit0": True, SHORT: True, "cell0-unit2": True}
    # The units that served were not redeployed: the same deployment, no new tasks.
    for unit in ("cell0-unit0", "cell0-unit2"):
        assert services[unit].primary is kept[unit] and kept[unit].status is DeploymentStatus.COMPLETED
        assert capacity.launched.count(unit) == 2


def test_the_same_shortfall_rolled_back_ends_rollback_failed_with_nothing_serving(cell0):
    """Why cells are created with --no-rollback: the rollback deletes the units that served and then
    cannot delete their Auto Scaling groups (instances protected from scale-in)."""
    outcome, _, _, after, _, _, events = create(cell0, Capacity({SHORT}), preserve=False)
    assert outcome is cfn.StackOutcome.ROLLBACK_FAILED
    assert not any(after.values())
    assert "ROLLBACK_FAILED: cannot delete the Auto Scaling groups of ['cell0-unit0', 'cell0-unit2']" in events
