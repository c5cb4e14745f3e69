"""ECS's documented numbers, declared once for the two emulations of ECS in ops/rehearsal: the
rehearsal's scheduler (ecs.py, real processes in emulated time) and the API model (ecs_api.py, the
boto-level calls the CLI makes). Each rule cites the API reference sentence it follows."""

from __future__ import annotations

import math


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
