"""One pass of the ECS service scheduler over a rolling update (ECS deployment controller), decided
once for both emulations of ECS in ops/rehearsal: the rehearsal's scheduler (ecs.py) and the API
model (tests/ecs_api.py). Each emulation describes its service as a small typed view (tasks, deployments,
free placements), calls `decide`, and applies the decisions its own way (processes, or task records
walking the lifecycle). The numbers come from ecs_rules.py; each step cites the sentence it follows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Generic, TypeVar

from ops.rehearsal import ecs_rules

K = TypeVar("K")

HEALTHY, UNHEALTHY = "HEALTHY", "UNHEALTHY"


class Phase(StrEnum):
    """Where a task is in its lifecycle (developerguide/task-lifecycle-explanation.html)."""

    STARTING = "STARTING"  # PROVISIONING, PENDING, ACTIVATING: the "PENDING" of maximumPercent
    RUNNING = "RUNNING"
    STOPPING = "STOPPING"  # desired STOPPED, not STOPPED yet: DEACTIVATING, STOPPING, DEPROVISIONING


class Rollout(StrEnum):
    """A deployment's rolloutState (API_Deployment.html)."""

    IN_PROGRESS = "IN_PROGRESS"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"


@dataclass(frozen=True)
class ServiceView:
    desired: int
    min_percent: int
    max_percent: int
    circuit_breaker: bool
    rollback: bool


@dataclass(frozen=True)
class DeploymentView:
    id: str
    rollout: Rollout
    failures: int  # the circuit breaker's count so far (task exits counted by the emulator)


@dataclass(frozen=True)
class TaskView(Generic[K]):
    key: K  # the emulator's own task
    deployment: str  # its deployment's id
    phase: Phase
    health: str  # HEALTHY, UNHEALTHY or UNKNOWN: the task's healthStatus
    rank: int  # among a deployment's tasks that may stop, lower ranks stop first
    in_grace: bool = False  # inside healthCheckGracePeriodSeconds since it started
    leaving: bool = False  # on a DRAINING container instance: to be replaced like an old task

    @property
    def healthy(self) -> bool:
        # "If a task has one or more essential containers with a health check defined, the service
        # scheduler will wait for the task to reach a healthy status before counting it towards the
        # minimum healthy percent total." (API_DeploymentConfiguration.html): a task of an older
        # deployment counts only while it is healthy too.
        return self.phase is Phase.RUNNING and self.health == HEALTHY


@dataclass(frozen=True)
class Decisions(Generic[K]):
    stop_unhealthy: tuple[K, ...]  # in this order
    failures: int  # the (first) primary deployment's failure count after this pass
    failed: bool  # the circuit breaker tripped: the primary deployment is FAILED
    roll_back_to: str | None  # the deployment that becomes primary again (None: stalled or no rollback)
    primary: str  # the deployment that starts tasks and may reach steady state after this pass
    stop_replaced: tuple[K, ...]  # in this order
    start: int  # new tasks for `primary`
    unplaced: int  # tasks maximumPercent allows but the cluster cannot place now
    steady: bool  # `primary` alone runs its desired count of healthy tasks


def decide(
    service: ServiceView,
    deployments: Sequence[DeploymentView],
    tasks: Sequence[TaskView[K]],
    *,
    placeable: int,
) -> Decisions[K]:
    """One scheduler pass. `deployments` newest first (the first is PRIMARY); `tasks` every task of
    the service that has not STOPPED; `placeable` how many tasks the cluster can place now (free
    container instances: a task holds its instance and host port until it has STOPPED)."""
    first = deployments[0]
    live = [t for t in tasks if t.phase is not Phase.STOPPING]
    gone: set[int] = set()  # ids of the views this pass stops

    # Unhealthy tasks are replaced, once the grace period is over. "For tasks that are part of a
    # service, if the task reports as unhealthy then the task will be stopped and the service
    # scheduler will replace it." (API_HealthCheck.html); healthCheckGracePeriodSeconds: "The period of
    # time, in seconds, that the Amazon ECS service scheduler ignores unhealthy ... container health
    # checks after a task has first started." (API_CreateService.html). "If any tasks are unhealthy and
    # if maximumPercent doesn't allow the Amazon ECS scheduler to start replacement tasks, the
    # scheduler stops the unhealthy tasks one-by-one" (API_DeploymentConfiguration.html). Where ECS
    # would start the replacement first (room left) the emulations still stop first: a replacement
    # reuses its predecessor's rank (static rendezvous stands in for ECS's).
    no_room = placeable <= 0 or len(live) >= ecs_rules.max_tasks(service.desired, service.max_percent)
    # An unhealthy task already stopping (a stopping task keeps the health status it had).
    one_stopping = any(t.phase is Phase.STOPPING and t.health == UNHEALTHY for t in tasks)
    failures = first.failures
    stop_unhealthy: list[K] = []
    for t in live:
        if t.phase is not Phase.RUNNING or t.health != UNHEALTHY or t.in_grace:
            continue
        if no_room and one_stopping:
            break
        stop_unhealthy.append(t.key)
        gone.add(id(t))
        one_stopping = True
        if t.deployment == first.id and first.rollout is Rollout.IN_PROGRESS:
            failures += 1  # failedTasks: a task that "fails any of its defined health checks and is stopped"

    # The circuit breaker: "If it is turned on, a service deployment will transition to a failed state
    # and stop launching new tasks." (API_DeploymentCircuitBreaker.html), at the threshold of
    # ecs_rules.breaker_threshold. Rollback: "When the deployment circuit breaker determines that a
    # deployment failed, it looks for the most recent deployment that is in a COMPLETED state. ...
    # When the deployment circuit breaker does not find a deployment that is in a COMPLETED state,
    # the circuit breaker does not launch new tasks and the deployment is stalled."
    # (developerguide/deployment-circuit-breaker.html). That deployment itself becomes primary again
    # (IN_PROGRESS), with the tasks it still runs; the failed one's tasks are replaced like any old
    # deployment's.
    failed = (
        service.circuit_breaker
        and first.rollout is Rollout.IN_PROGRESS
        and failures >= ecs_rules.breaker_threshold(service.desired)
    )
    target = None
    if failed and service.rollback:
        target = next((d for d in deployments[1:] if d.rollout is Rollout.COMPLETED), None)
    primary = target.id if target is not None else first.id
    launches = target is not None or (first.rollout is not Rollout.FAILED and not failed)

    # Old tasks (and tasks on a draining instance) stop while the healthy ones stay within
    # minimumHealthyPercent (ecs_rules.may_stop): unhealthy ones first, then by rank. ECS "may stop"
    # them as soon as that allows; the emulations always do. Stopping before starting follows the
    # documented example: "the service scheduler may stop two existing tasks to free up cluster
    # capacity before starting two new tasks" (API_DeploymentConfiguration.html).
    live = [t for t in live if id(t) not in gone]
    old = sorted((t for t in live if t.deployment != primary or t.leaving), key=lambda t: (t.healthy, t.rank))
    stop_replaced = ecs_rules.may_stop(
        old,
        healthy=lambda t: t.healthy,
        healthy_now=sum(1 for t in live if t.healthy),
        minimum=ecs_rules.min_healthy_tasks(service.desired, service.min_percent),
    )
    gone.update(id(t) for t in stop_replaced)
    live = [t for t in live if id(t) not in gone]

    # New tasks for the primary deployment, within maximumPercent ("an upper limit on the number of
    # your service's tasks that are allowed in the RUNNING or PENDING state during a deployment",
    # API_DeploymentConfiguration.html: a stopping task no longer counts) and within the placements
    # the cluster has (a stopping task still holds its instance).
    mine = [t for t in live if t.deployment == primary and not t.leaving]
    room = 0
    if launches:
        room = ecs_rules.room_to_start(service.desired, service.max_percent, counted=len(live), have=len(mine))
    start = max(0, min(room, placeable))

    # Steady state: "all container health checks must be in a HEALTHY status before a Service or
    # TaskSet can reach STEADY_STATE" (aws/containers-roadmap#897, AWS, 2020-09-16) and only the
    # primary deployment's tasks run (the services-stable waiter: "length(deployments) == 1 &&
    # runningCount == desiredCount", docs.aws.amazon.com/cli/latest/reference/ecs/wait/services-stable.html).
    others = [t for t in tasks if t.deployment != primary] + [t for t in live if t.leaving]
    # A pass that trips the breaker ends with the FAILED deployment still listed: the one rolled back
    # to reaches steady state on a later pass at the earliest (how soon ECS does is not documented).
    steady = not failed and not others and len(mine) == service.desired and all(t.healthy for t in mine)
    return Decisions(
        stop_unhealthy=tuple(stop_unhealthy),
        failures=failures,
        failed=failed,
        roll_back_to=target.id if target is not None else None,
        primary=primary,
        stop_replaced=tuple(t.key for t in stop_replaced),
        start=start,
        unplaced=room - start,
        steady=steady,
    )
