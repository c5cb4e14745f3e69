"""Unit health as the routers see it, from their CloudWatch Logs: every router writes one
`unit_states` line per cell each minute (runtime/router/unit_report.py). This is how `status` reads
health from outside the VPC: no security group opens, no process on the nodes; the caller needs
only logs:DescribeLogGroups and logs:FilterLogEvents on the router's log group.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

from ops.aws import Aws
from ops.errors import OpsError

EVENT = "unit_states"  # runtime/router/unit_report.py EVENT (ops does not import runtime/)
# A JSON filter pattern: CloudWatch Logs matches it server side, so the access log lines of a busy
# router are not downloaded ("{ $.eventType = "UpdateTrail" }" form — CloudWatch Logs
# FilterAndPatternSyntax.html). Lines are checked again here.
FILTER = '{ $.event = "unit_states" }'
MAX_AGE_S = 180  # three report intervals: older lines say nothing about now
MAX_PAGES = 20


def json_log_lines(aws: Aws, kwargs: dict[str, Any], pages: int) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(event, its JSON object) for each line FilterLogEvents finds with `kwargs`, page by page (at most
    `pages`, each continued by its nextToken); a line that is not a JSON object is passed over."""
    kwargs = dict(kwargs)
    for _ in range(pages):
        page = aws.logs.filter_log_events(**kwargs)
        for event in page.get("events", []):
            try:
                line = json.loads(event.get("message", ""))
            except ValueError:
                continue
            if isinstance(line, dict):
                yield event, line
        token = page.get("nextToken")
        if not token:
            return
        kwargs["nextToken"] = token


def router_log_group(aws: Aws, deployment: str) -> str:
    """The Router stack's log group: CloudFormation names it <stack>-<logical id>-<suffix>."""
    prefix = f"{deployment}-Router-Logs"
    groups = aws.logs.describe_log_groups(logGroupNamePrefix=prefix).get("logGroups", [])
    if not groups:
        raise OpsError(f"no log group named {prefix}*: is the Router stack of {deployment!r} deployed in this region?")
    return str(groups[0]["logGroupName"])


def read_unit_states(aws: Aws, deployment: str, *, now: float | None = None) -> tuple[dict[str, dict[str, Any]], str]:
    """The newest state any router reported for each unit within MAX_AGE_S, and the log group read."""
    group = router_log_group(aws, deployment)
    now = time.time() if now is None else now
    kwargs: dict[str, Any] = {
        "logGroupName": group,
        "startTime": int((now - MAX_AGE_S) * 1000),
        "endTime": int(now * 1000) + 1,
        "filterPattern": FILTER,
    }
    newest: dict[str, tuple[float, dict[str, Any]]] = {}
    for event, line in json_log_lines(aws, kwargs, MAX_PAGES):
        if line.get("event") != EVENT:
            continue
        ts = float(line.get("ts", event.get("timestamp", 0) / 1000))
        for unit_id, state in (line.get("units") or {}).items():
            if unit_id not in newest or newest[unit_id][0] < ts:
                newest[unit_id] = (ts, {**state, "age_s": round(now - ts)})
    return {u: s for u, (_, s) in newest.items()}, group
