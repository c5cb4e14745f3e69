"""Why a unit is not ready, in AWS's own words: the ECS service's latest events, the reasons its
recent tasks stopped, and the failed activities of its Auto Scaling group (capacity shortages show
up there first). Read only; called for the units `status` finds not ready.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import botocore.exceptions

from contract import node_exit
from ops.aws import Aws, chunks
from ops.fleet import DEPLOYMENT_TAG, UNIT_TAG, Unit
from ops.health_logs import json_log_lines

EVENTS, STOPPED_TASKS, ACTIVITIES = 3, 3, 3
# EC2's answer when an Availability Zone has no capacity of the type: error code
# InsufficientInstanceCapacity (Auto Scaling LaunchInstancesError.ErrorCode), text "We currently do
# not have sufficient <type> capacity in the Availability Zone you requested (<az>)" (the EC2 message
# quoted in hashicorp/terraform#8857). Auto Scaling activities carry the text in StatusMessage.
_NO_CAPACITY = re.compile(r"InsufficientInstanceCapacity|do not have sufficient \S+ capacity", re.IGNORECASE)
_TYPE = re.compile(r"do not have sufficient (\S+) capacity", re.IGNORECASE)
_AZ = re.compile(r"Availability Zone you requested \(([a-z0-9-]+)\)")
CAPACITY_RUNBOOK = "docs/runbooks/capacity-shortage.md"


def capacity_message(text: str) -> str | None:
    """A one-line explanation when `text` is EC2 refusing for lack of capacity, else None."""
    if _NO_CAPACITY.search(text) is None:
        return None
    m = _TYPE.search(text)
    itype = m.group(1) if m else "this instance type"
    az = _AZ.search(text)
    where = f" in {az.group(1)}" if az else ""
    return (
        f"EC2 has no {itype} capacity left{where} (InsufficientInstanceCapacity): the unit's placement group "
        f"and subnet are in that AZ, so nothing replaces or adds nodes until capacity returns; see {CAPACITY_RUNBOOK}"
    )


@dataclass
class Diagnosis:
    unit_id: str
    events: list[str] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)
    activities: list[str] = field(default_factory=list)
    capacity: str | None = None  # the capacity-shortage explanation, when one was seen
    errors: list[str] = field(default_factory=list)  # what could not be read, and why

    def lines(self) -> list[str]:
        out = []
        if self.capacity:
            out.append(self.capacity)
        out += [f"ECS event: {e}" for e in self.events]
        out += self.stopped
        out += [f"Auto Scaling: {a}" for a in self.activities]
        out += [f"(could not read {e})" for e in self.errors]
        return out


def _when(value: Any) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%SZ") if isinstance(value, datetime) else ""


def service_events(aws: Aws, unit: Unit, limit: int = EVENTS) -> list[str]:
    """The newest service events ("A maximum of 100 of the latest events", newest first — botocore
    ecs Service.events), skipping the routine "has reached a steady state" lines."""
    (svc,) = aws.ecs.describe_services(cluster=unit.cluster_arn, services=[unit.service_name])["services"]
    out = []
    for e in svc.get("events", []):
        message = str(e.get("message", ""))
        if "has reached a steady state" in message:
            continue
        out.append(f"{_when(e.get('createdAt'))} {message}".strip())
        if len(out) == limit:
            break
    return out


def stopped_tasks(aws: Aws, unit: Unit, limit: int = STOPPED_TASKS) -> list[str]:
    """Why the unit's recent tasks stopped: stopped tasks stay visible "for at least one hour"
    (botocore ecs DescribeTasks) and ListTasks returns them only when asked for desiredStatus STOPPED."""
    arns: list[str] = []
    for page in aws.ecs.get_paginator("list_tasks").paginate(
        cluster=unit.cluster_arn, serviceName=unit.service_name, desiredStatus="STOPPED"
    ):
        arns.extend(page.get("taskArns", []))
    tasks: list[dict[str, Any]] = []
    for batch in chunks(arns, 100):
        tasks.extend(aws.ecs.describe_tasks(cluster=unit.cluster_arn, tasks=batch)["tasks"])
    tasks.sort(key=lambda t: t.get("stoppedAt") or t.get("createdAt") or datetime.min, reverse=True)
    out = []
    task_defs: dict[str, dict[str, Any]] = {}  # DescribeTaskDefinition once per revision
    for t in tasks[:limit]:
        code = t.get("stopCode", "")
        reason = t.get("stoppedReason", "no reason given")
        last = t.get("lastStatus", "?")
        # desiredStatus STOPPED covers tasks ECS is still stopping: they have not stopped yet.
        kind = "stopped" if last == "STOPPED" else "stopping"
        line = f"{kind} task: {t['taskArn'].rsplit('/', 1)[-1][:12]} {last} {code}: {reason}".replace(" :", ":")
        out.append(line + "".join(container_exits(t, functools.partial(node_reason, aws, t, task_defs=task_defs))))
    return out


def container_exits(task: dict[str, Any], reason_of: Callable[[str], str] | None = None) -> list[str]:
    """Why each of a stopped task's containers ended: its exit status (DescribeTasks
    containers[].exitCode), what a node's status means (contract/node_exit.py), the reason a node
    that can never serve logged (`reason_of(container name)`), and the reason ECS gives
    (containers[].reason, e.g. CannotPullContainerError)."""
    out = []
    for c in task.get("containers", []):
        exit_code, reason = c.get("exitCode"), c.get("reason")
        if exit_code in (None, node_exit.DRAINED) and not reason:
            continue
        text = f"; container {c.get('name', '?')}"
        if exit_code is not None:
            meaning = node_exit.meaning(exit_code)
            text += f" exited {exit_code}" + (f" ({meaning})" if meaning else "")
        if exit_code in node_exit.CANNOT_SERVE:
            text += ": " + (reason_of(c.get("name", "")) if reason_of else WHERE_THE_REASON_IS)
        out.append(text + (f": {reason}" if reason else ""))
    return out


# The line a node that can never serve logs before it exits, read from the stopped task's own log
# stream. The awslogs driver names it from awslogs-stream-prefix (stacks/unit.py: the unit id): "If
# you specify a prefix with this option, then the log stream takes the following format:
# prefix-name/container-name/ecs-task-id" (aws_cdk.aws_ecs.AwsLogDriverProps stream_prefix, after
# the ECS awslogs driver's options). A JSON filter pattern has CloudWatch Logs match it server side
# (CloudWatch Logs FilterAndPatternSyntax.html); lines are checked again here.
WHERE_THE_REASON_IS = f"its log's {node_exit.CANNOT_SERVE_EVENT} line says why"
REASON_FILTER = f'{{ $.event = "{node_exit.CANNOT_SERVE_EVENT}" }}'
REASON_PAGES = 5  # FilterLogEvents may answer empty pages with a nextToken while it searches


def node_reason(aws: Aws, task: dict[str, Any], container: str, task_defs: dict[str, dict[str, Any]]) -> str:
    """The one-line reason the node in `container` of the stopped `task` logged, or where it is and
    why it could not be read (the caller's role may not read logs: the rest of status still works)."""
    try:
        where = log_stream(aws, task, container, task_defs)
        if where is None:
            return f"{WHERE_THE_REASON_IS} (its container does not log to CloudWatch Logs under a stream prefix)"
        reason = logged_reason(aws, *where)
    except botocore.exceptions.ClientError as err:
        return f"{WHERE_THE_REASON_IS} (could not read it: {err.response.get('Error', {}).get('Code', 'error')})"
    return reason or f"{WHERE_THE_REASON_IS} (none in log group {where[0]}, stream {where[1]})"


def log_stream(
    aws: Aws, task: dict[str, Any], container: str, task_defs: dict[str, dict[str, Any]]
) -> tuple[str, str] | None:
    """The container's log group and stream, from its task definition's awslogs options."""
    arn = task.get("taskDefinitionArn")
    if not arn:
        return None
    if arn not in task_defs:
        task_defs[arn] = aws.ecs.describe_task_definition(taskDefinition=arn)["taskDefinition"]
    for c in task_defs[arn].get("containerDefinitions", []):
        logging = c.get("logConfiguration") or {}
        options = logging.get("options") or {}
        group, prefix = options.get("awslogs-group"), options.get("awslogs-stream-prefix")
        if c.get("name") == container and logging.get("logDriver") == "awslogs" and group and prefix:
            return str(group), f"{prefix}/{container}/{task['taskArn'].rsplit('/', 1)[-1]}"
    return None


def logged_reason(aws: Aws, group: str, stream: str) -> str | None:
    """The `reason` of the stream's last node_cannot_serve line (a task's container runs once)."""
    kwargs: dict[str, Any] = {"logGroupName": group, "logStreamNames": [stream], "filterPattern": REASON_FILTER}
    reason = None
    for _, line in json_log_lines(aws, kwargs, REASON_PAGES):
        if line.get("event") == node_exit.CANNOT_SERVE_EVENT and line.get("reason"):
            reason = str(line["reason"])
    return reason


def unit_auto_scaling_group(aws: Aws, unit: Unit, deployment: str) -> str | None:
    """The unit's ASG, by the tags stacks/unit.py puts on it (it may have no instance to look up by)."""
    groups = aws.autoscaling.describe_auto_scaling_groups(
        Filters=[
            {"Name": f"tag:{UNIT_TAG}", "Values": [unit.unit_id]},
            {"Name": f"tag:{DEPLOYMENT_TAG}", "Values": [deployment]},
        ]
    )["AutoScalingGroups"]
    return str(groups[0]["AutoScalingGroupName"]) if groups else None


def failed_activities(aws: Aws, group: str, limit: int = ACTIVITIES) -> list[dict[str, Any]]:
    """The group's recent activities that did not succeed ("If an attempt to launch instances failed,
    the StatusCode value is Failed or Cancelled and the StatusMessage element ... indicates the cause"
    — botocore autoscaling DescribeScalingActivities)."""
    acts = aws.autoscaling.describe_scaling_activities(AutoScalingGroupName=group, MaxRecords=20)["Activities"]
    return [a for a in acts if a.get("StatusCode") in ("Failed", "Cancelled")][:limit]


def diagnose(aws: Aws, unit: Unit, *, deployment: str) -> Diagnosis:
    d = Diagnosis(unit_id=unit.unit_id)
    readers: tuple[tuple[str, list[str], Callable[[], list[str]]], ...] = (
        ("ECS service events", d.events, lambda: service_events(aws, unit)),
        ("stopped tasks", d.stopped, lambda: stopped_tasks(aws, unit)),
        ("Auto Scaling activities", d.activities, lambda: group_activities(aws, unit, deployment)),
    )
    for what, into, read in readers:
        try:
            into.extend(read())
        except botocore.exceptions.ClientError as err:
            # A role that may read ECS but not Auto Scaling still gets the rest of the picture.
            d.errors.append(f"{what}: {err.response.get('Error', {}).get('Code', 'error')}")
    for text in d.activities + d.events:
        d.capacity = d.capacity or capacity_message(text)
    return d


def group_activities(aws: Aws, unit: Unit, deployment: str) -> list[str]:
    group = unit_auto_scaling_group(aws, unit, deployment)
    if group is None:
        return []
    out = []
    for a in failed_activities(aws, group):
        text = a.get("StatusMessage") or a.get("Description", "")
        out.append(f"{_when(a.get('StartTime'))} {group} {a.get('StatusCode')}: {text}".strip())
    return out
