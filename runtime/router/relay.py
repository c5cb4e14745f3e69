"""Relaying a unit's answer to the client as the unit writes it (SSE, chunked or large bodies): whole
SSE events only, every wait bounded, a resumable stream that breaks moved on (runtime/router/moves.py),
and a stream that cannot move ended visibly with an SSE error event, never a replay."""

from __future__ import annotations

import asyncio
import logging
import time

import aiohttp
from aiohttp import web

import contract
from contract.ready import stall_bound
from runtime.router import balance
from runtime.router.accounting import Trace
from runtime.router.answers import sse_error_event
from runtime.router.fleet import Fleet, Member
from runtime.router.intake import HOP_BY_HOP
from runtime.router.metrics import RouterMetrics
from runtime.router.moves import HANDOVER_QUEUE_TIMEOUT, StreamMover
from runtime.router.resume import StreamLedger
from runtime.router.settings import RouterSettings
from runtime.router.waits import Departure, UnitLeft, next_chunk, watch_period

log = logging.getLogger("flotilla.router")

_SSE_BOUNDARIES = (b"\n\n", b"\r\n\r\n")
WHOLE_BODY_LIMIT = 1024 * 1024  # bodies of known length up to this are relayed in one piece
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


def is_sse(upstream: aiohttp.ClientResponse) -> bool:
    return upstream.headers.get("Content-Type", "").startswith("text/event-stream")


class Relay:
    """Streams one unit's answer through, moving a broken resumable stream to another unit."""

    def __init__(self, settings: RouterSettings, fleet: Fleet, metrics: RouterMetrics, mover: StreamMover) -> None:
        self.settings = settings
        self.fleet = fleet
        self.metrics = metrics
        self.mover = mover

    async def stream(
        self,
        member: Member,
        request: web.Request,
        upstream: aiohttp.ClientResponse,
        request_id: str,
        before_send: float,
        t_first: float,
        trace: Trace,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        route_key: balance.RequestKey | None = None,
    ) -> web.StreamResponse:
        """Stream the body through as it arrives; a resumable stream that breaks continues on another
        unit (StreamMover)."""
        s = self.settings
        resp = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        for key, value in upstream.headers.items():
            if key.lower() not in HOP_BY_HOP:
                resp.headers.add(key, value)
        resp.headers[contract.REQUEST_ID_HEADER] = request_id
        if upstream.content_length is not None:
            resp.content_length = upstream.content_length
        sse = is_sse(upstream)
        ledger = _ledger(upstream, headers) if sse and upstream.status == 200 else None
        if ledger is not None:
            ledger.moves = trace.moves  # one budget: moves before the first byte count
            ledger.avoid.extend(trace.left)
        await resp.prepare(request)
        trace.first_byte = perf_counter()
        # Added latency: the router's work before sending, plus from the unit's headers to the
        # client's headers. The unit's own time to first byte is not the router's.
        trace.added_s = before_send + (perf_counter() - t_first)
        self.metrics.added_latency.observe(trace.added_s)
        framer = SseFramer(WHOLE_BODY_LIMIT) if sse else None
        first = upstream  # released by the first-byte attempt; the units a stream moved to are released here
        held: list[Member] = []
        try:
            while True:
                reason, message = await self.pipe(request, resp, upstream, member, framer, ledger)
                if reason is None:
                    return resp
                if ledger is not None and ledger.reported and s.max_moves:
                    moved = None
                    if ledger.moves < s.max_moves or reason == HANDOVER_QUEUE_TIMEOUT:  # busy gives its move back
                        moved = await self.mover.move(
                            ledger, member, request, body, headers or {}, request_id, reason, route_key
                        )
                    if moved is not None:
                        if upstream is not first:
                            upstream.release()
                        member, upstream = moved
                        held.append(member)
                        framer = SseFramer(WHOLE_BODY_LIMIT)
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
                return await self.broken(request, resp, upstream, sse, request_id, reason, message)
        finally:
            if upstream is not first:
                upstream.release()
            for u in held:
                u.outstanding -= 1
                if u.removed:
                    self.fleet.retire_if_idle(u)

    async def pipe(
        self,
        request: web.Request,
        resp: web.StreamResponse,
        upstream: aiohttp.ClientResponse,
        member: Member,
        framer: SseFramer | None,
        ledger: StreamLedger | None,
    ) -> tuple[str | None, str]:
        """Copy one unit's body to the client until it ends: (None, "") when it ended well or the
        client left, else why it broke (reason, message)."""
        s = self.settings
        content = upstream.content
        departure = Departure(member, self.fleet, s.stale_after_s)
        period = watch_period(s)
        waited = 0.0  # silence so far, past stall bounds waited out for want of another unit
        while True:
            # A resumable stream that has produced tokens here counts silence past the stall bound as
            # a hung unit (a stopped member or a stuck collective); before its first token it may be
            # prefilling a long prompt, unless its unit left routing for a failure meanwhile. The bound
            # derives from the unit's own longest recent step, read afresh for every chunk: a busy
            # unit's long prefills and big batches are slow steps, not a hang.
            quiet = s.idle_stream_timeout_s - waited
            stall = None
            if ledger is not None and ledger.since_move:
                stall = stall_bound(s.stream_stall_s, member.step_s, s.stream_stall_max_s)
                quiet = min(quiet, stall)
            movable = ledger is not None and ledger.reported and ledger.moves < s.max_moves
            try:
                chunk = await next_chunk(content, quiet, departure if movable else None, period)
            except TimeoutError:
                silent = waited + quiet
                if stall is not None and quiet == stall and silent < s.idle_stream_timeout_s:
                    # Past the stall bound, a stream moves only where another unit could take it: with
                    # none routable (the only serving unit, slowed by a unit starting beside it), moving
                    # would end the stream with no_unit_to_resume, while its own unit may still finish
                    # it. It waits on, up to the idle-stream timeout, as for a unit that left routing
                    # (waits.Departure), and moves as soon as another unit turns routable.
                    if movable and ledger is not None and not self.fleet.routable_besides((member, *ledger.avoid)):
                        waited = silent
                        continue
                steps = f" (its steps took up to {member.step_s:g} s)" if member.step_s else ""
                return "idle_timeout", f"unit {member.unit} sent nothing for {silent:g} s{steps}"
            except UnitLeft:
                return "unit_left", f"unit {member.unit} left routing ({member.state}) with the stream waiting on it"
            except (aiohttp.ClientError, OSError) as exc:
                return (
                    "stream_broken",
                    f"unit {member.unit} failed mid-response ({exc.__class__.__name__}); "
                    f"the partial output above is incomplete",
                )
            if not chunk:
                break
            waited = 0.0
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
                return f"handover_{moved}", f"unit {member.unit} handed the stream over ({moved})"
        if ledger is not None and ledger.reported and not ledger.done:
            cut = f"unit {member.unit} ended the stream before its end; the output above is incomplete"
            return "stream_broken", cut
        try:
            rest = framer.flush() if framer is not None else b""
            if rest:
                await resp.write(rest)
            await resp.write_eof()
        except (ConnectionError, aiohttp.ClientConnectionResetError):
            pass  # the client left just as the response ended
        return None, ""

    async def broken(
        self,
        request: web.Request,
        resp: web.StreamResponse,
        upstream: aiohttp.ClientResponse,
        sse: bool,
        request_id: str,
        reason: str,
        message: str,
    ) -> web.StreamResponse:
        """The response already started, so it cannot move to another unit: end it visibly."""
        upstream.close()
        self.metrics.upstream_errors.labels(reason).inc()
        log.warning("request %s: %s", request_id, message)
        if sse:
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


def _ledger(upstream: aiohttp.ClientResponse, headers: dict[str, str] | None) -> StreamLedger | None:
    """A ledger for a stream the router asked to be resumable (the leader's reports decide if it is)."""
    if headers is None or headers.get(contract.RESUME_HEADER) != "1":
        return None
    try:
        created = int(float(upstream.headers.get(contract.ARRIVAL_HEADER, "")))
    except ValueError:
        return None
    completion_id = upstream.headers.get(contract.COMPLETION_ID_HEADER, "")
    return StreamLedger(completion_id=completion_id, created=created) if completion_id else None
