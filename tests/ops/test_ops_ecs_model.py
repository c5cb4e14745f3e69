"""The ECS API model the ops tests run on (ops/rehearsal/ecs_api.py) keeps ECS's documented bounds
through a rolling update, whatever the percentages: never more RUNNING or PENDING tasks than
maximumPercent of the desired count (rounded down), never fewer healthy ones than
minimumHealthyPercent (rounded up), and it ends with the desired count of the new revision alone
(API_DeploymentConfiguration.html; the rehearsal's scheduler is held to the same rules in
tests/rehearsal/test_ecs_rules.py)."""

from __future__ import annotations

import math

import pytest

from ops.rehearsal.ecs_api import LIFECYCLE_UP, EcsModel

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
