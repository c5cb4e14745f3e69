"""What the router records of each request: its trace (filled in along the way) and the JSON access
log line with the deployment metrics as EMF, written in batches."""

from __future__ import annotations

import asyncio
import sys
import time
import uuid

from aiohttp import web

import contract
from runtime import emf, logs
from runtime.router.access import KEY_ID
from runtime.router.fleet import Member

perf_counter = time.perf_counter


class AccessLog:
    """JSON lines on stderr, written in batches (one write every flush_interval_s at most) so the
    log costs the router a fraction of a syscall per request; flushed on close."""

    def __init__(self, *, flush_interval_s: float = 0.2, stream=None) -> None:
        self._stream = stream if stream is not None else sys.stderr
        self._lines: list[str] = []
        self._interval = flush_interval_s
        self._scheduled = False

    def write(self, record: dict) -> None:
        self._lines.append(logs.dumps(record))
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_later(self._interval, self.flush)

    def flush(self) -> None:
        self._scheduled = False
        if self._lines:
            lines, self._lines = self._lines, []
            self._stream.write("\n".join(lines) + "\n")
            self._stream.flush()


class Trace:
    """What the access log needs to know about one request, filled in along the way. `id` is the
    router's own id of the request: the client's X-Request-Id is a correlation id that two clients
    may share, so nothing the router keeps is filed under it."""

    __slots__ = ("id", "attempts", "first_byte", "shed", "added_s", "fault", "moves", "left")

    def __init__(self) -> None:
        self.id = uuid.uuid4().hex
        self.attempts = 0
        self.first_byte = 0.0
        self.shed = False
        self.added_s: float | None = None  # the router's own share of the wait, once headers went out
        self.fault = False  # the router itself failed the request (an exception escaped routing)
        self.moves = 0  # attempts given up because their unit left routing before its first byte
        self.left: list[Member] = []  # those units: a stream that later moves avoids them too


def access_document(
    request: web.Request,
    request_id: str,
    resp: web.StreamResponse | None,
    trace: Trace,
    arrival: float,
    t0: float,
) -> dict:
    """One JSON line per routed request (sheds are only counted: an overload must not flood the
    logs). Same shape as the node's request lines, so one query follows a request id."""
    first = trace.first_byte
    rec = logs.record(
        "router_request",
        request_id=request_id,
        key_id=request.get(KEY_ID),
        method=request.method,
        path=request.path,
        status=resp.status if resp is not None else (500 if trace.fault else 499),
        unit=resp.headers.get(contract.UNIT_HEADER, "") if resp is not None else "",
        revision=resp.headers.get(contract.REVISION_HEADER, "") if resp is not None else "",
        id=trace.id,
        completion_id=resp.headers.get(contract.COMPLETION_ID_HEADER, "") if resp is not None else "",
        attempts=trace.attempts,
        arrival=round(arrival, 6),
        first_byte_ms=round(1000 * (first - t0), 3) if first else None,
        duration_ms=round(1000 * (perf_counter() - t0), 3),
    )
    added_ms = None if trace.added_s is None else 1000 * trace.added_s
    return emf.router_request_document(rec, added_latency_ms=added_ms, fault=trace.fault)
