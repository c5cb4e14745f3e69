"""`flotilla status` names why a unit's node stopped: its exit status and what it means
(contract/node_exit.py), from the stopped task's container as ECS's DescribeTasks reports it."""

from __future__ import annotations

from datetime import datetime, timezone
from types import SimpleNamespace

from ops_fakes import bare_unit

from contract import node_exit
from ops.diagnose import stopped_tasks


class _Ecs:
    """ListTasks (desiredStatus STOPPED) and DescribeTasks for one service's stopped tasks, shaped as
    botocore's ecs model returns them (containers[].name / exitCode / reason)."""

    def __init__(self, tasks: list[dict]) -> None:
        self.tasks = tasks

    def get_paginator(self, op: str):
        assert op == "list_tasks"
        return SimpleNamespace(paginate=lambda **kw: [{"taskArns": [t["taskArn"] for t in self.tasks]}])

    def describe_tasks(self, *, cluster: str, tasks: list[str]) -> dict:
        return {"tasks": [t for t in self.tasks if t["taskArn"] in tasks]}


def _task(n: int, *containers: dict) -> dict:
    return {
        "taskArn": f"arn:aws:ecs:us-east-1:123456789012:task/flotilla-cell0/{n:032x}",
        "lastStatus": "STOPPED",
        "stopCode": "EssentialContainerExited",
        "stoppedReason": "Essential container in task exited",
        "stoppedAt": datetime(2026, 12, 1, 12, 0, n, tzinfo=timezone.utc),
        "containers": list(containers),
    }


def test_a_node_that_cannot_serve_shows_its_exit_status_and_where_the_reason_is():
    aws = SimpleNamespace(ecs=_Ecs([_task(1, {"name": "node", "exitCode": node_exit.LAYOUT_REFUSED})]))
    (line,) = stopped_tasks(aws, bare_unit())
    assert line.startswith("stopped task: ") and "EssentialContainerExited: Essential container in task exited" in line
    assert line.endswith(
        f"; container node exited 3 ({node_exit.meaning(3)}): its log's node_cannot_serve line says why"
    )


def test_each_exit_status_is_named_and_a_drained_node_adds_nothing():
    tasks = [
        _task(1, {"name": "node", "exitCode": node_exit.MODEL_NOT_PUBLISHED}),
        _task(2, {"name": "node", "exitCode": node_exit.RESTART_BUDGET_EXHAUSTED}),
        _task(3, {"name": "node", "exitCode": node_exit.DRAINED}),
    ]
    newest_first = stopped_tasks(SimpleNamespace(ecs=_Ecs(tasks)), bare_unit())
    assert newest_first[0].endswith("Essential container in task exited")  # exit 0: drained, nothing to add
    assert f"exited 1 ({node_exit.meaning(1)})" in newest_first[1]
    assert f"exited 4 ({node_exit.meaning(4)}): its log's node_cannot_serve line says why" in newest_first[2]


def test_a_container_ecs_could_not_start_shows_ecs_reason():
    failed = {"name": "node", "reason": "CannotPullContainerError: pull access denied"}
    (line,) = stopped_tasks(SimpleNamespace(ecs=_Ecs([_task(1, failed)])), bare_unit())
    assert line.endswith("; container node: CannotPullContainerError: pull access denied")
