"""One log format for every flotilla process: a JSON object per line on stderr, each with `ts`.

CloudWatch Logs Insights (and `jq` on a laptop) can then filter any process's output by field:
`event`, `unit`, `rank`, `request_id`. Call `setup_logging()` once at a process's entry point;
emit structured events with `jlog()`; a plain `logging` call still comes out as JSON (its text
under `msg`), so no line escapes the format.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import IO, Any

_FIELDS = "flotilla_fields"  # the LogRecord attribute jlog() stores its fields under
_log = logging.getLogger("flotilla")


def record(event: str, **fields: Any) -> dict[str, Any]:
    """The body of one log line: `ts` (unix seconds) and `event` first, then the fields."""
    return {"ts": round(time.time(), 6), "event": event, **fields}


def dumps(line: dict[str, Any]) -> str:
    return json.dumps(line, default=str)


class JsonFormatter(logging.Formatter):
    """Renders jlog() events as given and any other record as {"ts", "event": "log", "msg"}."""

    def format(self, rec: logging.LogRecord) -> str:
        fields = getattr(rec, _FIELDS, None)
        if fields is None:
            fields = {"event": "log", "msg": rec.getMessage()}
        line = {"ts": round(rec.created, 6), **fields, "level": rec.levelname.lower(), "logger": rec.name}
        if rec.exc_info:
            line["exc"] = self.formatException(rec.exc_info)
        return dumps(line)


def setup_logging(level: int | str = logging.INFO, stream: IO[str] | None = None) -> None:
    """Send every logger's records to `stream` (stderr) as JSON lines. Calling it again replaces
    the handler it installed before (and leaves any other, e.g. a test's capture, in place)."""
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter())
    setattr(handler, _FIELDS, True)
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _FIELDS, False)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)


def jlog(event: str, level: int = logging.INFO, *, logger: logging.Logger | None = None, **fields: Any) -> None:
    """One structured event: `jlog("unit_state", unit="u0", old="forming", new="ready")`."""
    (logger or _log).log(level, event, extra={_FIELDS: {"event": event, **fields}})
