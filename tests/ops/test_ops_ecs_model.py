"""The ECS API model the ops tests run on (tests/ecs_api.py) keeps ECS's documented bounds
through a rolling update, whatever the percentages: never more RUNNING or PENDING tasks than
maximumPercent of the desired count (rounded down), never fewer healthy ones than
minimumHealthyPercent (rounded up), and it ends with the desired count of the new revision alone
(API_DeploymentConfiguration.html; the rehearsal's scheduler is held to the same rules in
tests/rehearsal/test_ecs_rules.py)."""

from __future__ import annotations

import math

import pytest
from botocore.exceptions import ClientError
from ecs_api import EcsModel
from ecs_api_records import LIFECYCLE_UP

CLUSTER = "flotilla-cell0"


def _task_definition(model: EcsModel, revision: str) -> str:
    td = model.register_task_definition(
        family="flotilla-cell0-unit0",
        containerDefinitions=[{"name": "node", "image": f"node:{revision}"}],
    )
    return td["taskDefinition"]["taskDefinitionArn"]


@pytest.mark.parametrize(
    "desired, minimum, maximum",
    [(2, 100, 200), (4, 0, 100), (4, 50, 150), (3, 50, 200), (12, 100, 200), (5, 75, 125)],
)
def test_a_rolling_update_stays_within_minimum_healthy_and_maximum_percent(desired, minimum, maximum):
    model = EcsModel()
    model.create_cluster(clusterName=CLUSTER)
    cluster = f"arn:aws:ecs:us-east-1:123456789012:cluster/{CLUSTER}"
    for i in range(2 * desired):  # room for every surge the percentages allow
        model.add_container_instance(cluster, f"i-{i:017x}", capacity_provider="unit0")
    model.create_service(
        cluster=CLUSTER,
        serviceName="unit0",
        taskDefinition=_task_definition(model, "1"),
        desiredCount=desired,
        capacityProviderStrategy=[{"capacityProvider": "unit0", "weight": 1}],
        deploymentConfiguration={"minimumHealthyPercent": minimum, "maximumPercent": maximum},
    )
    model.settle()
    new = _task_definition(model, "2")
    model.update_service(cluster=CLUSTER, service="unit0", taskDefinition=new)
    # The documented formulas, worked here rather than taken from the model's own helpers.
    most, least = math.floor(desired * maximum / 100), math.ceil(desired * minimum / 100)
    for _ in range(200):
        live = [t for t in model.tasks.values() if t.live]
        assert sum(1 for t in live if t.last_status in LIFECYCLE_UP) <= most
        healthy = [t for t in live if t.last_status == "RUNNING" and t.health == "HEALTHY"]
        assert len(healthy) >= least
        service = model.services[(cluster, "unit0")]
        if service.primary.rollout_state == "COMPLETED" and len(service.deployments) == 1:
            break
        model.tick()
    else:
        pytest.fail("the deployment did not complete in 200 ticks")
    running = [t for t in model.tasks.values() if t.live and t.last_status == "RUNNING"]
    assert len(running) == desired and {t.task_definition for t in running} == {new}


def _one_task_service(model: EcsModel, **service) -> tuple[str, object]:
    model.create_cluster(clusterName=CLUSTER)
    cluster = f"arn:aws:ecs:us-east-1:123456789012:cluster/{CLUSTER}"
    model.add_container_instance(cluster, "i-00000000000000001", capacity_provider="unit0")
    model.create_service(
        cluster=CLUSTER,
        serviceName="unit0",
        taskDefinition=_task_definition(model, "1"),
        desiredCount=1,
        capacityProviderStrategy=[{"capacityProvider": "unit0", "weight": 1}],
        **service,
    )
    model.settle()
    (task,) = [t for t in model.tasks.values() if t.live]
    return cluster, task


@pytest.mark.parametrize("grace_s", [0, 60])
def test_an_unhealthy_task_is_replaced_only_once_the_grace_period_after_its_start_is_over(grace_s):
    """ "The period of time, in seconds, that the Amazon ECS service scheduler ignores unhealthy ...
    container health checks after a task has first started ... the default value of 0 is used"
    (API_CreateService.html, healthCheckGracePeriodSeconds): a unit loading its model longer than the
    container's startPeriod must not be replaced inside the service's grace period."""
    model = EcsModel()
    _, task = _one_task_service(model, healthCheckGracePeriodSeconds=grace_s)
    assert task.started_at is not None and task.describe()["startedAt"] == task.started_at
    task.health = "UNHEALTHY"
    seen = []  # (seconds since startedAt at the pass, still live after it)
    while task.live:
        assert len(seen) < 100, "the unhealthy task was never replaced"
        model.tick()
        seen.append(((model.now - task.started_at).total_seconds(), task.live))
    assert task.stopped_reason == "Task failed container health checks"
    assert all(at < grace_s for at, live in seen if live)  # ignored inside the grace period
    assert seen[-1][0] >= grace_s  # and stopped at the first pass past it
    if grace_s:
        assert len(seen) > 1


def test_a_new_grace_period_applies_without_a_new_deployment_and_out_of_range_ones_are_refused():
    model = EcsModel()
    cluster, _ = _one_task_service(model)
    service = model.services[(cluster, "unit0")]
    model.update_service(cluster=CLUSTER, service="unit0", healthCheckGracePeriodSeconds=1800)
    assert len(service.deployments) == 1
    described = model.describe_services(cluster=CLUSTER, services=["unit0"])["services"][0]
    assert described["healthCheckGracePeriodSeconds"] == 1800
    with pytest.raises(ClientError, match="healthCheckGracePeriodSeconds"):
        model.update_service(cluster=CLUSTER, service="unit0", healthCheckGracePeriodSeconds=2_147_483_648)
