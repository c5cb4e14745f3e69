"""The emulated ECS scheduler's rules one at a time, with fake tasks whose health the test sets: no
processes, no waiting. Each expectation is the documented ECS behaviour named in the test (sources
in ops/rehearsal/ecs.py, ecs_scheduler.py and ecs_rules.py next to the rule)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import ecs_api as ecs_api_module
import pytest
from ecs_api import EcsModel

from ops.rehearsal import ecs as ecs_module
from ops.rehearsal import ecs_rules, ecs_scheduler
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


# -- both emulations take the same decisions ---------------------------------------------------------
# The rehearsal's scheduler (ecs.py) and the CLI tests' API model (ecs_api.py) each build a view of
# their service and apply ecs_scheduler.decide's answer. The same scenario is driven through both,
# with the task lifecycle moved by the test in the same steps for both: after each scheduler pass,
# stopping tasks exit and new tasks run with the health their revision gets. Every pass's decisions
# are recorded as text by revision label and must match, pass for pass, the ones worked out below
# from the documented rules.
class Recorder:
    def __init__(self, monkeypatch, module, label) -> None:
        self.passes: list[list[str]] = []
        real = module.decide

        def decide(service, deployments, tasks, *, placeable):
            out = real(service, deployments, tasks, placeable=placeable)
            of_key = {id(t.key): label(t.deployment) for t in tasks}
            done = []
            done += [f"stop unhealthy {of_key[id(k)]}" for k in out.stop_unhealthy]
            if out.failed:
                target = label(out.roll_back_to) if out.roll_back_to else "nothing"
                done.append(f"breaker trips on {label(deployments[0].id)}, back to {target}")
            done += [f"stop old {of_key[id(k)]}" for k in out.stop_replaced]
            done += [f"start {out.start} of {label(out.primary)}"] if out.start else []
            done += [f"{out.unplaced} unplaced"] if out.unplaced else []
            in_progress = (
                next(d for d in deployments if d.id == out.primary).rollout is ecs_scheduler.Rollout.IN_PROGRESS
            )
            done += [f"{label(out.primary)} COMPLETED"] if out.steady and in_progress else []
            self.passes.append(done)
            return out

        monkeypatch.setattr(module, "decide", decide)


class SchedulerDriver:
    """The rehearsal's scheduler, its tasks' lifecycle moved by hand."""

    def __init__(self, monkeypatch, spec: UnitService) -> None:
        self.clock, self.launcher = FakeClock(), FakeLauncher()
        self.service = Service(spec, clock=self.clock, launcher=self.launcher, log=lambda e: None)
        self.failing: set[str] = set()
        self.recorder = Recorder(
            monkeypatch,
            ecs_module,
            lambda dep_id: next(d.revision.label for d in self.service.deployments if d.deployment_id == dep_id),
        )

    def deploy(self, label: str) -> None:
        self.service.deploy(Revision(label, 0.0))

    def tick(self) -> None:
        self.service.tick()

    def lifecycle(self) -> None:
        for t in self.service.tasks:
            if t.state is TaskState.STOPPING:
                t.handle.alive = False
            elif t.state is TaskState.RUNNING and t.health.status is HealthStatus.UNKNOWN:
                failing = t.deployment.revision.label in self.failing
                t.health.status = HealthStatus.UNHEALTHY if failing else HealthStatus.HEALTHY

    def turn_unhealthy(self, label: str) -> None:
        next(
            t for t in of(self.service, label) if t.health.status is HealthStatus.HEALTHY
        ).health.status = HealthStatus.UNHEALTHY

    def primary(self) -> tuple[str, str]:
        primary = self.service.primary
        assert primary is not None
        return primary.revision.label, primary.status.value


class ApiDriver:
    """The API model with as many container instances as the rehearsal's unit has hosts; a pass is
    its scheduler's, without the lifecycle step its tick() adds."""

    CLUSTER = "flotilla-cell0"

    def __init__(self, monkeypatch, spec: UnitService) -> None:
        self.model = m = EcsModel()
        m.create_cluster(clusterName=self.CLUSTER)
        cluster = f"arn:aws:ecs:us-east-1:123456789012:cluster/{self.CLUSTER}"
        for i in range(spec.max_tasks):
            m.add_container_instance(cluster, f"i-{i:017x}", capacity_provider="unit0")
        self.labels: dict[str, str] = {}  # task definition arn -> label
        self.failing: set[str] = set()
        self.spec, self.key = spec, (cluster, "unit0")
        self.recorder = Recorder(monkeypatch, ecs_api_module, self._label)

    def _label(self, dep_id: str) -> str:
        service = self.model.services[self.key]
        return self.labels[next(d.task_definition for d in service.deployments if d.id == dep_id)]

    def deploy(self, label: str) -> None:
        td = self.model.register_task_definition(
            family="cell0-unit0", containerDefinitions=[{"name": "node", "image": f"node:{label}"}]
        )["taskDefinition"]["taskDefinitionArn"]
        self.labels[td] = label
        if self.key in self.model.services:
            self.model.update_service(cluster=self.CLUSTER, service="unit0", taskDefinition=td)
            return
        self.model.create_service(
            cluster=self.CLUSTER,
            serviceName="unit0",
            taskDefinition=td,
            desiredCount=self.spec.desired_count,
            capacityProviderStrategy=[{"capacityProvider": "unit0", "weight": 1}],
            deploymentConfiguration={
                "minimumHealthyPercent": self.spec.min_healthy_percent,
                "maximumPercent": self.spec.max_percent,
                "deploymentCircuitBreaker": {"enable": True, "rollback": True},
            },
        )
        # CreateService's first deployment is a deployment like any other; the rehearsal's starts
        # IN_PROGRESS as well.

    def tick(self) -> None:
        self.model._schedule(self.model.services[self.key])

    def lifecycle(self) -> None:
        for t in self.model.tasks.values():
            if not t.live and t.last_status != "STOPPED":
                t.last_status = "STOPPED"
            elif t.live and t.last_status != "RUNNING":
                t.last_status = "RUNNING"
                t.health = "UNHEALTHY" if self.labels[t.task_definition] in self.failing else "HEALTHY"

    def turn_unhealthy(self, label: str) -> None:
        next(
            t
            for t in self.model.tasks.values()
            if t.live and t.health == "HEALTHY" and self.labels[t.task_definition] == label
        ).health = "UNHEALTHY"

    def primary(self) -> tuple[str, str]:
        primary = self.model.services[self.key].primary
        return self.labels[primary.task_definition], primary.rollout_state


def drive(driver, steps) -> list[list[str]]:
    """steps: "deploy <label>", "failing <label>", "unhealthy <label>" (one healthy task turns
    unhealthy), "pass" (a scheduler pass), "live" (the lifecycle step) or "round" (both)."""
    for step in steps:
        verb, _, arg = step.partition(" ")
        if verb == "deploy":
            driver.deploy(arg)
        elif verb == "failing":
            driver.failing.add(arg)
        elif verb == "unhealthy":
            driver.turn_unhealthy(arg)
        else:
            if verb in ("pass", "round"):
                driver.tick()
            if verb in ("live", "round"):
                driver.lifecycle()
    return driver.recorder.passes


def both(monkeypatch, spec: UnitService, steps) -> tuple[list[list[str]], tuple[str, str]]:
    async def main():
        rehearsal = SchedulerDriver(monkeypatch, spec)
        try:
            passes = drive(rehearsal, steps)
            api = ApiDriver(monkeypatch, spec)
            assert drive(api, steps) == passes, "the two emulations decided differently"
            assert api.primary() == rehearsal.primary()
            return passes, rehearsal.primary()
        finally:
            await rehearsal.service.close()

    return asyncio.run(main())


def test_a_deployment_whose_tasks_fail_health_checks_trips_the_breaker_and_rolls_back_in_both(monkeypatch):
    # desired 2 at 100/200: 4 tasks at most (2 hosts each side), 2 healthy at least, threshold 3.
    spec = unit(desired=2, min_pct=100, max_pct=200, grace=0.0)
    steps = ["deploy 1", "round", "round", "failing 2", "deploy 2"] + ["round"] * 9
    passes, primary = both(monkeypatch, spec, steps)
    assert [p for p in passes if p] == [
        ["start 2 of 1"],
        ["1 COMPLETED"],
        ["start 2 of 2"],  # surge: the old ones keep serving
        # No room above maximumPercent: the unhealthy ones stop one by one.
        ["stop unhealthy 2", "1 unplaced"],
        ["stop unhealthy 2", "start 1 of 2", "1 unplaced"],  # the first one's host is free again
        # The third failure reaches the threshold (3 for 2 tasks): back to the last COMPLETED
        # deployment, whose two tasks still run, so nothing new starts.
        ["stop unhealthy 2", "breaker trips on 2, back to 1"],
        ["1 COMPLETED"],  # once the failed deployment's last task has stopped
    ]
    assert primary == ("1", "COMPLETED")


def test_a_rolling_update_at_50_100_with_a_stopping_task_in_both(monkeypatch):
    # desired 4 at 50/100: 4 tasks RUNNING or PENDING at most, 2 healthy at least, and 4 hosts.
    spec = unit(desired=4, min_pct=50, max_pct=100, grace=0.0)
    steps = ["deploy 1", "round", "round", "unhealthy 1", "pass", "deploy 2"] + ["round"] * 6
    passes, primary = both(monkeypatch, spec, steps)
    assert [p for p in passes if p] == [
        ["start 4 of 1"],
        ["1 COMPLETED"],
        # Every host taken: the unhealthy task stops first, its replacement waits for its host.
        ["stop unhealthy 1", "1 unplaced"],
        # The new deployment arrives while that task is still stopping: it no longer counts as
        # RUNNING, so only 3 tasks are healthy and one more old one may stop (3 - 1 >= 2); no
        # host is free for the 2 new tasks maximumPercent allows (4 - 2 counted).
        ["stop old 1", "2 unplaced"],
        ["start 2 of 2"],  # both hosts free again
        ["stop old 1", "stop old 1", "2 unplaced"],  # 2 new healthy: 4 healthy, 2 may stop
        ["start 2 of 2"],
        ["2 COMPLETED"],
    ]
    assert primary == ("2", "COMPLETED")


# -- the pass's rules one at a time (ecs_scheduler.decide) --------------------------------------------
def _view(desired: int, min_pct: int, max_pct: int, *, rollback: bool = True) -> ecs_scheduler.ServiceView:
    return ecs_scheduler.ServiceView(desired, min_pct, max_pct, circuit_breaker=True, rollback=rollback)


def _dep(dep_id: str, rollout: str, failures: int = 0) -> ecs_scheduler.DeploymentView:
    return ecs_scheduler.DeploymentView(dep_id, ecs_scheduler.Rollout(rollout), failures)


def _task(key: str, dep: str, phase: str = "RUNNING", health: str = "HEALTHY", rank: int = 0):
    return ecs_scheduler.TaskView(key, dep, ecs_scheduler.Phase(phase), health, rank)


def test_a_stopping_task_no_longer_counts_against_maximum_percent_but_still_holds_its_instance():
    # maximumPercent bounds tasks "in the RUNNING or PENDING state": desired 2 at 0/100, one old task
    # stopping and the other stopped now (minimum 0): 2 may start, as far as instances are free.
    deps = [_dep("new", "IN_PROGRESS"), _dep("old", "COMPLETED")]
    tasks = [_task("a", "old", "STOPPING"), _task("b", "old", rank=1)]
    out = ecs_scheduler.decide(_view(2, 0, 100), deps, tasks, placeable=3)
    assert (out.stop_replaced, out.start, out.unplaced) == (("b",), 2, 0)
    out = ecs_scheduler.decide(_view(2, 0, 100), deps, tasks, placeable=1)
    assert (out.start, out.unplaced) == (1, 1)


def test_a_replaced_task_counts_toward_the_minimum_only_while_it_is_healthy():
    # desired 2 at 100/200, minimum 2: old a healthy and b still UNKNOWN, new c healthy and d pending.
    # Healthy now: a and c. b never counted, so it may stop; a may not (2 - 1 < 2).
    deps = [_dep("new", "IN_PROGRESS"), _dep("old", "COMPLETED")]
    tasks = [
        _task("a", "old"),
        _task("b", "old", health="UNKNOWN", rank=1),
        _task("c", "new"),
        _task("d", "new", "STARTING", "UNKNOWN", rank=1),
    ]
    out = ecs_scheduler.decide(_view(2, 100, 200), deps, tasks, placeable=0)
    assert out.stop_replaced == ("b",)


def test_the_breaker_rolls_back_to_the_most_recent_completed_deployment_and_keeps_its_tasks():
    # Deployments newest first: "r3" fails (its third failure now, threshold 3 for 2 tasks), "r2" was
    # superseded before it completed, "r1" COMPLETED and still runs one task.
    deps = [_dep("r3", "IN_PROGRESS", failures=2), _dep("r2", "IN_PROGRESS"), _dep("r1", "COMPLETED")]
    tasks = [_task("bad", "r3", health="UNHEALTHY"), _task("r2-task", "r2", rank=1), _task("kept", "r1")]
    out = ecs_scheduler.decide(_view(2, 50, 200), deps, tasks, placeable=4)
    assert (out.stop_unhealthy, out.failures, out.failed) == (("bad",), 3, True)
    assert (out.roll_back_to, out.primary) == ("r1", "r1")
    # r1's task is kept; r2's is an old deployment's (1 healthy left >= minimum 1); one more r1 task
    # starts to reach the desired count.
    assert (out.stop_replaced, out.start, out.steady) == (("r2-task",), 1, False)


def test_a_failed_deployment_with_nothing_completed_or_no_rollback_stalls():
    # "When the deployment circuit breaker does not find a deployment that is in a COMPLETED state,
    # the circuit breaker does not launch new tasks and the deployment is stalled."
    tasks = [_task("bad", "r2", health="UNHEALTHY")]
    for deps, rollback in (
        ([_dep("r2", "IN_PROGRESS", failures=2), _dep("r1", "IN_PROGRESS")], True),
        ([_dep("r2", "IN_PROGRESS", failures=2), _dep("r1", "COMPLETED")], False),
    ):
        out = ecs_scheduler.decide(_view(2, 0, 200, rollback=rollback), deps, tasks, placeable=4)
        assert (out.failed, out.roll_back_to, out.primary, out.start) == (True, None, "r2", 0)
