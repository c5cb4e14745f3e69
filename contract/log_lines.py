"""JSON log lines from CloudWatch Logs, read the one way the cloud scaler (its signals) and the
operations CLI (`flotilla scale show`) both read them. Takes a boto3 logs client; imports none.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any


def json_lines(
    logs: Any, group: str, *, pattern: str, event: str, start_s: float, end_s: float, max_pages: int = 20
) -> Iterator[tuple[float, dict[str, Any]]]:
    """(event time in seconds, the line) of each JSON log line of `event` in the group between the
    two times. `pattern` filters server side (CloudWatch Logs JSON filter pattern); lines are checked
    again here, and a line that is not JSON is skipped."""
    kwargs: dict[str, Any] = {
        "logGroupName": group,
        "startTime": int(start_s * 1000),
        "endTime": int(end_s * 1000) + 1,
        "filterPattern": pattern,
    }
    for _ in range(max_pages):
        page = logs.filter_log_events(**kwargs)
        for item in page.get("events", []):
            try:
                line = json.loads(item.get("message", ""))
            except ValueError:
                continue
            if isinstance(line, dict) and line.get("event") == event:
                yield item.get("timestamp", 0) / 1000, line
        token = page.get("nextToken")
        if not token:
            return
        kwargs["nextToken"] = token
