"""ECS's documented numbers and deployment rules, declared once for the two emulations of ECS in
ops/rehearsal: the rehearsal's scheduler (ecs.py, real processes in emulated time) and the API model
(tests/ecs_api.py, the boto-level calls the CLI makes). Each rule cites the API reference sentence it
follows."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")


def max_tasks(desired_count: int, maximum_percent: int) -> int:
    """Upper bound of RUNNING + PENDING tasks during a deployment: "as a percentage of the
    desiredCount (rounded down to the nearest integer)" (API_DeploymentConfiguration.html,
    maximumPercent)."""
    return math.floor(desired_count * maximum_percent / 100)


def min_healthy_tasks(desired_count: int, minimum_healthy_percent: int) -> int:
    """Lower bound of healthy RUNNING tasks during a deployment: "as a percentage of the
    desiredCount (rounded up to the nearest integer)" (API_DeploymentConfiguration.html,
    minimumHealthyPercent)."""
    return math.ceil(desired_count * minimum_healthy_percent / 100)


def room_to_start(desired_count: int, maximum_percent: int, *, counted: int, have: int) -> int:
    """New tasks a service's primary deployment may start now: the ones it lacks (`have` of
    desired_count), within maximumPercent of the tasks `counted` against it ("an upper limit on the
    number of your service's tasks that are allowed in the RUNNING or PENDING state during a
    deployment", API_DeploymentConfiguration.html)."""
    return max(0, min(max_tasks(desired_count, maximum_percent) - counted, desired_count - have))


def may_stop(old: Iterable[T], *, healthy: Callable[[T], bool], healthy_now: int, minimum: int) -> list[T]:
    """Of the tasks a deployment replaces (in the order the scheduler would stop them), those it may
    stop now while `healthy_now` healthy tasks stay at or above `minimum` (min_healthy_tasks): "If a
    task has one or more essential containers with a health check defined, the service scheduler
    will wait for the task to reach a healthy status before counting it towards the minimum healthy
    percent total" (API_DeploymentConfiguration.html), so a task that is not healthy may always stop."""
    out: list[T] = []
    for task in old:
        if not healthy(task):
            out.append(task)
        elif healthy_now - 1 >= minimum:
            out.append(task)
            healthy_now -= 1
    return out


def breaker_threshold(desired_count: int) -> int:
    """ "The deployment circuit breaker has a minimum threshold of 3 and a maximum threshold of 200.
    and uses the values in the following formula to determine the deployment failure. 0.5 * desired
    task count" (API_ServiceDeploymentCircuitBreaker.html). Rounding up is not documented."""
    return min(200, max(3, math.ceil(0.5 * desired_count)))


# Paging. ListServices: "maxResults ... If this parameter isn't used, then ListServices returns up
# to 10 results and a nextToken value if applicable" (API_ListServices.html; 1-100). ListTasks and
# ListContainerInstances: "returns up to 100 results" (API_ListTasks.html,
# API_ListContainerInstances.html; 1-100). DescribeServices: "You may specify up to 10 services to
# describe in a single operation" (API_DescribeServices.html); DescribeTasks: "up to 100 tasks"
# (API_DescribeTasks.html).
LIST_SERVICES_PAGE = 10
LIST_TASKS_PAGE = 100
LIST_CONTAINER_INSTANCES_PAGE = 100
LIST_MAX_RESULTS = 100
DESCRIBE_SERVICES_MAX = 10
DESCRIBE_TASKS_MAX = 100
