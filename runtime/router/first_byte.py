"""One attempt of a request on one unit, up to its first byte to the client: while nothing has
reached the client, a failure (connect error, 503/429, a unit that left routing, a small body cut
short) raises Retry and another unit may take the request."""

from __future__ import annotations

import asyncio
import logging
import time

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

import contract
from contract import busy
from runtime.router import balance
from runtime.router.accounting import Trace
from runtime.router.answers import busy_answer, error_response
from runtime.router.fleet import Fleet, Member
from runtime.router.intake import HOP_BY_HOP, restartable
from runtime.router.metrics import RouterMetrics
from runtime.router.relay import WHOLE_BODY_LIMIT, Relay, is_sse
from runtime.router.settings import RouterSettings
from runtime.router.waits import Departure, Wait, watch_period

log = logging.getLogger("flotilla.router")

_REFUSAL_BODY_LIMIT = 64 * 1024
perf_counter = time.perf_counter


class Retry(Exception):
    """This attempt failed before anything reached the client; another unit may take it."""

    def __init__(self, reason: str, refusal: web.Response | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.refusal = refusal


class FirstByte:
    """Sends a request to one unit and hands its answer to the client, whole or relayed."""

    def __init__(self, settings: RouterSettings, fleet: Fleet, metrics: RouterMetrics, relay: Relay) -> None:
        self.settings = settings
        self.fleet = fleet
        self.metrics = metrics
        self.relay = relay

    async def attempt(
        self,
        member: Member,
        request: web.Request,
        body: bytes,
        headers: dict[str, str],
        request_id: str,
        t0: float,
        trace: Trace,
        key: balance.RequestKey | None = None,
    ) -> web.StreamResponse:
        session = member.session
        if session is None or session.closed:
            raise Retry("unit_closed")
        t_sent = perf_counter()
        upstream = await self._send(member, session, request, body, headers, request_id, trace)
        if isinstance(upstream, web.Response):
            return upstream
        t_first = perf_counter()
        status = upstream.status
        if status == 503 or status == 429:
            await self._refused(member, upstream, request_id)
        length = upstream.content_length
        try:
            resp: web.StreamResponse
            if length is not None and length <= WHOLE_BODY_LIMIT and not is_sse(upstream):
                resp = await self._whole(member, upstream, request_id, t_sent - t0, t_first, trace)
                trace.first_byte = perf_counter()
            else:
                resp = await self.relay.stream(
                    member,
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
        self.metrics.count_routed(member.unit, status)
        return resp

    async def _send(
        self,
        member: Member,
        session: aiohttp.ClientSession,
        request: web.Request,
        body: bytes,
        headers: dict[str, str],
        request_id: str,
        trace: Trace,
    ) -> aiohttp.ClientResponse | web.Response:
        """The unit's response headers, a 504 when it sent none in time, or Retry."""
        s = self.settings
        # A request waiting for its first byte may start again elsewhere if its unit leaves routing
        # (a stopped leader, a hung engine): it counts against the move budget.
        movable = trace.moves < s.max_moves and restartable(request)
        departure = Departure(member, self.fleet, s.stale_after_s) if movable else None
        waiting = Wait(s.first_byte_timeout_s, departure, watch_period(s))
        try:
            async with waiting:
                return await session.request(
                    request.method,
                    member.url + request.rel_url.raw_path_qs,
                    headers=headers,
                    data=body if body else None,
                    allow_redirects=False,
                )
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            member.mark_unready("unreachable")
            log.warning(
                "request %s: cannot connect to unit %s (%s): %s; trying another unit",
                request_id,
                member.unit,
                member.url,
                exc,
            )
            raise Retry("connect") from exc
        except aiohttp.ServerDisconnectedError as exc:
            # The unit closed the connection before answering (it died, or a keep-alive race):
            # nothing reached the client, so another unit may take the request.
            raise Retry("disconnected") from exc
        except aiohttp.ClientOSError as exc:
            member.mark_unready("unreachable")
            raise Retry("connect") from exc
        except TimeoutError:
            if waiting.left:
                # Nothing of it reached the client, and its connection is closed (the unit cancels
                # the work once it runs again), so it starts whole elsewhere: never two answers.
                trace.moves += 1
                trace.left.append(member)
                log.warning(
                    "request %s: unit %s left routing (%s) before answering; starting it on another unit "
                    "(move %d of %d)",
                    request_id,
                    member.unit,
                    member.state,
                    trace.moves,
                    s.max_moves,
                )
                raise Retry("left_before_first_byte") from None
            log.error(
                "request %s: unit %s sent no response within %.1f s", request_id, member.unit, s.first_byte_timeout_s
            )
            self.metrics.upstream_errors.labels("first_byte_timeout").inc()
            return error_response(
                504,
                f"unit {member.unit} did not answer within {s.first_byte_timeout_s:g} s",
                code="unit_timeout",
                err_type="upstream_error",
                request_id=request_id,
            )

    async def _whole(
        self,
        member: Member,
        upstream: aiohttp.ClientResponse,
        request_id: str,
        before_send: float,
        t_first: float,
        trace: Trace,
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
                f"unit {member.unit} stopped sending its response for {self.settings.idle_stream_timeout_s:g} s",
                code="idle_timeout",
                err_type="upstream_error",
                request_id=request_id,
            )
        except (aiohttp.ClientError, OSError) as exc:
            upstream.close()
            log.warning(
                "request %s: unit %s failed before its response was complete (%s); trying another unit",
                request_id,
                member.unit,
                exc.__class__.__name__,
            )
            raise Retry("broken_before_client") from exc
        headers = CIMultiDict((k, v) for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP)
        headers[contract.REQUEST_ID_HEADER] = request_id
        trace.added_s = before_send + (perf_counter() - t_first)
        self.metrics.added_latency.observe(trace.added_s)
        return web.Response(status=upstream.status, reason=upstream.reason, body=raw, headers=headers)

    async def _refused(self, member: Member, upstream: aiohttp.ClientResponse, request_id: str) -> None:
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
        if status == 503 and not busy_answer(raw):
            member.mark_unready("refused")  # draining or not ready: the next report tells which
        refusal_headers = {
            contract.REQUEST_ID_HEADER: request_id,
            "Retry-After": busy.retry_after_header(upstream.headers.get("Retry-After"), self.settings.retry_after_s),
        }
        ctype = upstream.headers.get("Content-Type")
        if ctype:
            refusal_headers["Content-Type"] = ctype
        refusal = web.Response(status=status, body=raw, headers=refusal_headers)
        raise Retry(f"unit_{status}", refusal)
