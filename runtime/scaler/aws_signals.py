"""What the cloud scaler reads each pass, all through AWS APIs, with no network path to the units:
each unit's ECS service (desired and running tasks, its latest event), each unit's load as the
routers last reported it (their `unit_states` lines in CloudWatch Logs, runtime/router/unit_report.py),
and the routers' traffic and the leaders' time to first token (CloudWatch metrics from their EMF
lines). boto3 clients are passed in (the runner's, or moto's in tests)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import contract
from contract.log_lines import json_lines
from contract.scaling import METRIC_BUSY_REFUSALS, METRIC_REQUESTS
from runtime.scaler.signals import Traffic

TAG_UNIT = "flotilla:unit"  # every resource of a unit carries it (stacks/unit.py)
UNIT_STATES_EVENT = "unit_states"  # runtime/router/unit_report.py EVENT
# Server-side JSON filter (CloudWatch Logs filter pattern syntax, `{ $.field = "value" }`): the
# routers' access lines in the same log group are not downloaded. Lines are checked again here.
UNIT_STATES_FILTER = '{ $.event = "unit_states" }'
REPORT_MAX_AGE_S = 180  # three report intervals: an older line says nothing about now
_UNIT_RE = re.compile(r"^" + contract.UNIT_ID_PATTERN + r"$")


@dataclass(frozen=True)
class UnitService:
    unit_id: str
    cluster: str
    arn: str
    desired: int
    running: int
    pending: int
    event: str  # the service's latest event message ('' when none): why a unit cannot start

    @property
    def order(self) -> tuple[int, int]:
        """(cell, index): units are started in this order, lowest first."""
        m = _UNIT_RE.match(self.unit_id)
        return (int(m.group(1)), int(m.group(2))) if m else (10**9, 10**9)


def cluster_name(deployment: str, cell: int) -> str:
    """The cell's ECS cluster (stacks/cell.py names it explicitly)."""
    return f"{deployment}-{contract.cell_id(cell)}"


def unit_services(ecs: Any, deployment: str, cells: int) -> dict[str, UnitService]:
    """Every unit's ECS service in the deployment's cells, by the unit id tagged on it."""
    out: dict[str, UnitService] = {}
    for cell in range(cells):
        cluster = cluster_name(deployment, cell)
        arns: list[str] = []
        token: str | None = None
        while True:
            page = ecs.list_services(cluster=cluster, **({"nextToken": token} if token else {}))
            arns += page.get("serviceArns", [])
            token = page.get("nextToken")
            if not token:
                break
        for start in range(0, len(arns), 10):  # DescribeServices takes at most 10 services
            described = ecs.describe_services(cluster=cluster, services=arns[start : start + 10], include=["TAGS"])
            for svc in described.get("services", []):
                tags = {t.get("key"): t.get("value") for t in svc.get("tags", [])}
                unit_id = tags.get(TAG_UNIT)
                if not unit_id or svc.get("status") != "ACTIVE":
                    continue
                events = svc.get("events") or []
                out[unit_id] = UnitService(
                    unit_id=unit_id,
                    cluster=cluster,
                    arn=svc["serviceArn"],
                    desired=int(svc.get("desiredCount", 0)),
                    running=int(svc.get("runningCount", 0)),
                    pending=int(svc.get("pendingCount", 0)),
                    event=str(events[0].get("message", "")) if events else "",
                )
    return out


def router_log_group(logs: Any, deployment: str) -> str | None:
    """The Router stack's log group (CloudFormation names it <deployment>-Router-Logs<suffix>), or
    None before the Router stack exists."""
    groups = logs.describe_log_groups(logGroupNamePrefix=f"{deployment}-Router-Logs").get("logGroups", [])
    return str(groups[0]["logGroupName"]) if groups else None


def unit_reports(logs: Any, group: str, now: float) -> dict[str, dict[str, Any]]:
    """The newest state any router reported for each unit within REPORT_MAX_AGE_S."""
    newest: dict[str, tuple[float, dict[str, Any]]] = {}
    lines = json_lines(
        logs, group, pattern=UNIT_STATES_FILTER, event=UNIT_STATES_EVENT, start_s=now - REPORT_MAX_AGE_S, end_s=now
    )
    for at, line in lines:
        ts = float(line.get("ts", at))
        for unit_id, state in (line.get("units") or {}).items():
            if isinstance(state, dict) and (unit_id not in newest or newest[unit_id][0] < ts):
                newest[unit_id] = (ts, state)
    return {unit_id: state for unit_id, (_, state) in newest.items()}


def _query(qid: str, name: str, stat: str, period: int) -> dict[str, Any]:
    return {
        "Id": qid,
        "MetricStat": {
            "Metric": {
                "Namespace": contract.METRICS_NAMESPACE,
                "MetricName": name,
                "Dimensions": [{"Name": contract.METRIC_DIM_SERVICE, "Value": contract.METRIC_SERVICE_VALUE}],
            },
            "Period": period,
            "Stat": stat,
        },
        "ReturnData": True,
    }


def traffic(cloudwatch: Any, now: float, window_s: float) -> Traffic:
    """The routers' requests and 429s per second, minute by minute over the window (summed over
    routers: each writes its own interval's counts), and the leaders' p99 time to first token over
    the last five minutes. The newest complete minute is the current rate."""
    end = datetime.fromtimestamp(now // 60 * 60, tz=timezone.utc)
    start = datetime.fromtimestamp(now // 60 * 60 - window_s, tz=timezone.utc)
    got = cloudwatch.get_metric_data(
        MetricDataQueries=[
            _query("requests", METRIC_REQUESTS, "Sum", 60),
            _query("busy", METRIC_BUSY_REFUSALS, "Sum", 60),
            _query("ttft", contract.METRIC_TIME_TO_FIRST_TOKEN, "p99", 300),
        ],
        StartTime=start,
        EndTime=end,
        ScanBy="TimestampAscending",
    )
    series = {r["Id"]: list(zip(r.get("Timestamps", []), r.get("Values", []))) for r in got["MetricDataResults"]}
    requests = [(ts.timestamp(), v / 60) for ts, v in series.get("requests", [])]
    busy = [v / 60 for _, v in series.get("busy", [])]
    ttft = [v for _, v in series.get("ttft", []) if math.isfinite(v)]
    return Traffic(
        request_rate=requests[-1][1] if requests else 0.0,
        busy_rate=busy[-1] if busy else 0.0,
        ttft_p99_s=ttft[-1] / 1000 if ttft else None,  # the metric is in milliseconds
        history=tuple(requests),
    )
