"""The emulated ECS scheduler's rules one at a time, with fake tasks whose health the test sets: no
processes, no waiting. Each expectation is the documented ECS behaviour named in the test (sources
in ops/rehearsal/ecs.py and ecs_rules.py next to the rule)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from ops.rehearsal import ecs_rules
from ops.rehearsal.ecs import (
    Clock,
    ContainerHealth,
    Deployment,
    DeploymentStatus,
    HealthStatus,
    Revision,
    Service,
    TaskState,
)
from ops.rehearsal.ecs_rules import breaker_threshold
from ops.rehearsal.template import HealthCheck, UnitService

R1, R2 = Revision("1", 0.0), Revision("2", 0.0)


class FakeClock(Clock):
    """Emulated time that moves only when the test says; the health loops never fire."""

    def __init__(self) -> None:
        super().__init__(scale=1.0)
        self.t = 0.0

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        await asyncio.Event().wait()  # forever: the test drives health by hand


class FakeTask:
    def __init__(self, name: str) -> None:
        self.name = name
        self.alive = True
        self.signals: list[str] = []

    def running(self) -> bool:
        return self.alive

    def terminate(self) -> None:
        self.signals.append("TERM")

    def kill(self) -> None:
        self.signals.append("KILL")
        self.alive = False


class FakeLauncher:
    def __init__(self) -> None:
        self.launched: list[FakeTask] = []
        self.registered: set[str] = set()

    def launch(self, service: UnitService, deployment: Deployment, slot: int) -> FakeTask:
        task = FakeTask(f"{deployment.revision.label}/{slot}#{len(self.launched)}")
        self.launched.append(task)
        return task

    def register(self, handle: FakeTask) -> None:
        self.registered.add(handle.name)

    def deregister(self, handle: FakeTask) -> None:
        self.registered.discard(handle.name)

    async def probe(self, handle: FakeTask, path: str, timeout_s: float) -> bool:
        return True


def unit(desired: int = 2, min_pct: int = 100, max_pct: int = 200, grace: float = 1800.0) -> UnitService:
    return UnitService(
        stack="Cell-0",
        logical_id="Unit0Service",
        unit_id="cell0-unit0",
        cell_id="cell0",
        revision="1",
        desired_count=desired,
        min_healthy_percent=min_pct,
        max_percent=max_pct,
        circuit_breaker=True,
        rollback=True,
        grace_s=grace,
        depends_on=(),
        health=HealthCheck(("CMD-SHELL", "x"), "/health/container", 30.0, 5.0, 3, 300.0),
        stop_timeout_s=120.0,
        environment={},
    )


def run(spec: UnitService, body) -> None:
    """body(service, launcher, clock), an async function, against a fresh emulated service."""

    async def main() -> None:
        clock = FakeClock()
        launcher = FakeLauncher()
        service = Service(spec, clock=clock, launcher=launcher, log=lambda e: None)
        try:
            await body(service, launcher, clock)
        finally:
            await service.close()

    asyncio.run(main())


def healthy(service: Service, *tasks) -> None:
    for t in tasks:
        t.health.status = HealthStatus.HEALTHY
        t.ever_healthy = True


def settle_first_deployment(service: Service) -> None:
    service.deploy(R1)
    service.tick()
    healthy(service, *service.tasks)
    service.tick()
    assert service.primary.status is DeploymentStatus.COMPLETED


def of(service: Service, label: str, state: TaskState = TaskState.RUNNING) -> list:
    return [t for t in service.tasks if t.deployment.revision.label == label and t.state is state]


# -- container health (Docker's rules, which ECS's HealthCheck maps to) ---------------------------------
def test_failures_inside_the_start_period_do_not_count_until_a_check_passes():
    h = ContainerHealth(retries=3, start_period_s=300, started_at=0)
    assert [h.record(False, t) for t in (30, 60, 90, 120)] == [HealthStatus.UNKNOWN] * 4
    assert h.record(True, 150) is HealthStatus.HEALTHY
    # after a success inside the start period, failures count: retries consecutive ones
    assert [h.record(False, t) for t in (180, 210, 240)] == [
        HealthStatus.HEALTHY,
        HealthStatus.HEALTHY,
        HealthStatus.UNHEALTHY,
    ]
    # "Whenever a health check passes, it becomes healthy (whatever state it was previously in)"
    assert h.record(True, 270) is HealthStatus.HEALTHY


def test_after_the_start_period_retries_consecutive_failures_make_a_container_unhealthy():
    h = ContainerHealth(retries=3, start_period_s=300, started_at=0)
    assert [h.record(False, t) for t in (330, 360, 390)][-1] is HealthStatus.UNHEALTHY
    h2 = ContainerHealth(retries=3, start_period_s=300, started_at=0)
    assert [h2.record(ok, t) for ok, t in ((False, 330), (False, 360), (True, 390), (False, 420))][
        -1
    ] is HealthStatus.HEALTHY


@pytest.mark.parametrize("desired,threshold", [(1, 3), (2, 3), (6, 3), (8, 4), (9, 5), (400, 200), (1000, 200)])
def test_the_circuit_breaker_threshold_is_half_the_desired_count_within_3_and_200(desired, threshold):
    assert breaker_threshold(desired) == threshold


# -- rolling update arithmetic ---------------------------------------------------------------------
def test_maximum_percent_rounds_down_and_minimum_healthy_rounds_up():
    spec = unit(desired=3, min_pct=50, max_pct=150)
    assert (spec.max_tasks, spec.min_healthy_tasks) == (4, 2)
    assert replace(spec, desired_count=2, min_healthy_percent=100).keeps_serving
    assert not replace(spec, desired_count=2, min_healthy_percent=50).keeps_serving


def test_surge_stops_an_old_task_only_for_each_new_healthy_one():
    async def body(service, launcher, clock):
        settle_first_deployment(service)
        service.deploy(R2)
        service.tick()
        assert len(of(service, "2")) == 2 and len(of(service, "1")) == 2  # started beside the old ones
        service.tick()
        assert not of(service, "1", TaskState.STOPPING)  # new ones not healthy yet: nothing stops
        healthy(service, of(service, "2")[0])
        service.tick()
        assert len(of(service, "1", TaskState.STOPPING)) == 1  # one new healthy -> one old may stop
        healthy(service, of(service, "2")[1])
        service.tick()
        assert len(of(service, "1", TaskState.STOPPING)) == 2
        assert service.primary.status is DeploymentStatus.IN_PROGRESS  # old tasks have not exited yet
        for t in launcher.launched[:2]:
            t.alive = False
        service.tick()
        assert service.primary.status is DeploymentStatus.COMPLETED

    run(unit(desired=2, min_pct=100, max_pct=200), body)


def test_replace_stops_every_old_task_first_and_starts_new_ones_once_they_exited():
    async def body(service, launcher, clock):
        settle_first_deployment(service)
        service.deploy(R2)
        service.tick()
        assert len(of(service, "1", TaskState.STOPPING)) == 2 and not of(service, "2")
        for t in launcher.launched[:2]:
            t.alive = False
        service.tick()
        assert len(of(service, "2")) == 2

    run(unit(desired=2, min_pct=0, max_pct=100), body)


def test_an_unhealthy_task_is_left_alone_inside_the_grace_period_then_replaced_and_counted():
    async def body(service, launcher, clock):
        settle_first_deployment(service)
        service.deploy(R2)
        service.tick()
        new = of(service, "2")
        for t in new:
            t.health.status = HealthStatus.UNHEALTHY
        clock.t = 1799.0
        service.tick()
        assert not of(service, "2", TaskState.STOPPING)  # the grace period ignores unhealthy checks
        clock.t = 1800.0
        service.tick()
        # No room above maximumPercent (2 old + 2 new = 200 %): stopped one by one.
        assert len(of(service, "2", TaskState.STOPPING)) == 1
        assert service.primary.failures == 1
        assert len(of(service, "1")) == 2  # the old unit keeps serving

    run(unit(desired=2, grace=1800.0), body)


def test_three_failed_tasks_trip_the_breaker_and_roll_back_to_the_completed_deployment():
    async def body(service, launcher, clock):
        settle_first_deployment(service)
        first = service.primary
        failed = service.deploy(R2)
        for _ in range(3):
            service.tick()
            for t in of(service, "2"):
                t.health.status = HealthStatus.UNHEALTHY
            service.tick()
            for t in of(service, "2", TaskState.STOPPING):
                t.handle.alive = False
        assert failed.status is DeploymentStatus.FAILED and service.breaker_trips == 1
        assert service.primary is first  # rolled back to the last COMPLETED deployment
        service.tick()
        assert not of(service, "2")  # the failed revision's tasks are stopped
        assert len(of(service, "1")) == 2 and all(t.health.status is HealthStatus.HEALTHY for t in of(service, "1"))
        service.tick()
        assert first.status is DeploymentStatus.COMPLETED

    run(unit(desired=2, grace=0.0), body)


def test_a_first_deployment_that_fails_stalls_with_nothing_to_roll_back_to():
    async def body(service, launcher, clock):
        dep = service.deploy(R1)
        for _ in range(3):
            service.tick()
            for t in of(service, "1"):
                t.health.status = HealthStatus.UNHEALTHY
            service.tick()
            for t in of(service, "1", TaskState.STOPPING):
                t.handle.alive = False
        assert dep.status is DeploymentStatus.FAILED and dep.stalled
        launched = len(launcher.launched)
        service.tick()
        assert len(launcher.launched) == launched  # "the circuit breaker does not launch new tasks"

    run(unit(desired=2, grace=0.0), body)


def test_a_task_that_turns_healthy_resets_the_failure_count():
    async def body(service, launcher, clock):
        settle_first_deployment(service)
        dep = service.deploy(R2)
        dep.failures = 2
        service.tick()
        service.record_check(of(service, "2")[0], True)
        assert dep.failures == 0

    run(unit(desired=2, grace=0.0), body)


def test_a_stopping_task_is_deregistered_before_its_sigterm():
    async def body(service, launcher, clock):
        settle_first_deployment(service)
        assert launcher.registered == {t.name for t in launcher.launched}
        service.deploy(R2)
        service.tick()
        healthy(service, *of(service, "2"))
        service.tick()
        old = launcher.launched[:2]
        assert all(t.signals == ["TERM"] for t in old)
        assert not any(t.name in launcher.registered for t in old)

    run(unit(desired=2), body)


def test_a_replaced_task_that_is_not_healthy_may_always_stop_and_a_healthy_one_only_above_the_minimum():
    # Four old tasks, two healthy; three healthy tasks in all and a minimum of two: the unhealthy
    # ones never counted toward the minimum, so both stop; one healthy one may stop, not two.
    old = [("a", True), ("b", False), ("c", True), ("d", False)]
    stops = ecs_rules.may_stop(old, healthy=lambda t: t[1], healthy_now=3, minimum=2)
    assert [name for name, _ in stops] == ["a", "b", "d"]


def test_new_tasks_start_up_to_the_desired_count_within_the_maximum_percent_rounded_down():
    # desired 3 at 150 %: at most floor(4.5) = 4 tasks RUNNING or PENDING.
    assert ecs_rules.room_to_start(3, 150, counted=3, have=0) == 1
    assert ecs_rules.room_to_start(3, 150, counted=1, have=1) == 2  # the desired count bounds it first
    assert ecs_rules.room_to_start(3, 100, counted=4, have=0) == 0  # never negative
