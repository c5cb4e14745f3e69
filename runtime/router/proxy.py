"""The router's public HTTP server: /health for the ALB and the proxied OpenAI API (/v1/...), nothing
else (/metrics has its own port, runtime/router/metrics_port.py).

Each request goes to the least-loaded routable unit; it moves to another unit while nothing has
reached the client (connect failure, 503/429 before the first byte). Responses stream through as the
unit writes them. A generation stream that breaks half-way (the unit died, failed, drains, or fell
silent) continues on another unit from the tokens its client already has, at most max_moves times
(runtime/router/resume.py); a stream that cannot move ends with an SSE error event, never a replay.

The request path, top down, one responsibility per module of runtime/router/:
- intake: the request's id, its body within a bound, the headers a unit gets;
- routing: choosing a unit, unit after unit, and shedding when none takes the request;
- first_byte: one attempt on one unit, retried elsewhere while nothing reached the client;
- relay: streaming the answer through in whole SSE events, ending a broken stream visibly;
- moves: continuing a broken resumable stream on another unit;
- waits: bounded waits that end early when their unit left routing for a failure;
- answers: the errors the router answers itself;
- accounting: the request's trace and its access log line.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time

from aiohttp import web

import contract
from runtime.router import answers, intake, unit_report
from runtime.router.access import AccessControl
from runtime.router.accounting import AccessLog, Trace, access_document
from runtime.router.admission import AdmissionControl
from runtime.router.discovery import Discovery
from runtime.router.first_byte import FirstByte
from runtime.router.fleet import Fleet
from runtime.router.metrics import RouterMetrics
from runtime.router.metrics_port import MetricsServer
from runtime.router.moves import StreamMover
from runtime.router.relay import Relay
from runtime.router.routing import Routing
from runtime.router.settings import RouterSettings

log = logging.getLogger("flotilla.router")
perf_counter = time.perf_counter


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
        relay = Relay(settings, self.fleet, self.metrics, StreamMover(settings, self.fleet, self.metrics))
        self.first_byte = FirstByte(settings, self.fleet, self.metrics, relay)
        self.routing = Routing(settings, self.fleet, self.metrics, self.first_byte, admission)
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
            unit_report.report_loop(self.fleet, self.settings.ready_units_interval_s, self.metrics), name="unit report"
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
        request_id = intake.request_id(request)
        if not isinstance(request_id, str):
            return request_id
        if self.refusing:
            self.metrics.shed.labels("draining").inc()
            return answers.draining(request_id, self.settings.retry_after_s)
        arrival = time.time()
        body = await intake.read_body(request, request_id, self.settings.idle_stream_timeout_s)
        if not isinstance(body, bytes):
            return body
        self.inflight += 1
        self._idle.clear()
        resp: web.StreamResponse | None = None
        trace = Trace()
        try:
            resp = await self.routing.route(request, body, request_id, t0, trace)
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
                self.access_log.write(access_document(request, request_id, resp, trace, arrival, t0))
