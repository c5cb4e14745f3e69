"""The router's public HTTP server: /health for the ALB and the proxied OpenAI API (/v1/...), nothing
else (/metrics has its own port, runtime/router/metrics_port.py).

Each request goes to the least-loaded routable unit; it moves to another unit while nothing has
reached the client (connect failure, 503/429 before the first byte). Responses stream through as the
unit writes them. A generation stream that breaks half-way (the unit died, failed, drains, or fell
silent) continues on another unit from the tokens its client already has, at most max_moves times
(runtime/router/resume.py); a stream that cannot move ends with an SSE error event, never a replay.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import socket
import sys
import time
import uuid
from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

import contract
from contract.ready import stall_bound
from runtime import emf, logs
from runtime.router import balance, unit_report
from runtime.router.access import KEY_ID, AccessControl
from runtime.router.admission import AdmissionControl
from runtime.router.discovery import Discovery
from runtime.router.fleet import Fleet, Member
from runtime.router.metrics import RouterMetrics
from runtime.router.metrics_port import MetricsServer
from runtime.router.resume import RESUMABLE_PATHS, StreamLedger, resumable_request
from runtime.router.settings import RouterSettings

log = logging.getLogger("flotilla.router")

# Headers that describe one hop, not the message (RFC 9110 §7.6.1), plus the ones aiohttp recomputes.
_HOP_BY_HOP = frozenset(
    h.lower()
    for h in (
        *contract.INTERNAL_HEADERS,  # router <-> leader only: a client's copy never reaches a leader
        "Connection",
        "Keep-Alive",
        "Proxy-Authenticate",
        "Proxy-Authorization",
        "Proxy-Connection",
        "TE",
        "Trailer",
        "Transfer-Encoding",
        "Upgrade",
        "Host",
        "Content-Length",
    )
)
_REQUEST_ID_RE = re.compile(contract.REQUEST_ID_PATTERN)
_SSE_BOUNDARIES = (b"\n\n", b"\r\n\r\n")
_REFUSAL_BODY_LIMIT = 64 * 1024
# A resumable stream a unit ended for want of a batch slot (server.MOVABLE_ENDINGS): "handover_" + its code.
_HANDOVER_QUEUE_TIMEOUT = "handover_" + contract.BUSY_CODE_QUEUE_TIMEOUT
_MOVE_WAIT_S = 0.25  # how often a stream waiting to move looks for a free slot again (a report period)
_WHOLE_BODY_LIMIT = 1024 * 1024  # bodies of known length up to this are relayed in one piece
perf_counter = time.perf_counter


class SseFramer:
    """Passes an SSE body through in whole events: each feed returns the complete events so far and
    holds back a trailing partial one (at most max_hold bytes), so an error event appended after a
    failure always starts on an event boundary and parses."""

    __slots__ = ("_pending", "_max_hold")

    def __init__(self, max_hold: int) -> None:
        self._pending = b""
        self._max_hold = max_hold

    def feed(self, chunk: bytes) -> bytes:
        data = self._pending + chunk if self._pending else chunk
        cut = 0
        for boundary in _SSE_BOUNDARIES:
            at = data.rfind(boundary)
            if at >= 0:
                cut = max(cut, at + len(boundary))
        if cut == 0 and len(data) > self._max_hold:
            cut = len(data)  # not SSE after all: never hold more than max_hold back
        self._pending = data[cut:]
        return data[:cut]

    def flush(self) -> bytes:
        rest, self._pending = self._pending, b""
        return rest


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


class _Trace:
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


class _Retry(Exception):
    """This attempt failed before anything reached the client; another unit may take it."""

    def __init__(self, reason: str, refusal: web.Response | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.refusal = refusal


class _UnitLeft(Exception):
    """The unit a request waits on left routing for a failure (see _Departure)."""


# Member states whose leader hands its requests over itself (a drain: runtime/node/server.py), so a
# request waiting on such a unit is left to it.
_HANDS_OVER = frozenset({"draining", "stopped"})


class _Departure:
    """Whether the unit a request waits on left routing for a failure (silent, unreachable, its
    engine stalled, broken) and stayed out for grace_s, while another unit is routable: a unit whose
    report was merely late is back at its next line and keeps the request, and with no other unit to
    go to, waiting for this one is the request's best chance."""

    __slots__ = ("unit", "fleet", "grace_s", "since")

    def __init__(self, unit: Member, fleet: Fleet, grace_s: float) -> None:
        self.unit = unit
        self.fleet = fleet
        self.grace_s = grace_s
        self.since: float | None = None  # loop time it was first seen out

    def gone(self, now: float) -> bool:
        u = self.unit
        if u.ready or u.state in _HANDS_OVER:
            self.since = None
            return False
        if self.since is None:
            self.since = now
        return now - self.since >= self.grace_s and self.fleet.routable_count() > 0


def _restartable(request: web.Request) -> bool:
    """A request that may start again on another unit once its first unit gave up before answering:
    a read, or a generation (it changes nothing on the unit; the first unit's answer is never read,
    as its connection is closed first, so the client gets exactly one)."""
    return request.method in ("GET", "HEAD") or (request.method == "POST" and request.path in RESUMABLE_PATHS)


class _Wait:
    """A bounded wait (asyncio.timeout) that, given a departure watch, also ends as soon as its unit
    left routing for a failure: it looks every `period` seconds and then fires the timeout at once,
    with `left` set. The awaited call is cancelled like on any timeout, which closes the unit's
    connection; the wait itself stays a plain await (no task in between), so a chunk reaches the
    client as soon as it arrives."""

    __slots__ = ("_timeout", "_departure", "_period", "_handle", "left")

    def __init__(self, timeout_s: float, departure: _Departure | None, period: float) -> None:
        self._timeout = asyncio.timeout(timeout_s)
        self._departure = departure
        self._period = period
        self._handle: asyncio.TimerHandle | None = None
        self.left = False

    async def __aenter__(self) -> _Wait:
        await self._timeout.__aenter__()
        if self._departure is not None:
            self._handle = asyncio.get_running_loop().call_later(self._period, self._look)
        return self

    def _look(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._departure is not None
        if self._timeout.expired():  # it fired in this same loop turn: nothing left to cut short
            return
        if self._departure.gone(loop.time()):
            self.left = True
            # A deadline now: the timeout fires at the loop's next turn, as any asyncio.timeout does
            # (https://docs.python.org/3.11/library/asyncio-task.html#asyncio.Timeout.reschedule).
            self._timeout.reschedule(loop.time())
        else:
            self._handle = loop.call_later(self._period, self._look)

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self._handle is not None:
            self._handle.cancel()
        await self._timeout.__aexit__(exc_type, exc, tb)  # raises TimeoutError when it fired


def error_response(
    status: int,
    message: str,
    *,
    code: str,
    err_type: str,
    request_id: str,
    retry_after: int | None = None,
    close: bool = False,
) -> web.Response:
    """An error in OpenAI's shape, so SDK clients surface the message."""
    headers = {contract.REQUEST_ID_HEADER: request_id}
    if retry_after is not None:
        headers["Retry-After"] = str(retry_after)
    if close:
        headers["Connection"] = "close"
    body = {"error": {"message": message, "type": err_type, "param": None, "code": code}}
    return web.Response(status=status, headers=headers, body=json.dumps(body).encode(), content_type="application/json")


def _busy_answer(raw: bytes) -> bool:
    """The refusal's OpenAI error code says the unit is full (contract.BUSY_CODES)."""
    try:
        code = json.loads(raw)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return False
    return code in contract.BUSY_CODES


def sse_error_event(message: str, *, code: str) -> bytes:
    body = {"error": {"message": message, "type": "upstream_error", "param": None, "code": code}}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


class Router:
    """The proxy: owns the fleet view, the metrics and the aiohttp server."""

    def __init__(
        self,
        *,
        settings: RouterSettings,
        discovery: Discovery,
        admission: AdmissionControl | None = None,
        access: AccessControl | None = None,
    ) -> None:
        self.settings = settings
        self.fleet = Fleet(settings=settings, discovery=discovery)
        self.admission = admission
        self.fleet.admission = admission
        self._unit_report: asyncio.Task | None = None
        self.metrics = RouterMetrics(self.fleet)
        self.metrics.inflight.set_function(lambda: self.inflight)  # read at scrape, not per request
        self.metrics_server = MetricsServer(self.metrics.registry, settings.metrics_host, settings.metrics_port)
        self.access_log = AccessLog()
        self.access = access  # API keys and per-key limits, checked before a request reaches the proxy
        if access is not None:
            access.bind(fleet=self.fleet, settings=settings, registry=self.metrics.registry)
        self.healthy = True  # /health answer; False from the moment a drain starts
        self.refusing = False  # after the drain grace: new requests get 503 + close
        self.inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._runner: web.AppRunner | None = None
        self.port: int | None = None
        self.app = self._build_app()

    # --- lifecycle ---------------------------------------------------------------------------
    def _build_app(self) -> web.Application:
        middlewares = [self.access.middleware] if self.access is not None else []
        app = web.Application(client_max_size=self.settings.max_body_bytes, middlewares=middlewares)
        app.router.add_get(contract.ROUTER_HEALTH_PATH, self.handle_health)
        app.router.add_route("*", "/v1/{tail:.*}", self.handle_proxy)  # contract.API_PATH_PATTERN
        return app

    async def start(self) -> None:
        if self.admission is not None:
            await self.admission.start()
        if self.access is not None:
            await self.access.start()
        await self.fleet.start()
        await self.metrics_server.start()
        self._unit_report = asyncio.create_task(
            unit_report.report_loop(self.fleet, self.settings.ready_units_interval_s, self.metrics.registry),
            name="unit report",
        )
        # handler_cancellation: a client that hangs up before a plain (non-streamed) answer cancels
        # its handler, which closes the unit connection, so the unit cancels the work and frees its
        # batch slot. Off by default, opt-in since aiohttp 3.9 (aio-libs/aiohttp#7056):
        # https://docs.aiohttp.org/en/stable/web_advanced.html#web-handler-cancellation
        # auto_decompress=False: a compressed request body goes to the unit as it came, with its
        # Content-Encoding; decoding it here and forwarding that header made the unit decode twice.
        self._runner = web.AppRunner(
            self.app, access_log=None, handle_signals=False, handler_cancellation=True, auto_decompress=False
        )
        await self._runner.setup()
        sock = socket.socket(socket.AF_INET6 if ":" in self.settings.host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.settings.host, self.settings.port))
        sock.setblocking(False)
        self.port = sock.getsockname()[1]
        site = web.SockSite(self._runner, sock, backlog=1024)
        await site.start()
        log.info(
            "router listening on %s:%d with %d member(s) discovered",
            self.settings.host,
            self.port,
            len(self.fleet.members),
        )

    async def drain(self) -> bool:
        """SIGTERM: /health fails at once, keep serving for the grace period so the load balancer
        notices, then refuse new requests and wait for the in-flight ones. True if all finished."""
        if not self.healthy:
            return self._idle.is_set()
        log.info("draining: /health now answers 503; serving %d in-flight request(s)", self.inflight)
        self.healthy = False
        self.metrics.draining.set(1)
        await asyncio.sleep(self.settings.drain_grace_s)
        self.refusing = True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout=self.settings.drain_timeout_s)
        except asyncio.TimeoutError:
            log.error(
                "drain timeout (%.0f s) with %d request(s) still in flight",
                self.settings.drain_timeout_s,
                self.inflight,
            )
            return False
        log.info("drained: no request in flight")
        return True

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        await self.metrics_server.close()
        if self._unit_report is not None:
            self._unit_report.cancel()
            await asyncio.gather(self._unit_report, return_exceptions=True)
        await self.fleet.close()
        if self.admission is not None:
            await self.admission.close()
        if self.access is not None:
            await self.access.close()
        self.access_log.flush()

    # --- local endpoints ---------------------------------------------------------------------
    async def handle_health(self, request: web.Request) -> web.Response:
        # Alive and serving, independent of the units: the ALB must not pull routers because a
        # unit is down (that would turn one unit's failure into a full outage).
        if self.healthy:
            return web.json_response({"status": "ok", "routable_units": self.fleet.routable_count()})
        return web.json_response({"status": "draining"}, status=503)

    # --- the proxy ---------------------------------------------------------------------------
    async def handle_proxy(self, request: web.Request) -> web.StreamResponse:
        t0 = perf_counter()
        request_id = request.headers.get(contract.REQUEST_ID_HEADER)
        if request_id is None:
            request_id = uuid.uuid4().hex
        elif not _REQUEST_ID_RE.match(request_id):
            return error_response(
                400,
                f"{contract.REQUEST_ID_HEADER} must be 1-128 characters of A-Z a-z 0-9 . _ : - "
                f"(got {request_id[:40]!r}); send a valid id or none and the router makes one",
                code="invalid_request_id",
                err_type="invalid_request_error",
                request_id=request_id[:128],
            )
        if self.refusing:
            self.metrics.shed.labels("draining").inc()
            return error_response(
                503,
                "this router is shutting down; retry",
                code="router_draining",
                err_type="service_unavailable",
                request_id=request_id,
                retry_after=self.settings.retry_after_s,
                close=True,
            )
        arrival = time.time()
        try:
            # Bounded: a client that trickles its body in must not hold a request open for ever.
            async with asyncio.timeout(self.settings.idle_stream_timeout_s):
                body = await request.read()
        except TimeoutError:
            return error_response(
                408,
                f"the request body did not arrive within {self.settings.idle_stream_timeout_s:g} s: send it whole",
                code="body_timeout",
                err_type="invalid_request_error",
                request_id=request_id,
                close=True,
            )
        except web.RequestPayloadError:
            return error_response(
                400,
                "the request body could not be read (broken chunked framing?): send it with a Content-Length",
                code="unreadable_body",
                err_type="invalid_request_error",
                request_id=request_id,
                close=True,
            )
        self.inflight += 1
        self._idle.clear()
        resp: web.StreamResponse | None = None
        trace = _Trace()
        try:
            resp = await self._route(request, body, request_id, t0, trace)
            return resp
        except asyncio.CancelledError:
            raise  # the client went away: not the router's fault
        except Exception:
            trace.fault = True  # aiohttp answers 500: a router revision's bug, which its rollback is for
            raise
        finally:
            self.inflight -= 1
            if self.inflight == 0:
                self._idle.set()
            if self.settings.access_log and not trace.shed:
                self._access_log(request, request_id, resp, trace, arrival, t0)

    def _access_log(
        self,
        request: web.Request,
        request_id: str,
        resp: web.StreamResponse | None,
        trace: _Trace,
        arrival: float,
        t0: float,
    ) -> None:
        """One JSON line per routed request (sheds are only counted: an overload must not flood
        the logs). Same shape as the node's request lines, so one query follows a request id."""
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
        self.access_log.write(emf.router_request_document(rec, added_latency_ms=added_ms, fault=trace.fault))

    async def _route(
        self, request: web.Request, body: bytes, request_id: str, t0: float, trace: _Trace
    ) -> web.StreamResponse:
        if self.admission is not None and not self.admission.admits():
            trace.shed = True
            return self._shed("admission", request_id)
        headers = self._upstream_headers(request, request_id)
        key = balance.request_key(body, request.headers.get(contract.SESSION_HEADER))
        if key.key is not None:  # the leader reports it back to every router (docs/routing.md)
            headers[contract.ROUTE_KEY_HEADER] = str(key.key)
            if key.prompt:
                length, tail, marks = key.prompt_summary
                headers[contract.ROUTE_PROMPT_HEADER] = f"{length}:{tail}"
                headers[contract.ROUTE_MARKS_HEADER] = ",".join(map(str, marks))
        if self.settings.max_moves and resumable_request(request.method, request.path, headers):
            headers[contract.RESUME_HEADER] = "1"
        tried: tuple[Member, ...] = ()
        refusal: web.Response | None = None
        for _ in range(self.settings.max_attempts):
            pick = self.fleet.pick(tried, key)
            unit = pick.unit
            if unit is None:
                if refusal is not None:
                    return refusal  # every unit we could try refused: pass the last answer on
                trace.shed = True
                return self._shed(pick.reason, request_id)
            unit.outstanding += 1
            trace.attempts = len(tried) + 1
            try:
                return await self._attempt(unit, request, body, headers, request_id, t0, trace, key)
            except _Retry as retry:
                self.metrics.retries.labels(retry.reason).inc()
                tried += (unit,)
                refusal = retry.refusal or refusal
            finally:
                unit.outstanding -= 1
                if unit.removed:
                    self.fleet.retire_if_idle(unit)
        if refusal is not None:
            return refusal
        return self._shed("no_unit", request_id)

    def _shed(self, reason: str, request_id: str) -> web.Response:
        self.metrics.shed.labels(reason).inc()
        if reason == "admission":
            return error_response(
                429,
                "the service is shedding load during an incident; retry after the Retry-After delay",
                code="load_shed",
                err_type="rate_limit_error",
                request_id=request_id,
                retry_after=self.settings.retry_after_s,
            )
        if reason == "saturated":
            return error_response(
                429,
                "every unit is at capacity; retry after the Retry-After delay",
                code="overloaded",
                err_type="rate_limit_error",
                request_id=request_id,
                retry_after=self.fleet.retry_after_s(),
            )
        return error_response(
            503,
            "no unit is ready to serve; retry after the Retry-After delay",
            code="no_unit_ready",
            err_type="service_unavailable",
            request_id=request_id,
            retry_after=self.settings.retry_after_s,
        )

    @staticmethod
    def _upstream_headers(request: web.Request, request_id: str) -> dict[str, str]:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        headers[contract.REQUEST_ID_HEADER] = request_id
        peer = request.remote
        if peer:
            prior = request.headers.get("X-Forwarded-For")
            headers["X-Forwarded-For"] = f"{prior}, {peer}" if prior else peer
        return headers

    async def _attempt(
        self,
        unit: Member,
        request: web.Request,
        body: bytes,
        headers: dict[str, str],
        request_id: str,
        t0: float,
        trace: _Trace,
        key: balance.RequestKey | None = None,
    ) -> web.StreamResponse:
        s = self.settings
        session = unit.session
        if session is None or session.closed:
            raise _Retry("unit_closed")
        t_sent = perf_counter()
        # A request waiting for its first byte may start again elsewhere if its unit leaves routing
        # (a stopped leader, a hung engine): it counts against the move budget.
        departure = (
            _Departure(unit, self.fleet, s.stale_after_s)
            if trace.moves < s.max_moves and _restartable(request)
            else None
        )
        waiting = _Wait(s.first_byte_timeout_s, departure, self._watch_period())
        try:
            async with waiting:
                upstream = await session.request(
                    request.method,
                    unit.url + request.rel_url.raw_path_qs,
                    headers=headers,
                    data=body if body else None,
                    allow_redirects=False,
                )
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            unit.mark_unready("unreachable")
            log.warning(
                "request %s: cannot connect to unit %s (%s): %s; trying another unit",
                request_id,
                unit.unit,
                unit.url,
                exc,
            )
            raise _Retry("connect") from exc
        except aiohttp.ServerDisconnectedError as exc:
            # The unit closed the connection before answering (it died, or a keep-alive race):
            # nothing reached the client, so another unit may take the request.
            raise _Retry("disconnected") from exc
        except aiohttp.ClientOSError as exc:
            unit.mark_unready("unreachable")
            raise _Retry("connect") from exc
        except TimeoutError:
            if waiting.left:
                # Nothing of it reached the client, and its connection is closed (the unit cancels
                # the work once it runs again), so it starts whole elsewhere: never two answers.
                trace.moves += 1
                trace.left.append(unit)
                log.warning(
                    "request %s: unit %s left routing (%s) before answering; starting it on another unit "
                    "(move %d of %d)",
                    request_id,
                    unit.unit,
                    unit.state,
                    trace.moves,
                    s.max_moves,
                )
                raise _Retry("left_before_first_byte") from None
            log.error(
                "request %s: unit %s sent no response within %.1f s", request_id, unit.unit, s.first_byte_timeout_s
            )
            self.metrics.upstream_errors.labels("first_byte_timeout").inc()
            return error_response(
                504,
                f"unit {unit.unit} did not answer within {s.first_byte_timeout_s:g} s",
                code="unit_timeout",
                err_type="upstream_error",
                request_id=request_id,
            )
        t_first = perf_counter()
        status = upstream.status
        if status == 503 or status == 429:
            await self._refused(unit, upstream, request_id)
        length = upstream.content_length
        try:
            if (
                length is not None
                and length <= _WHOLE_BODY_LIMIT
                and not upstream.headers.get("Content-Type", "").startswith("text/event-stream")
            ):
                resp = await self._relay_whole(unit, upstream, request_id, t_sent - t0, t_first, trace)
                trace.first_byte = perf_counter()
            else:
                resp = await self._relay(
                    unit,
                    request,
                    upstream,
                    request_id,
                    t_sent - t0,
                    t_first,
                    trace,
                    body=body,
                    headers=headers,
                    route_key=key,
                )
        finally:
            upstream.release()
        self.metrics.count_routed(unit.unit, status)
        return resp

    def _watch_period(self) -> float:
        """How often a wait looks whether its unit left routing: a few times per grace period."""
        return max(0.05, self.settings.stale_after_s / 3)

    async def _relay_whole(
        self,
        unit: Member,
        upstream: aiohttp.ClientResponse,
        request_id: str,
        before_send: float,
        t_first: float,
        trace: _Trace,
    ) -> web.Response:
        """A small body of known length (a non-streamed completion): read it, then answer at once.

        One write to the client instead of three, and a unit that dies before the body is complete
        has sent nothing to the client yet, so the request may still move to another unit.
        """
        try:
            async with asyncio.timeout(self.settings.idle_stream_timeout_s):
                raw = await upstream.read()
        except TimeoutError:
            upstream.close()
            self.metrics.upstream_errors.labels("idle_timeout").inc()
            return error_response(
                504,
                f"unit {unit.unit} stopped sending its response for {self.settings.idle_stream_timeout_s:g} s",
                code="idle_timeout",
                err_type="upstream_error",
                request_id=request_id,
            )
        except (aiohttp.ClientError, OSError) as exc:
            upstream.close()
            log.warning(
                "request %s: unit %s failed before its response was complete (%s); trying another unit",
                request_id,
                unit.unit,
                exc.__class__.__name__,
            )
            raise _Retry("broken_before_client") from exc
        headers = CIMultiDict((k, v) for k, v in upstream.headers.items() if k.lower() not in _HOP_BY_HOP)
        headers[contract.REQUEST_ID_HEADER] = request_id
        trace.added_s = before_send + (perf_counter() - t_first)
        self.metrics.added_latency.observe(trace.added_s)
        return web.Response(status=upstream.status, reason=upstream.reason, body=raw, headers=headers)

    async def _refused(self, unit: Member, upstream: aiohttp.ClientResponse, request_id: str) -> None:
        """A 503 (draining, not ready) or 429 (full) before the first byte: keep the answer in case
        no other unit can take the request, and move on.

        Busy is not broken: a full unit stays in rotation, or one overload would eject unit after
        unit from every router that saw a refusal and end as a fleet-wide outage. The ALB likewise
        judges a target only by its health check, never by the answers it gives
        (https://docs.aws.amazon.com/elasticloadbalancing/latest/application/target-group-health-checks.html).
        Only a 503 that is not a busy answer (contract.BUSY_CODES: an older revision said
        queue_timeout with 503) means the unit stopped serving; its next report says why."""
        try:
            async with asyncio.timeout(self.settings.connect_timeout_s):
                raw = await upstream.content.read(_REFUSAL_BODY_LIMIT)
        except (aiohttp.ClientError, TimeoutError):
            raw = b""
        finally:
            upstream.release()
        status = upstream.status
        if status == 503 and not _busy_answer(raw):
            unit.mark_unready("refused")  # draining or not ready: the next report tells which
        refusal_headers = {
            contract.REQUEST_ID_HEADER: request_id,
            "Retry-After": upstream.headers.get("Retry-After", str(self.settings.retry_after_s)),
        }
        ctype = upstream.headers.get("Content-Type")
        if ctype:
            refusal_headers["Content-Type"] = ctype
        refusal = web.Response(status=status, body=raw, headers=refusal_headers)
        raise _Retry(f"unit_{status}", refusal)

    async def _relay(
        self,
        unit: Member,
        request: web.Request,
        upstream: aiohttp.ClientResponse,
        request_id: str,
        before_send: float,
        t_first: float,
        trace: _Trace,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        route_key: balance.RequestKey | None = None,
    ) -> web.StreamResponse:
        """Stream the body through as it arrives (SSE, chunked or large bodies); a resumable stream
        that breaks continues on another unit (_move_stream)."""
        s = self.settings
        resp = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        for key, value in upstream.headers.items():
            if key.lower() not in _HOP_BY_HOP:
                resp.headers.add(key, value)
        resp.headers[contract.REQUEST_ID_HEADER] = request_id
        if upstream.content_length is not None:
            resp.content_length = upstream.content_length
        is_sse = upstream.headers.get("Content-Type", "").startswith("text/event-stream")
        ledger = self._ledger(upstream, headers) if is_sse and upstream.status == 200 else None
        if ledger is not None:
            ledger.moves = trace.moves  # one budget: moves before the first byte count
            ledger.avoid.extend(trace.left)
        await resp.prepare(request)
        trace.first_byte = perf_counter()
        # Added latency: the router's work before sending, plus from the unit's headers to the
        # client's headers. The unit's own time to first byte is not the router's.
        trace.added_s = before_send + (perf_counter() - t_first)
        self.metrics.added_latency.observe(trace.added_s)
        framer = SseFramer(_WHOLE_BODY_LIMIT) if is_sse else None
        first = upstream  # released by _attempt; the units a stream moved to are released here
        held: list[Member] = []
        try:
            while True:
                reason, message = await self._pipe(request, resp, upstream, unit, framer, ledger)
                if reason is None:
                    return resp
                if ledger is not None and ledger.reported and s.max_moves:
                    moved = None
                    if ledger.moves < s.max_moves or reason == _HANDOVER_QUEUE_TIMEOUT:  # busy gives its move back
                        moved = await self._move_stream(
                            ledger, unit, request, body, headers or {}, request_id, reason, route_key
                        )
                    if moved is not None:
                        if upstream is not first:
                            upstream.release()
                        unit, upstream = moved
                        held.append(unit)
                        framer = SseFramer(_WHOLE_BODY_LIMIT)
                        continue
                    # The honest end of a stream that could not move: its own code, so a client (and
                    # the chaos check) tells it from a unit's own error.
                    if ledger.moves >= s.max_moves:
                        reason, message = (
                            "moves_exhausted",
                            f"{message}; the stream already moved {ledger.moves} time(s), its limit",
                        )
                    else:
                        reason, message = "no_unit_to_resume", f"{message}; no other unit could continue it"
                return await self._broken(request, resp, upstream, is_sse, request_id, unit, reason, message)
        finally:
            if upstream is not first:
                upstream.release()
            for u in held:
                u.outstanding -= 1
                if u.removed:
                    self.fleet.retire_if_idle(u)

    def _ledger(self, upstream: aiohttp.ClientResponse, headers: dict[str, str] | None) -> StreamLedger | None:
        """A ledger for a stream the router asked to be resumable (the leader's reports decide if it is)."""
        if headers is None or headers.get(contract.RESUME_HEADER) != "1":
            return None
        try:
            created = int(float(upstream.headers.get(contract.ARRIVAL_HEADER, "")))
        except ValueError:
            return None
        completion_id = upstream.headers.get(contract.COMPLETION_ID_HEADER, "")
        return StreamLedger(completion_id=completion_id, created=created) if completion_id else None

    async def _pipe(
        self,
        request: web.Request,
        resp: web.StreamResponse,
        upstream: aiohttp.ClientResponse,
        unit: Member,
        framer: SseFramer | None,
        ledger: StreamLedger | None,
    ) -> tuple[str | None, str]:
        """Copy one unit's body to the client until it ends: (None, "") when it ended well or the
        client left, else why it broke (reason, message)."""
        s = self.settings
        content = upstream.content
        departure = _Departure(unit, self.fleet, s.stale_after_s)
        while True:
            # A resumable stream that has produced tokens here counts silence past the stall bound as
            # a hung unit (a stopped member or a stuck collective); before its first token it may be
            # prefilling a long prompt, unless its unit left routing for a failure meanwhile. The bound
            # derives from the unit's own longest recent step, read afresh for every chunk: a busy
            # unit's long prefills and big batches are slow steps, not a hang.
            quiet = s.idle_stream_timeout_s
            if ledger is not None and ledger.since_move:
                quiet = min(quiet, stall_bound(s.stream_stall_s, unit.step_s, s.stream_stall_max_s))
            movable = ledger is not None and ledger.reported and ledger.moves < s.max_moves
            try:
                chunk = await self._next_chunk(content, quiet, departure if movable else None)
            except TimeoutError:
                steps = f" (its steps took up to {unit.step_s:g} s)" if unit.step_s else ""
                return "idle_timeout", f"unit {unit.unit} sent nothing for {quiet:g} s{steps}"
            except _UnitLeft:
                return "unit_left", f"unit {unit.unit} left routing ({unit.state}) with the stream waiting on it"
            except (aiohttp.ClientError, OSError) as exc:
                return (
                    "stream_broken",
                    f"unit {unit.unit} failed mid-response ({exc.__class__.__name__}); "
                    f"the partial output above is incomplete",
                )
            if not chunk:
                break
            moved: str | None = None
            if framer is not None:
                chunk = framer.feed(chunk)
                if ledger is not None:
                    chunk, moved = ledger.take(chunk)
            if chunk:
                try:
                    # Bounded like the unit's side: a client that accepts nothing counts as gone.
                    async with asyncio.timeout(s.idle_stream_timeout_s):
                        await resp.write(chunk)
                except (ConnectionError, aiohttp.ClientConnectionResetError, TimeoutError):
                    # The client went away: drop the unit connection so the unit cancels the work.
                    upstream.close()
                    if request.transport is not None:
                        request.transport.abort()
                    return None, ""
            if moved is not None:
                return f"handover_{moved}", f"unit {unit.unit} handed the stream over ({moved})"
        if ledger is not None and ledger.reported and not ledger.done:
            return "stream_broken", f"unit {unit.unit} ended the stream before its end; the output above is incomplete"
        try:
            rest = framer.flush() if framer is not None else b""
            if rest:
                await resp.write(rest)
            await resp.write_eof()
        except (ConnectionError, aiohttp.ClientConnectionResetError):
            pass  # the client left just as the response ended
        return None, ""

    async def _next_chunk(self, content: aiohttp.StreamReader, quiet: float, departure: _Departure | None) -> bytes:
        """The next piece of a unit's body within `quiet` seconds (TimeoutError past it); with a
        departure watch, _UnitLeft once the unit left routing for a failure with nothing arriving."""
        waiting = _Wait(quiet, departure, self._watch_period())
        try:
            async with waiting:
                chunk = await content.readany()
        except TimeoutError:
            if waiting.left:
                raise _UnitLeft from None
            raise
        if departure is not None:
            departure.since = None  # it spoke: out of routing or not, it is not hung
        return chunk

    async def _move_stream(
        self,
        ledger: StreamLedger,
        failed: Member,
        request: web.Request,
        body: bytes,
        headers: dict[str, str],
        request_id: str,
        reason: str,
        key: balance.RequestKey | None = None,
    ) -> tuple[Member, aiohttp.ClientResponse] | None:
        """Continue a broken stream on another unit: the original body plus the tokens its client has,
        sent to units other than the ones it already ran on, until one answers 200 or the move budget
        is spent. The new unit is counted outstanding until the caller releases it."""
        s = self.settings
        if reason in ("idle_timeout", "stream_broken"):
            failed.mark_unready(reason)  # hung or gone: no new request goes there before its next report
        continued = ledger.continuation(body)
        if continued is None:
            return None
        loop = asyncio.get_running_loop()
        busy = reason == _HANDOVER_QUEUE_TIMEOUT and not ledger.since_move
        if busy:
            # The unit had no batch slot free within its queue timeout (its load report and the move
            # raced): full, not failed. Its move is given back and the unit may take the stream once
            # a slot frees, within the wait that began when the stream first had to move.
            if ledger.avoid and ledger.avoid[-1] is failed and ledger.moves:
                ledger.avoid.pop()
                ledger.moves -= 1
            if ledger.move_deadline is None:
                ledger.move_deadline = loop.time() + s.first_byte_timeout_s
            deadline = ledger.move_deadline
            if loop.time() >= deadline:
                return None  # waited its whole bound: a unit that reports free slots it never gives ends here
            await asyncio.sleep(_MOVE_WAIT_S)
        else:
            ledger.avoid.append(failed)
            deadline = ledger.move_deadline = loop.time() + s.first_byte_timeout_s
        headers = {**headers, contract.CONTINUATION_HEADER: "1"}
        # Busy is not broken, for a move either: when no other unit has a free batch slot (or the
        # one asked answers 429), the stream waits for a slot to free as their answers end, up to
        # --first-byte-timeout, the bound on a unit's silence before a first byte, and a refusal
        # for being full does not spend the move budget. A continuation goes only to a unit with a
        # free slot: queued behind a full batch it could time out in the unit's queue, an error
        # the client would see. Without this, losing one unit of a full fleet failed every stream
        # on it: the survivors were full at that moment.
        while ledger.moves < s.max_moves:
            # By the same policy as a new request: the unit its cache key prefers, among the rest,
            # may hold the prompt's prefix and re-prefill only the generated part.
            full = self.fleet.full_units(tuple(ledger.avoid))
            pick = self.fleet.pick(tuple(ledger.avoid) + tuple(full), key)
            unit = pick.unit
            if unit is None and (full or pick.reason == "saturated") and loop.time() < deadline:
                await asyncio.sleep(_MOVE_WAIT_S)
                continue
            if unit is None or unit.session is None or unit.session.closed:
                return None
            ledger.moves += 1
            ledger.avoid.append(unit)
            self.metrics.retries.labels(f"move_{reason}").inc()
            log.warning(
                "request %s: %s on unit %s after %d token(s); continuing on unit %s (move %d of %d)",
                request_id,
                reason,
                failed.unit,
                ledger.sent,
                unit.unit,
                ledger.moves,
                s.max_moves,
            )
            unit.outstanding += 1
            try:
                async with asyncio.timeout(s.first_byte_timeout_s):
                    upstream = await unit.session.request(
                        request.method,
                        unit.url + request.rel_url.raw_path_qs,
                        headers=headers,
                        data=continued,
                        allow_redirects=False,
                    )
            except (aiohttp.ClientError, OSError, TimeoutError):
                unit.outstanding -= 1
                continue
            if upstream.status == 200 and upstream.headers.get("Content-Type", "").startswith("text/event-stream"):
                ledger.since_move = 0
                return unit, upstream
            # Refused (busy, draining, not ready): try the next unit. Busy is not broken, so the
            # refusal leaves the unit's routability to its own reports.
            upstream.release()
            unit.outstanding -= 1
            if upstream.status == 429 and loop.time() < deadline:
                ledger.moves -= 1  # full, not failed: the unit may take it once a slot frees
                ledger.avoid.remove(unit)
                await asyncio.sleep(_MOVE_WAIT_S)
        return None

    async def _broken(
        self,
        request: web.Request,
        resp: web.StreamResponse,
        upstream: aiohttp.ClientResponse,
        is_sse: bool,
        request_id: str,
        unit: Member,
        reason: str,
        message: str,
    ) -> web.StreamResponse:
        """The response already started, so it cannot move to another unit: end it visibly."""
        upstream.close()
        self.metrics.upstream_errors.labels(reason).inc()
        log.warning("request %s: %s", request_id, message)
        if is_sse:
            try:
                await resp.write(sse_error_event(message, code=reason))
                await resp.write_eof()
            except (ConnectionError, aiohttp.ClientConnectionResetError):
                pass
            return resp
        # A plain body cut short: close the connection so the client sees a truncated response
        # instead of a well-formed prefix.
        transport = request.transport
        if transport is not None:
            transport.abort()
        return resp
