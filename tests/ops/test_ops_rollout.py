"""`flotilla rollout status`: rollout state per unit and of the router (rollback: test_ops_rollback.py)."""

from __future__ import annotations

import json

from ops_fakes import bare_unit

from ops.commands.rollout import FAILED, IN_PROGRESS, rollout_state
from ops.fleet import Node


def _task_definition(aws, unit) -> str:
    return aws.ecs.describe_services(cluster=unit.cluster_arn, services=[unit.service_name])["services"][0][
        "taskDefinition"
    ]


def _upgrade(aws, fleet, unit, revision: str) -> str:
    """Register the unit's next task definition (a new FLOTILLA_REVISION) and point the service at it,
    as `cdk deploy` of a new revision does; the members then report the new revision."""
    td = fleet.register_revision(
        family=unit.family, unit_id=unit.unit_id, cell_id=unit.cell_id, nodes=len(unit.nodes), revision=revision
    )
    aws.ecs.update_service(cluster=unit.cluster_arn, service=unit.service_name, taskDefinition=td)
    for n in unit.nodes:
        n.server.set(revision=revision)
    return td


def test_rollout_status_of_a_settled_fleet_exits_zero(fleet, run_cli):
    fleet.add_unit(cell=0, index=0)
    fleet.add_unit(cell=1, index=0)
    code, out = run_cli("rollout", "status")
    assert code == 0, out
    assert "2 completed, 0 in progress, 0 failed" in out
    assert "cell0: revision 1" in out and "cell1: revision 1" in out


def test_members_still_on_the_old_revision_show_the_unit_in_progress(aws, fleet, run_cli):
    unit = fleet.add_unit(cell=0, index=0)
    _upgrade(aws, fleet, unit, "2")
    unit.nodes[1].server.set(revision="1")
    code, out = run_cli("rollout", "status", "--wait", "0")
    assert code == 0
    assert "0 completed, 1 in progress" in out
    assert "1, 2" in out  # what the members report


def test_rollout_status_wait_gives_up_with_exit_one_when_the_budget_runs_out(aws, fleet, run_cli, monkeypatch):
    unit = fleet.add_unit(cell=0, index=0)
    unit.nodes[0].server.set(revision="2")
    import ops.commands.common as common

    monkeypatch.setattr(common, "pause", lambda s: None)
    code, out = run_cli("rollout", "status", "--wait", "0.01")
    assert code == 1
    assert "not done after" in out


def test_a_failed_ecs_deployment_marks_the_unit_failed_and_not_ready():
    unit = bare_unit(
        desired=2,
        task_definition_arn="arn:td/f:2",
        revision="2",
        nodes_per_unit=2,
        deployments=[
            {
                "id": "ecs-svc/1",
                "status": "PRIMARY",
                "rolloutState": "FAILED",
                "rolloutStateReason": "circuit breaker tripped",
            }
        ],
    )
    assert rollout_state(unit) == FAILED
    assert any("FAILED: circuit breaker tripped" in p for p in unit.problems())
    unit.deployments = [{"status": "PRIMARY", "rolloutState": "IN_PROGRESS"}, {"status": "ACTIVE"}]
    assert rollout_state(unit) == IN_PROGRESS
    unit.deployments = [{"status": "PRIMARY", "rolloutState": "COMPLETED"}]
    unit.nodes = [Node(task_arn="t/1", last_status="RUNNING", task_definition_arn="", health={"revision": "1"})]
    assert rollout_state(unit) == IN_PROGRESS


def test_a_failed_deployment_makes_rollout_status_and_status_exit_one(aws, fleet, run_cli):
    fleet.add_unit(cell=0, index=0)
    bad = fleet.add_unit(cell=0, index=1)
    fleet.set_deployment(bad, "FAILED", reason="tasks failed to start")
    code, out = run_cli("rollout", "status")
    assert code == 1
    assert "1 completed, 0 in progress, 1 failed" in out
    code, out = run_cli("status")
    assert code == 1
    assert "FAILED: tasks failed to start" in out


def test_during_a_surge_rollout_the_old_formation_keeps_the_unit_ready(aws, fleet, run_cli):
    """unit_rollout=surge: the new revision forms on fresh instances beside the old formation, which
    keeps serving until the new one is ready. status stays 0; rollout status says in progress."""
    unit = fleet.add_unit(cell=0, index=0)
    fleet.add_unit(cell=0, index=1)
    new_td = fleet.register_revision(
        family=unit.family, unit_id=unit.unit_id, cell_id=unit.cell_id, nodes=2, revision="2"
    )
    aws.ecs.update_service(cluster=unit.cluster_arn, service=unit.service_name, taskDefinition=new_td)
    new = fleet.add_formation(unit, task_definition=new_td, started_by="ecs-svc/5678", revision="2", ready=False)
    code, out = run_cli("status", "--unit", "cell0-unit0")
    assert code == 0, out
    assert all(n.instance_id in out for n in new)
    code, out = run_cli("rollout", "status")
    assert code == 0
    assert "1 completed, 1 in progress" in out
    # the old formation goes away before the new one is ready: now the unit is not ready
    for n in unit.nodes:
        aws.ecs.stop_task(cluster=unit.cluster_arn, task=n.task_arn, reason="rollout")
    code, out = run_cli("status", "--unit", "cell0-unit0")
    assert code == 1  # degraded: cell0-unit1 still serves
    assert f"node {new[0].instance_id} (rank 0) is forming, not ready" in out


def test_rollout_status_shows_the_router_deployments_and_fails_on_a_failed_one(aws, fleet, run_cli):
    fleet.add_unit(cell=0, index=0)
    cluster = aws.ecs.create_cluster(clusterName="flotilla-Router-ClusterEB0386A7-abcd")["cluster"]["clusterArn"]
    td = aws.ecs.register_task_definition(
        family="flotillaRouterTask",
        containerDefinitions=[{"name": "router", "image": "flotilla:latest", "memory": 512}],
    )["taskDefinition"]["taskDefinitionArn"]
    aws.ecs.create_service(cluster=cluster, serviceName="flotilla-Router-Service", taskDefinition=td, desiredCount=2)
    code, out = run_cli("rollout", "status")
    assert "router" in out and "flotilla-Router-Service" in out and "flotillaRouterTask:1" in out
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.ecs.models import ecs_backends

    svc = ecs_backends[DEFAULT_ACCOUNT_ID]["us-east-1"].services[
        "flotilla-Router-ClusterEB0386A7-abcd:flotilla-Router-Service"
    ]
    svc.deployments[0]["rolloutState"] = "FAILED"
    code, out = run_cli("rollout", "status")
    assert code == 1
    code, out = run_cli("status")
    assert code == 0 and "flotilla-Router" not in out  # the router is not a unit


def test_rollout_status_json_names_each_units_rollout_and_the_failed_ones(aws, fleet, run_cli):
    fleet.add_unit(cell=0, index=0)
    unit = fleet.add_unit(cell=1, index=0)
    fleet.set_deployment(unit, FAILED, "tasks failed to start")
    code, out = run_cli("rollout", "status", "--json")
    doc = json.loads(out)
    assert code == 1 and doc["failed"] == ["cell1-unit0"]
    assert {u["unit"]: u["rollout"] for u in doc["units"]} == {"cell0-unit0": "COMPLETED", "cell1-unit0": FAILED}
    code, out = run_cli("rollout", "status", "--cell", "0", "--json")
    assert code == 0 and [u["unit"] for u in json.loads(out)["units"]] == ["cell0-unit0"]
