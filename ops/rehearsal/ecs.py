"""The ECS service scheduler's rolling update (ECS deployment controller) for one unit service.

Each rule below cites the documentation sentence it follows; where the documentation is silent the
comment says so and what the emulator does instead (the inconvenient reading where there is one).
Time is emulated: a Clock runs `scale` real seconds per emulated second, so a 30 s health-check
interval takes 0.3 s at scale 0.01 while every ratio between ECS's timers stays as configured.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from ops.rehearsal.ecs_scheduler import DeploymentView, Phase, Rollout, ServiceView, TaskView, decide
from ops.rehearsal.template import UnitService

# Time scales; a node's answer does not. A local GET answers in milliseconds on an idle machine but
# can take a second on a busy one, and a scaled 5 s timeout (0.05 s at 0.01) would fail checks a trn1
# host passes (a rehearsal on a loaded 2-core machine rolled back for no other reason). So the probe
# timeout is the scaled one but never below this, even when that is longer than the scaled interval:
# Docker runs the next check "interval seconds after each previous check completes" (below), so a
# slow answer delays the next check and never overlaps it.
MIN_PROBE_TIMEOUT_S = 2.0

# Real seconds between looks at a stopping task: how exactly a drain's end (the process's exit) is timed.
EXIT_POLL_S = 0.01


class Clock:
    """Emulated seconds since the rehearsal started; `scale` real seconds per emulated second."""

    def __init__(self, scale: float) -> None:
        if not 0 < scale <= 1:
            raise ValueError(f"time scale {scale!r}: allowed more than 0 and at most 1")
        self.scale = scale
        self._t0 = time.monotonic()

    def now(self) -> float:
        return (time.monotonic() - self._t0) / self.scale

    def to_real(self, seconds: float) -> float:
        return seconds * self.scale

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds * self.scale)


class HealthStatus(StrEnum):
    UNKNOWN = "UNKNOWN"
    HEALTHY = "HEALTHY"
    UNHEALTHY = "UNHEALTHY"


class ContainerHealth:
    """A container's health status from its check results, as Docker keeps it for ECS.

    ECS's HealthCheck "maps to the HEALTHCHECK parameter of docker run" (API_HealthCheck.html), and
    Docker's reference (docs.docker.com/reference/dockerfile/#healthcheck) says: the status "is
    initially starting" (ECS: UNKNOWN, "The container health check is being evaluated");
    "Whenever a health check passes, it becomes healthy (whatever state it was previously in)";
    "It takes retries consecutive failures of the health check for the container to be considered
    unhealthy"; and for the start period, ECS: "failed health checks [do not] count towards the
    maximum number of retries" during startPeriod, but "If a health check succeeds within the
    startPeriod, then the container is considered healthy and any subsequent failures count".
    """

    def __init__(self, *, retries: int, start_period_s: float, started_at: float) -> None:
        self.retries, self.start_period_s, self.started_at = retries, start_period_s, started_at
        self.status = HealthStatus.UNKNOWN
        self.failures = 0  # consecutive failures that count
        self.passed_once = False

    def record(self, ok: bool, at: float) -> HealthStatus:
        if ok:
            self.status, self.failures, self.passed_once = HealthStatus.HEALTHY, 0, True
        elif self.passed_once or at - self.started_at >= self.start_period_s:
            self.failures += 1
            if self.failures >= self.retries:
                self.status = HealthStatus.UNHEALTHY
        return self.status


@dataclass(frozen=True)
class Revision:
    """A task definition revision as the rehearsal runs it: the template's, with this label."""

    label: str
    load_s: float  # real seconds the local engine takes to load (the echo engine's stand-in)


class TaskHandle(Protocol):
    """One local task: a node process."""

    name: str

    def running(self) -> bool: ...

    def terminate(self) -> None: ...

    def kill(self) -> None: ...


class Launcher(Protocol):
    """Starts a unit's tasks. launch() returns None when no instance can take the task (a capacity
    shortfall): ECS then leaves it unplaced and tries again on its next pass."""

    """Starts tasks, answers their health checks and keeps the Cloud Map registrations."""

    def launch(self, service: UnitService, deployment: Deployment, slot: int) -> TaskHandle | None: ...

    def register(self, handle: TaskHandle) -> None: ...

    def deregister(self, handle: TaskHandle) -> None: ...

    async def probe(self, handle: TaskHandle, path: str, timeout_s: float) -> bool: ...


DeploymentStatus = Rollout


_ids = itertools.count(1)


@dataclass(eq=False)
class Deployment:
    revision: Revision
    created_at: float
    status: DeploymentStatus = DeploymentStatus.IN_PROGRESS
    failures: int = 0  # the circuit breaker's failure count
    stalled: bool = False  # failed with nothing to roll back to: launches nothing
    deployment_id: str = field(default_factory=lambda: f"ecs-svc/{next(_ids):04d}")


class TaskState(StrEnum):
    RUNNING = "RUNNING"
    STOPPING = "STOPPING"  # SIGTERM sent, the process has not exited
    STOPPED = "STOPPED"


@dataclass(eq=False)
class Task:
    deployment: Deployment
    slot: int
    handle: TaskHandle
    launched_at: float
    health: ContainerHealth
    state: TaskState = TaskState.RUNNING
    stop_reason: str = ""
    ever_healthy: bool = False
    stop_sent_at: float | None = None  # emulated seconds: SIGTERM
    exited_at: float | None = None  # emulated seconds: the process was gone (its drain ended)


@dataclass(frozen=True)
class Event:
    at: float  # emulated seconds
    who: str
    text: str


class Service:
    """One ECS service (a unit) and its deployments; tick() applies the scheduler's rules once."""

    def __init__(
        self,
        spec: UnitService,
        *,
        clock: Clock,
        launcher: Launcher,
        log: Callable[[Event], None],
        tick_s: float = 0.05,
    ) -> None:
        self.spec, self.clock, self.launcher, self._log = spec, clock, launcher, log
        self.tick_s = tick_s  # real seconds between scheduler passes
        self.deployments: list[Deployment] = []
        self.tasks: list[Task] = []
        self.breaker_trips = 0
        self._background: set[asyncio.Task[None]] = set()
        self.probe_timeout_s = max(clock.to_real(spec.health.timeout_s), MIN_PROBE_TIMEOUT_S)

    # -- what callers see ---------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.spec.unit_id

    @property
    def primary(self) -> Deployment | None:
        return self.deployments[-1] if self.deployments else None

    def event(self, text: str) -> None:
        self._log(Event(at=self.clock.now(), who=self.name, text=text))

    def deploy(self, revision: Revision) -> Deployment:
        """CreateService / UpdateService with a new task definition: a new primary deployment."""
        current = self.primary
        if current is not None and current.revision == revision and current.status is not DeploymentStatus.FAILED:
            return current  # the same task definition: nothing to deploy
        dep = Deployment(revision=revision, created_at=self.clock.now())
        self.deployments.append(dep)
        self.event(f"deployment {dep.deployment_id} of revision {revision.label} started")
        return dep

    async def settled(self, dep: Deployment, give_up_s: float) -> DeploymentStatus:
        """When the deployment completes or fails (or it is still in progress after give_up_s real s)."""
        deadline = time.monotonic() + give_up_s
        while dep.status is DeploymentStatus.IN_PROGRESS and not dep.stalled and time.monotonic() < deadline:
            await asyncio.sleep(self.tick_s)
        return dep.status

    async def run(self) -> None:
        """The scheduler loop; cancel it to stop scheduling (tasks keep running)."""
        while True:
            self.tick()
            await asyncio.sleep(self.tick_s)

    async def delete(self) -> None:
        """DeleteService: every task stopped (SIGTERM, SIGKILL after the stop timeout)."""
        self.deployments.clear()
        for task in self.tasks:
            if task.state is TaskState.RUNNING:
                self._stop(task, "service deleted")
        deadline = time.monotonic() + self.clock.to_real(self.spec.stop_timeout_s) + 5.0
        while any(t.state is not TaskState.STOPPED for t in self.tasks) and time.monotonic() < deadline:
            self._reap()
            await asyncio.sleep(self.tick_s)
        for task in self.tasks:
            if task.handle.running():
                task.handle.kill()
        self._reap()

    # -- the scheduler ------------------------------------------------------------------------------
    def tick(self) -> None:
        """One scheduler pass: the decisions are ecs_scheduler.decide's (the same the API model takes);
        this applies them to processes."""
        self._reap()
        primary = self.primary
        if primary is None:
            return
        spec, now = self.spec, self.clock.now()
        holding = [t for t in self.tasks if t.state is not TaskState.STOPPED]
        # The unit's hosts: its Auto Scaling group's maximum, "room for a second revision of the unit
        # when rolling out with surge" (stacks/config.py, max_nodes_per_unit), which is max_tasks for
        # both rollouts the stacks configure (100/200 surge, 0/100 replace). A task holds its host
        # (and host port) until it has exited.
        decided = decide(
            ServiceView(
                spec.desired_count, spec.min_healthy_percent, spec.max_percent, spec.circuit_breaker, spec.rollback
            ),
            [DeploymentView(d.deployment_id, d.status, d.failures) for d in reversed(self.deployments)],
            [
                TaskView(
                    key=t,
                    deployment=t.deployment.deployment_id,
                    phase=Phase.STOPPING if t.state is TaskState.STOPPING else Phase.RUNNING,
                    health=t.health.status.value,
                    rank=t.slot,
                    in_grace=now - t.launched_at < spec.grace_s,
                )
                for t in holding
            ],
            placeable=spec.max_tasks - len(holding),
        )
        for task in decided.stop_unhealthy:
            self._stop(task, "failed container health checks")
        if decided.failures != primary.failures:
            primary.failures = decided.failures
            self.event(f"circuit breaker: {primary.failures} failed task(s) in {primary.deployment_id}")
        if decided.failed:
            self._fail(primary, decided.roll_back_to)
            primary = self.primary
            assert primary is not None
        for task in decided.stop_replaced:
            self._stop(task, f"replaced by {primary.deployment_id}")
        # A new task takes a rank its deployment has no task holding (the static rendezvous' stand-in
        # for ECS's placement).
        busy = {t.slot for t in self.tasks if t.state is not TaskState.STOPPED and t.deployment is primary}
        for slot in [s for s in range(spec.desired_count) if s not in busy][: decided.start]:
            self._launch(primary, slot)
        if decided.steady and primary.status is DeploymentStatus.IN_PROGRESS:
            primary.status = DeploymentStatus.COMPLETED
            self.event(f"deployment {primary.deployment_id} ({primary.revision.label}) COMPLETED: steady state")

    def _fail(self, dep: Deployment, roll_back_to: str | None) -> None:
        """The circuit breaker tripped on `dep`: roll back to the deployment decide() named, or stall
        (the rule and its source are in ecs_scheduler.decide)."""
        dep.status = DeploymentStatus.FAILED
        self.breaker_trips += 1
        self.event(f"circuit breaker tripped: deployment {dep.deployment_id} ({dep.revision.label}) FAILED")
        target = next((d for d in self.deployments if d.deployment_id == roll_back_to), None)
        if target is None:
            dep.stalled = True
            self.event("nothing to roll back to: the deployment is stalled" if self.spec.rollback else "no rollback")
            return
        self.deployments.remove(target)
        self.deployments.append(target)
        target.status = DeploymentStatus.IN_PROGRESS
        self.event(f"rolling back to {target.deployment_id} ({target.revision.label})")

    def _launch(self, dep: Deployment, slot: int) -> None:
        handle = self.launcher.launch(self.spec, dep, slot)
        if handle is None:
            # "service <name> was unable to place a task because no container instance met all of its
            # requirements" (developerguide/service-event-messages.html): the task is not started and
            # not counted as a failure; the scheduler tries again on its next pass.
            self.event(f"unable to place rank {slot}: no container instance met all of its requirements")
            return
        now = self.clock.now()
        task = Task(
            deployment=dep,
            slot=slot,
            handle=handle,
            launched_at=now,
            health=ContainerHealth(
                retries=self.spec.health.retries, start_period_s=self.spec.health.start_period_s, started_at=now
            ),
        )
        self.tasks.append(task)
        # ECS registers the task in Cloud Map before it runs: ACTIVATING "configures service discovery
        # status" (API_HealthCheck.html, task lifecycle).
        self.launcher.register(handle)
        self.event(f"launched {handle.name} ({dep.revision.label}, rank {slot})")
        self._spawn(self._health_loop(task))

    def _stop(self, task: Task, reason: str) -> None:
        task.state, task.stop_reason, task.stop_sent_at = TaskState.STOPPING, reason, self.clock.now()
        # A stopping task is deregistered first (DEACTIVATING: "Amazon ECS performs additional steps
        # before stopping the task", API_HealthCheck.html; the timing for Cloud Map is not
        # documented), then gets the stop signal: "a stop signal value and a default 30-second
        # timeout, after which the SIGKILL value is sent" (API_StopTask.html), the timeout being the
        # container's stopTimeout.
        self.launcher.deregister(task.handle)
        task.handle.terminate()
        self.event(f"stopping {task.handle.name}: {reason} (SIGTERM)")
        self._spawn(self._watch_stop(task))

    def _reap(self) -> None:
        primary = self.primary
        for task in self.tasks:
            if task.state is TaskState.STOPPED or task.handle.running():
                continue
            if task.state is TaskState.RUNNING:
                # "If the essential parameter of a container is marked as true, and that container
                # fails or stops for any reason, all other containers that are part of the task are
                # stopped." (API_ContainerDefinition.html): the task is gone and gets replaced; one that
                # never got healthy counts against its deployment.
                self.event(f"{task.handle.name} exited on its own")
                dep = task.deployment
                if dep is primary and dep.status is DeploymentStatus.IN_PROGRESS and not task.ever_healthy:
                    dep.failures += 1
                self.launcher.deregister(task.handle)
            task.state = TaskState.STOPPED

    async def _health_loop(self, task: Task) -> None:
        check = self.spec.health
        # Docker: "The health check will first run interval seconds after the container is started,
        # and then again interval seconds after each previous check completes."
        while task.state is TaskState.RUNNING:
            await self.clock.sleep(check.interval_s)
            if task.state is not TaskState.RUNNING:
                return
            self.record_check(task, await self.launcher.probe(task.handle, check.path, self.probe_timeout_s))

    def record_check(self, task: Task, ok: bool) -> None:
        """One health check's result for a task."""
        before = task.health.status
        status = task.health.record(ok, self.clock.now())
        if status is before:
            return
        self.event(f"{task.handle.name} {status}")
        if status is HealthStatus.HEALTHY:
            task.ever_healthy = True
            dep = task.deployment
            # resetOnHealthyTask: "When set to true, a task that reaches a healthy state resets the
            # failure count to 0 ... The default is true." (API_DeploymentCircuitBreaker.html)
            if dep is self.primary and dep.status is DeploymentStatus.IN_PROGRESS:
                dep.failures = 0

    async def _watch_stop(self, task: Task) -> None:
        """Notes when a stopping task exits; SIGKILL once it outlives the stop timeout."""
        deadline = time.monotonic() + self.clock.to_real(self.spec.stop_timeout_s)
        while task.handle.running() and time.monotonic() < deadline:
            await asyncio.sleep(EXIT_POLL_S)
        if task.handle.running():
            task.handle.kill()
            self.event(f"{task.handle.name} still running after stopTimeout {self.spec.stop_timeout_s:g} s: SIGKILL")
        task.exited_at = self.clock.now()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        job = asyncio.ensure_future(coro)
        self._background.add(job)
        job.add_done_callback(self._background.discard)

    async def close(self) -> None:
        """Stop the health loops and timers (not the tasks)."""
        for job in list(self._background):
            job.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
