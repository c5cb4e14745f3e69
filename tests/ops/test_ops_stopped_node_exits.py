"""`flotilla status` names why a unit's node stopped: its exit status and what it means
(contract/node_exit.py), from the stopped task's container as ECS's DescribeTasks reports it, and the
one-line reason a node that can never serve logged, from the task's own CloudWatch Logs stream (on
the ECS model of ecs_world.py, whose circuit breaker fails such a deployment, and moto's logs)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

from botocore.exceptions import ClientError
from ecs_api_records import EPOCH
from ops_fakes import bare_unit

from contract import node_exit
from ops.diagnose import STOPPED_TASKS, stopped_tasks
from ops.errors import EXIT_CRITICAL
from stacks.config import NodeConfig


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
        f"; container node exited 3 ({node_exit.meaning(3)}): its log's node_cannot_serve line says why "
        "(its container does not log to CloudWatch Logs under a stream prefix)"
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


REASON = (
    "neuron layout refused before fetching weights: FLOTILLA_NODES_PER_UNIT=2 cannot serve "
    "s3://models/llama-3.1-8b-instruct/ on trn1.32xlarge: tp_degree=64 (2 x 32 NeuronCores) does not split "
    "num_attention_heads=32 evenly: use FLOTILLA_NODES_PER_UNIT 1"
)


def _nodes_log_why(world, *, unit_id: str, cell: int) -> list[str]:
    """Each stopping node's container log as the awslogs driver ships it (one stream per task,
    <prefix>/<container>/<task id>): the lines runtime/node/supervisor.py writes before it exits."""
    logs, group, streams = world.aws.logs, world.log_group(cell), []
    logs.create_log_group(logGroupName=group)

    def ship(task) -> None:
        code = world.exit_codes.get(task.task_definition)
        stream = f"{unit_id}/node/{task.id}"
        if task.last_status != "STOPPED" or code is None or stream in streams:
            return
        streams.append(stream)
        logs.create_log_stream(logGroupName=group, logStreamName=stream)
        now = int(datetime.now(timezone.utc).timestamp() * 1000)
        lines = [
            {"event": "node_listening", "unit": unit_id},
            {"event": "unit_state", "unit": unit_id, "new": "forming"},
            {
                "event": node_exit.CANNOT_SERVE_EVENT,
                "exit_code": code,
                "meaning": node_exit.meaning(code),
                "reason": REASON,
            },
            {"event": "node_exit", "unit": unit_id, "code": code},
        ]
        events = [{"timestamp": now + i, "message": json.dumps(line)} for i, line in enumerate(lines)]
        logs.put_log_events(logGroupName=group, logStreamName=stream, logEvents=events)

    world.model.on_task_change.append(ship)
    return streams


def test_a_unit_whose_nodes_cannot_serve_fails_its_deployment_and_status_quotes_each_node(world, run_cli):
    streams = _nodes_log_why(world, unit_id="cell0-unit0", cell=0)
    world.add_unit(cell=0, index=0, exits=node_exit.LAYOUT_REFUSED)
    # The circuit breaker failed the deployment on tasks that stopped before they were healthy, long
    # before the health-check grace period (model time, not the test's).
    assert world.model.now - EPOCH < timedelta(seconds=NodeConfig().health_check_grace_s / 10)
    code, out = run_cli("status", "--unit", "cell0-unit0")
    flat = " ".join(out.split())
    assert code == EXIT_CRITICAL, out
    assert "FAILED: ECS deployment circuit breaker: tasks failed to start" in flat
    said = f"container node exited 3 ({node_exit.meaning(3)}): {REASON}"
    assert flat.count(said) == STOPPED_TASKS and len(streams) > STOPPED_TASKS  # the newest three tasks
    code, out = run_cli("status", "--unit", "cell0-unit0", "--json")
    (doc,) = json.loads(out)
    assert sum(said in line for line in doc["diagnosis"]) == STOPPED_TASKS


class _NoLogs:
    """A caller whose role may read ECS but not CloudWatch Logs."""

    def filter_log_events(self, **kw):
        raise ClientError({"Error": {"Code": "AccessDeniedException", "Message": "no"}}, "FilterLogEvents")


def test_status_without_logs_access_still_names_the_exit_and_where_the_reason_is(world, run_cli):
    _nodes_log_why(world, unit_id="cell0-unit0", cell=0)
    world.add_unit(cell=0, index=0, exits=node_exit.MODEL_UNREADABLE)
    world.aws.logs = _NoLogs()
    code, out = run_cli("status", "--unit", "cell0-unit0")
    flat = " ".join(out.split())
    assert code == EXIT_CRITICAL and REASON not in flat
    assert (
        f"container node exited 5 ({node_exit.meaning(5)}): its log's node_cannot_serve line says why "
        "(could not read it: AccessDeniedException)"
    ) in flat


def test_a_stream_without_the_line_says_where_it_looked(world, run_cli):
    world.aws.logs.create_log_group(logGroupName=world.log_group(0))  # the node died before it could log
    world.add_unit(cell=0, index=0, exits=node_exit.MODEL_NOT_PUBLISHED)
    code, out = run_cli("status", "--unit", "cell0-unit0")
    flat = " ".join(out.split())
    assert f"(none in log group {world.log_group(0)}, stream cell0-unit0/node/" in flat
