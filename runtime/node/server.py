"""A unit member's HTTP server: health on every rank, the OpenAI-compatible API on the leader.

Each request gets its own id (generated, unique in the unit; the client's X-Request-Id is kept only
as a correlation id), arrival / first-token / finish timestamps in one structured log line and in
/metrics, one CloudWatch EMF line on stdout (runtime/emf.py), and the unit and revision in response
headers. A request ends whole (finish_reason from the engine) or with an error (docs/node.md).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, AsyncIterator

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel

import contract
from contract.busy import retry_after_s
from contract.resume import move_line
from contract.watch import RoutePrompt, WatchWriter
from runtime import emf
from runtime.logs import jlog
from runtime.node.engine_protocol import Accepted, Done, Error, RequestEvent, Token
from runtime.node.event_stream import EventStream, RequestProgress, sse_event
from runtime.node.handshake import STATUS_PATH
from runtime.node.metrics import NodeMetrics
from runtime.node.protocol import (
    DEFAULT_MAX_TOKENS,
    ApiError,
    ParsedRequest,
    decode_body,
    parse_chat,
    parse_completion,
    parse_json_body,
)
from runtime.node.serving import ChatServing, Collected, CompletionServing, serving_for
from runtime.node.stream_moves import StreamMove, collector_so_far, resume_comment
from runtime.node.supervisor import UnitSupervisor

RETRY_AFTER_S = "2"
# /health/watch: the interval a watcher may ask for (?interval=seconds), and the default.
WATCH_INTERVAL_RANGE_S = (0.01, 10.0)
WATCH_INTERVAL_DEFAULT_S = 0.25
_REQUEST_ID_OK = re.compile(contract.REQUEST_ID_PATTERN)
MAX_BODY_BYTES = 4 * 1024 * 1024  # as sent (client_max_size, else 413) and once decompressed
BODY_READ_TIMEOUT_S = 30.0  # a body that trickles in slower than this is the client's problem (408)

# How a request the engine ended with an error reaches the client (docs/node.md, "How a request
# ends"): the error kind from engine_host -> (HTTP status, OpenAI error type, code). 503s and 429s
# carry Retry-After: another unit (or this one, re-formed or less busy) can serve the request. A full
# unit answers 429, never 503: busy is not broken (contract.BUSY_CODES).
ENDINGS: dict[str, tuple[int, str, str | None]] = {
    "rejected": (400, "invalid_request_error", None),
    "broken": (503, "service_unavailable", "unit_broken"),
    "unavailable": (503, "service_unavailable", "unit_unavailable"),
    "cancelled": (503, "service_unavailable", "cancelled"),
    "queue_timeout": (contract.BUSY_STATUS, "rate_limit_error", contract.BUSY_CODE_QUEUE_TIMEOUT),
    "deadline": (504, "server_error", "deadline_exceeded"),
    "incomplete": (500, "server_error", "incomplete"),
    "engine": (500, "server_error", "engine_error"),
    "internal": (500, "server_error", "internal_error"),
}


# Engine endings a resumable stream hands to the router to continue on another unit (the request is
# fine; this unit is not): a broken or stopping engine, a stream cut short, or no batch slot within
# the queue timeout (busy: the router may wait for a slot here or elsewhere, as for a 429).
MOVABLE_ENDINGS = frozenset({"broken", "unavailable", "incomplete", contract.BUSY_CODE_QUEUE_TIMEOUT})
_DRAIN_HANDOVER = Error(kind="unavailable", message="this unit is draining for shutdown; retry on another unit")


# What the server makes of an engine stream that ended without a finish reason.
_INCOMPLETE = Error(kind="incomplete", message="the engine ended the request without a finish reason; retry")


def _decimal_u64(text: str) -> int | None:
    """A router's 64-bit value in decimal (balance.key_hash), as its headers carry it; None if not one."""
    return int(text) if text.isdigit() and len(text) <= 20 else None


def _route_prompt(header: str, marks_header: str, prompt_tokens: int) -> RoutePrompt | None:
    """The completion prompt a router sent, as contract.ROUTE_PROMPT_HEADER gives it ("<bytes>:<tail>",
    two decimal integers of at most 64 bits), with the engine's token count and its checkpoint hashes
    (contract.ROUTE_MARKS_HEADER: at most ROUTE_MARKS_MAX of them, comma-separated); None when the
    prompt header is absent or malformed (the key is still listed: only the prompt's credit is lost),
    no marks when theirs is (only the credit of a partial resend is lost)."""
    length, _, tail = header.partition(":")
    n, h = _decimal_u64(length), _decimal_u64(tail)
    if n is None or h is None:
        return None
    parts = marks_header.split(",") if marks_header else []
    marks = [m for m in map(_decimal_u64, parts[: contract.ROUTE_MARKS_MAX + 1]) if m is not None]
    return n, prompt_tokens, h, tuple(marks) if len(marks) == len(parts) <= contract.ROUTE_MARKS_MAX else ()


def _error(e: ApiError, headers: dict[str, str]) -> web.Response:
    return web.json_response(e.body(), status=e.status, headers=headers)


class _Prefilling:
    """One request's prompt in the unit's outstanding prefill (`load.prefill_tokens` of the ready body)
    from its acceptance until its first token, or its end if none comes, counted exactly once: the
    tokens the engine's prefix cache did not hold at acceptance."""

    __slots__ = ("_sup", "_tokens")

    def __init__(self, sup: UnitSupervisor, tokens: int) -> None:
        self._sup, self._tokens = sup, tokens
        sup.prefill_tokens += tokens

    def end(self) -> None:
        self._sup.prefill_tokens -= self._tokens
        self._tokens = 0

    async def until_first_token(self, events: AsyncIterator[RequestEvent]) -> AsyncIterator[RequestEvent]:
        async for ev in events:
            if self._tokens and isinstance(ev, (Token, Done, Error)):
                self.end()
            yield ev


class LeaderApi:
    def __init__(self, *, sup: UnitSupervisor, metrics: NodeMetrics) -> None:
        self.sup = sup
        self.m = metrics

    # -- plumbing -----------------------------------------------------------------------------------
    def _headers(self, correlation_id: str, rid: str, arrival: float) -> dict[str, str]:
        return {
            contract.REQUEST_ID_HEADER: correlation_id,
            contract.COMPLETION_ID_HEADER: rid,
            contract.ARRIVAL_HEADER: f"{arrival:.6f}",
            contract.UNIT_HEADER: self.sup.s.unit_id,
            contract.REVISION_HEADER: self.sup.s.revision,
        }

    def _unavailable(self, message: str, headers: dict[str, str]) -> web.Response:
        h = {**headers, "Retry-After": RETRY_AFTER_S}
        return web.json_response(
            ApiError(503, message, type_="service_unavailable", code="unit_unavailable").body(), status=503, headers=h
        )

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "object": "list",
                "data": [{"id": self.sup.s.model_name, "object": "model", "created": 0, "owned_by": "flotilla"}],
            },
            headers={contract.UNIT_HEADER: self.sup.s.unit_id, contract.REVISION_HEADER: self.sup.s.revision},
        )

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "chat")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "completion")

    # -- one request ----------------------------------------------------------------------------------
    async def _serve(self, request: web.Request, kind: str) -> web.StreamResponse:
        arrival = time.time()
        endpoint = request.path
        # The request's own id keys everything (engine streams, the engine's batch); the client's
        # X-Request-Id is only carried along: two clients may well send the same one.
        rid = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"
        given = request.headers.get(contract.REQUEST_ID_HEADER, "")
        correlation_id = given if _REQUEST_ID_OK.match(given) else rid
        headers = self._headers(correlation_id, rid, arrival)
        rec: dict[str, Any] = {
            "request_id": correlation_id,
            "id": rid,
            "endpoint": endpoint,
            "kind": kind,
            "arrival": round(arrival, 6),
            "unit": self.sup.s.unit_id,
            "revision": self.sup.s.revision,
        }
        status = 500
        self.sup.in_flight += 1
        self.m.in_flight.inc()
        try:
            resp = await self._serve_inner(request, kind, rid, arrival, headers, rec)
            status = resp.status
            return resp
        except ApiError as e:
            status = e.status
            rec.update(error=e.message)
            return _error(e, headers)
        except web.HTTPException as e:  # e.g. 413 from reading the body; openai_errors words it
            status = e.status
            raise
        finally:
            self.sup.in_flight -= 1
            self.m.in_flight.dec()
            finish = time.time()
            rec.setdefault("status", status)
            rec["finish"] = round(finish, 6)
            self.m.requests.labels(endpoint, str(rec["status"])).inc()
            if rec["status"] >= 400 or "error" in rec:
                self.m.errors.labels(endpoint, rec.get("error_kind", str(rec["status"]))).inc()
            self.m.duration.observe(finish - arrival)
            jlog("request", **rec)
            self.sup.request_finished()

    async def _serve_inner(
        self, request: web.Request, kind: str, rid: str, arrival: float, headers: dict[str, str], rec: dict[str, Any]
    ) -> web.StreamResponse:
        started = asyncio.get_running_loop().time()  # the request timeout counts from here
        if self.sup.draining:
            rec["error_kind"] = "draining"
            return self._unavailable("this unit is draining for shutdown; retry on another unit", headers)
        try:
            async with asyncio.timeout(BODY_READ_TIMEOUT_S):
                raw = await request.read()  # at most client_max_size bytes, else 413
        except TimeoutError:
            raise ApiError(
                408, f"the request body did not arrive within {BODY_READ_TIMEOUT_S:g} s: send it whole"
            ) from None
        except web.RequestPayloadError:
            raise ApiError(
                400, "the request body could not be read (broken chunked framing?): send it with a Content-Length"
            ) from None
        raw = decode_body(raw, request.headers.get("Content-Encoding", ""), limit=MAX_BODY_BYTES)
        body = parse_json_body(raw)
        parse = parse_chat if kind == "chat" else parse_completion
        req = parse(body, served_model=self.sup.s.model_name, max_tokens_limit=self.sup.s.max_tokens_limit)
        engine = self.sup.engine
        if not self.sup.ready() or engine is None:
            rec["error_kind"] = "not_ready"
            return self._unavailable(
                f"the unit is {self.sup.state}, not ready to serve; retry shortly or on another unit", headers
            )
        move = StreamMove.of(
            request,
            body,
            req,
            resumes=getattr(engine, "resumes", False),
            resumes_choices=getattr(engine, "resumes_choices", False),
            rid=rid,
            arrival=arrival,
        )
        payload = req.engine_payload(default_max_tokens=DEFAULT_MAX_TOKENS[kind])
        if move.before:
            payload["generated"] = move.before
        if move.choices:
            payload["resumed_choices"] = move.choices
        if move.sent:
            rec["continued_from"] = move.sent
        wait = self.sup.expected_wait() if self.sup.s.shed == "at-once" else None
        if wait is not None and wait > self.sup.s.queue_timeout_s:
            rec["error_kind"] = "shed"
            return self._busy(wait, headers)
        stream = engine.submit(rid, correlation_id=rec["request_id"], **payload)
        # From here the finally below takes it out again, whatever happens.
        self.sup.queue_wait.submitted(rid, payload.get("max_tokens") or payload["default_max_tokens"])
        events = self._bounded(engine, rid, engine.events(stream), started)
        done = False
        prefill: _Prefilling | None = None
        try:
            first = await events.__anext__()  # accepted, or a rejection before any output
            if not isinstance(first, Accepted):
                done = True
                return self._engine_error(first if isinstance(first, Error) else _INCOMPLETE, headers, rec)
            prompt_tokens = first.prompt_tokens
            if first.replayed_text:
                move.replayed[0] = first.replayed_text
            move.replayed.update((int(i), str(t)) for i, t in first.replayed_choices or ())
            rec["prompt_tokens"] = prompt_tokens
            self.m.prompt_tokens.inc(prompt_tokens)
            prefill = _Prefilling(self.sup, prompt_tokens - min(prompt_tokens, first.cached_tokens))
            route_key = _decimal_u64(request.headers.get(contract.ROUTE_KEY_HEADER, ""))
            if route_key is not None:
                self.sup.note_route_key(
                    route_key,
                    _route_prompt(
                        request.headers.get(contract.ROUTE_PROMPT_HEADER, ""),
                        request.headers.get(contract.ROUTE_MARKS_HEADER, ""),
                        prompt_tokens,
                    ),
                )
            events = prefill.until_first_token(events)
            if req.stream:
                resp = await self._stream(request, req, move, events, headers, rec, arrival, prompt_tokens)
            else:
                resp = await self._collect(req, move, rid, events, headers, rec, arrival, prompt_tokens)
            done = not rec.get("client_gone")
            return resp
        finally:
            if prefill is not None:
                prefill.end()
            self.sup.queue_wait.finished(rid, time.monotonic())
            if not done:
                engine.cancel(rid)  # client went away (handler cancelled) or write failed
                rec.setdefault("error_kind", "client_disconnected")
                rec.setdefault("error", "client disconnected")
                rec.setdefault("status", 499)

    async def _bounded(
        self, engine: Any, rid: str, events: AsyncIterator[RequestEvent], started: float
    ) -> AsyncIterator[RequestEvent]:
        """The engine's events for one request, every wait for the next one bounded: until the first
        token by the queue timeout (counted from now), in all by the request timeout (counted from
        `started`, loop time). Past either, the request is cancelled in the engine, which frees its
        batch slot at the next step, and the events end with an error: `queue_timeout` (429, the
        request never started, so it may go elsewhere) or `deadline` (504; output already sent is
        incomplete). The engine yields tokens, not admissions: the first token is the first sign the
        request holds a slot (the reference engine prefills in the step that admits it)."""
        s = self.sup.s
        loop = asyncio.get_running_loop()
        deadline = started + s.request_timeout_s
        admit_by = min(loop.time() + s.queue_timeout_s, deadline)
        admitted = False
        while True:
            until, kind = (deadline, "deadline") if admitted else (admit_by, "queue_timeout")
            try:
                if loop.time() >= until:
                    # An event already waiting is taken without suspending, so the timeout below
                    # would never fire for a client that reads slower than the engine writes.
                    raise TimeoutError
                async with asyncio.timeout_at(until):
                    ev = await anext(events)
            except StopAsyncIteration:
                return
            except TimeoutError:
                engine.cancel(rid)
                if kind == "queue_timeout":
                    message = (
                        f"no batch slot came free on unit {s.unit_id} within {s.queue_timeout_s:g} s (its queue "
                        "timeout); retry after Retry-After, on another unit if you can"
                    )
                else:
                    message = (
                        f"the request ran past unit {s.unit_id}'s request timeout of {s.request_timeout_s:g} s and "
                        "was stopped; output already sent is incomplete: retry, with a smaller max_tokens if "
                        "it needs that long"
                    )
                yield Error(kind=kind, message=message)
                return
            if isinstance(ev, Token):
                admitted = True
                if not ev.index:  # one decode step: count the first choice's tokens
                    self.sup.queue_wait.token(rid, time.monotonic())
            yield ev
            if isinstance(ev, (Done, Error)):
                return

    @staticmethod
    def _ending(ev: Error, rec: dict[str, Any]) -> ApiError:
        """The error a client sees for an engine `error` event (ENDINGS); recorded in the log line."""
        rec["error_kind"], rec["error"] = ev.kind, ev.message
        status, type_, code = ENDINGS.get(ev.kind, ENDINGS["internal"])
        if ev.kind == "rejected":
            return ApiError(
                status,
                ev.message,
                param=ev.param or ("messages" if rec["kind"] == "chat" else "prompt"),
                code="context_length_exceeded" if "context" in ev.message else None,
            )
        message = ev.message if status != 500 else f"the engine failed: {ev.message}"
        return ApiError(status, message, type_=type_, code=code)

    def _engine_error(self, ev: Error, headers: dict[str, str], rec: dict[str, Any]) -> web.Response:
        err = self._ending(ev, rec)
        if err.status == 503:
            headers = {**headers, "Retry-After": RETRY_AFTER_S}
        elif err.status == contract.BUSY_STATUS:
            wait = self.sup.expected_wait()
            headers = {**headers, "Retry-After": str(retry_after_s(wait or 0.0, int(RETRY_AFTER_S)))}
        return _error(err, headers)

    def _busy(self, wait: float, headers: dict[str, str]) -> web.Response:
        """Full: refused at once rather than held for the whole queue timeout, so the client (or the
        router, on another unit) knows now; Retry-After is the expected wait for a batch slot."""
        s = self.sup.s
        err = ApiError(
            contract.BUSY_STATUS,
            f"unit {s.unit_id} is at capacity: a batch slot is expected in {wait:.0f} s, past its queue timeout of "
            f"{s.queue_timeout_s:g} s; retry after Retry-After, on another unit if you can",
            type_="rate_limit_error",
            code=contract.BUSY_CODE_SHED,
        )
        return _error(err, {**headers, "Retry-After": str(retry_after_s(wait))})

    def _timing(self, rec: dict[str, Any], arrival: float, progress: RequestProgress) -> None:
        """The request's generation ended (done, failed or the client left): record its timing in
        /metrics and write its one EMF line (TimeToFirstToken if a token came, OutputTokens)."""
        finish = time.time()
        first_token, n = progress.first_token, progress.tokens
        if first_token is not None:
            rec["first_token"] = round(first_token, 6)
            self.m.ttft.observe(first_token - arrival)
            if n > 1:
                self.m.per_token.observe((finish - first_token) / (n - 1))
        rec["completion_tokens"] = n
        self.m.completion_tokens.inc(n)
        try:
            emf.write_lines(
                [
                    emf.request_line(
                        request_id=rec["request_id"],
                        cell=self.sup.s.cell_id,
                        output_tokens=n,
                        ttft_ms=None if first_token is None else (first_token - arrival) * 1000.0,
                        timestamp_s=finish,
                    )
                ]
            )
        except OSError as e:  # stdout gone: a metric must never fail the request it measures
            rec["emf_error"] = str(e)

    def _cancel(self, rid: str) -> None:
        if self.sup.engine is not None:
            self.sup.engine.cancel(rid)

    def _handing_over(self) -> bool:
        """The unit drains (this member, or a follower): resumable requests leave for another unit now."""
        return self.sup.draining or bool(self.sup.unit_draining)

    # -- a non-streamed answer --------------------------------------------------------------------------
    async def _collect(
        self,
        req: ParsedRequest,
        move: StreamMove,
        rid: str,
        events: AsyncIterator[RequestEvent],
        headers: dict[str, str],
        rec: dict[str, Any],
        arrival: float,
        prompt_tokens: int,
    ) -> web.Response:
        """Gather the whole answer, then send it in one response (or the error it ended with)."""
        serving = serving_for(req)
        collected = serving.collector()
        progress = RequestProgress()
        failed, cached = await self._gather(events, collected, progress, move, rid, rec)
        self._timing(rec, arrival, progress)
        if failed is not None:
            return self._engine_error(failed, headers, rec)
        if not collected.whole:  # only the engine says an answer is whole: never assume it
            return self._engine_error(_INCOMPLETE, headers, rec)
        rec["status"] = 200
        headers = {**headers, contract.FINISH_HEADER: f"{time.time():.6f}"}
        if progress.first_token is not None:
            headers[contract.FIRST_TOKEN_HEADER] = f"{progress.first_token:.6f}"
        body = serving.response(
            rid=rid, created=int(arrival), collected=collected, prompt_tokens=prompt_tokens, cached_tokens=cached
        )
        return web.json_response(body.model_dump(), headers=headers)

    async def _gather(
        self,
        events: AsyncIterator[RequestEvent],
        collected: Collected,
        progress: RequestProgress,
        move: StreamMove,
        rid: str,
        rec: dict[str, Any],
    ) -> tuple[Error | None, int]:
        """The engine's tokens into `collected`, until its end: (the error it ended with, or None;
        the prompt tokens it found in its cache)."""
        cached = 0
        async for ev in events:
            if isinstance(ev, Done):
                cached = ev.cached_tokens
            if isinstance(ev, Token):
                progress.token()
                collected.add(ev)
                progress.tokens = rec["completion_tokens"] = collected.completion_tokens  # every choice's
                if move.resume and self._handing_over():
                    # The router retries a non-streamed request whole on another unit (nothing has
                    # reached its client yet), so a drain need not wait for it.
                    self._cancel(rid)
                    rec["handed_over"] = True
                    return _DRAIN_HANDOVER, cached
            if isinstance(ev, Error):
                return ev, cached
        return None, cached

    # -- a streamed answer ------------------------------------------------------------------------------
    async def _stream(
        self,
        request: web.Request,
        req: ParsedRequest,
        move: StreamMove,
        events: AsyncIterator[RequestEvent],
        headers: dict[str, str],
        rec: dict[str, Any],
        arrival: float,
        prompt_tokens: int,
    ) -> web.StreamResponse:
        """Relay the answer as server-sent events while the engine makes it, then end the stream: whole
        (usage if asked for, then [DONE]) or with an error event. A client that goes away, or accepts
        nothing for the client stall bound, ends it early (the caller cancels the request)."""
        sse = EventStream(request, headers, stall_s=self.sup.s.client_stall_s)
        await sse.open()
        serving = serving_for(req)
        collected = collector_so_far(serving, move)
        progress = RequestProgress()
        try:
            last = await self._relay(sse, req, move, serving, collected, events, progress, rec)
        except ConnectionError:  # the client went away mid-stream
            rec["client_gone"] = True
            self._timing(rec, arrival, progress)
            return sse.resp
        self._timing(rec, arrival, progress)
        rec["status"] = 200  # the status line went out with the first event
        try:
            if isinstance(last, Error) or not collected.whole:
                await self._fail_stream(sse, last if isinstance(last, Error) else _INCOMPLETE, move, rec)
            else:
                await self._finish_stream(sse, req, serving, move, last, progress, prompt_tokens)
        except ConnectionError:
            pass
        return sse.resp

    async def _relay(
        self,
        sse: EventStream,
        req: ParsedRequest,
        move: StreamMove,
        serving: ChatServing | CompletionServing,
        collected: Collected,
        events: AsyncIterator[RequestEvent],
        progress: RequestProgress,
        rec: dict[str, Any],
    ) -> RequestEvent:
        """The stream's opening, then each token's chunks as the engine makes them; returns the event
        the engine's stream ended on (a drain hands a resumable stream over instead)."""
        if move.resume and not move.continued:
            await sse.write(resume_comment(None) + b"\n")  # the router learns it may move this stream
        if not move.continued:  # a continued stream's client has had its opening
            for chunk in serving.opening(rid=move.shown_id, created=move.created):
                await sse.send(chunk)
        ev: RequestEvent = _INCOMPLETE
        async for ev in events:
            if isinstance(ev, Error):
                break
            if not isinstance(ev, Token):
                continue
            progress.token()
            chunks = serving.chunks(rid=move.shown_id, created=move.created, ev=ev, collected=collected)
            # every choice's tokens, counted before the write may fail
            progress.tokens = rec["completion_tokens"] = collected.completion_tokens
            await sse.write(self._token_event(ev, chunks, req, move, collected))
            if move.resume and self._handing_over() and not collected.whole:
                self._cancel(move.key)
                rec["handed_over"] = True
                return _DRAIN_HANDOVER
        return ev

    @staticmethod
    def _token_event(
        ev: Token, chunks: Sequence[BaseModel], req: ParsedRequest, move: StreamMove, collected: Collected
    ) -> bytes:
        """What one token puts on the wire: its chunks (none while text is held), and on a resumable
        stream the resume comment first. The token ids ride in the same SSE event as their text, so
        the router learns of a token exactly when its client gets the text."""
        data = b"".join(sse_event(chunk) for chunk in chunks)
        if not move.resume:
            return data
        sent = collected.choices[ev.index].sent if getattr(req, "tool_mode", None) == "auto" else None
        comment = resume_comment(ev, held=move.restarts, choices=req.choices, content_sent=sent)
        return comment + (data or b"\n")

    async def _fail_stream(self, sse: EventStream, ending: Error, move: StreamMove, rec: dict[str, Any]) -> None:
        """An `error` event, then close: no [DONE], so no client takes the text so far for a whole answer.
        A resumable stream says first that the router may continue it elsewhere (it then drops the event)."""
        err = self._ending(ending, rec)
        hand_over = move_line(ending.kind) if move.resume and ending.kind in MOVABLE_ENDINGS else b""
        await sse.write(hand_over + sse_event(err.body()), last=True)

    @staticmethod
    async def _finish_stream(
        sse: EventStream,
        req: ParsedRequest,
        serving: ChatServing | CompletionServing,
        move: StreamMove,
        done: RequestEvent,
        progress: RequestProgress,
        prompt_tokens: int,
    ) -> None:
        """A whole answer's end: the usage chunk if the client asked for it, then [DONE]."""
        if req.include_usage:
            # usage counts the whole answer, the tokens another unit generated included.
            cached = done.cached_tokens if isinstance(done, Done) else 0
            await sse.send(
                serving.usage_chunk(
                    rid=move.shown_id,
                    created=move.created,
                    prompt_tokens=prompt_tokens,
                    completion_tokens=progress.tokens + move.sent,
                    cached_tokens=cached,
                )
            )
        await sse.write(b"data: [DONE]\n\n", last=True)


@web.middleware
async def openai_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """Errors aiohttp raises itself (404, 405, 413) in OpenAI's shape on /v1 paths."""
    try:
        return await handler(request)
    except web.HTTPException as e:
        if not request.path.startswith("/v1") or e.status < 400:
            raise
        msg = {
            404: f"unknown path {request.path}: use /v1/chat/completions, /v1/completions or /v1/models",
            405: f"{request.method} is not allowed on {request.path}",
            413: "the request body is too large (limit 4 MiB): shorten the prompt",
        }.get(e.status, e.reason)
        return web.json_response(ApiError(e.status, msg).body(), status=e.status)
    except Exception as e:  # a bug: log it loudly, answer in OpenAI's shape
        if not request.path.startswith("/v1"):
            raise
        logging.getLogger("flotilla.node").exception("unhandled error on %s", request.path)
        return web.json_response(
            ApiError(500, f"internal error ({type(e).__name__}); see the node's log", type_="server_error").body(),
            status=500,
        )


def _seconds(request: web.Request, name: str, default: float) -> float | str:
    """A query parameter in seconds, or the one-line refusal naming it."""
    raw = request.query.get(name, str(default))
    low, high = WATCH_INTERVAL_RANGE_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    return value if low <= value <= high else f"{name}={raw!r}: give seconds, {low} to {high}"


def watch_handler(
    sup: UnitSupervisor, shutting_down: asyncio.Event
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """The /health/watch handler of this member (contract.watch); every watch ends once `shutting_down` is set."""

    async def watch(request: web.Request) -> web.StreamResponse:
        """The ready body as a stream, so a router holds one connection per leader instead of
        polling: the body now; then, checked every `changes` seconds, a line as soon as the unit's
        state or requests in flight changed, and at least one every `interval` seconds. A line is
        the whole body when anything beyond its load changed, {"load": {...}} when only the load
        did, or empty when nothing did (a heartbeat: the watcher counts silence as death).
        Balancing many routers needs load that is fresh to tens of milliseconds (docs/benchmarks.md,
        Fleet); most lines are then load-only, so they are kept short."""
        interval = _seconds(request, "interval", WATCH_INTERVAL_DEFAULT_S)
        changes = _seconds(request, "changes", interval if isinstance(interval, float) else 0.0)
        for bad in (interval, changes):
            if isinstance(bad, str):
                return web.json_response({"error": bad}, status=400)
        assert isinstance(interval, float) and isinstance(changes, float)
        tick = min(interval, changes)
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        writer = WatchWriter()
        last_sent, last_signature = -1e9, None
        keys_sent = sup.route_keys_seen  # routing keys admitted before the watch began are not sent
        loop = asyncio.get_running_loop()
        try:
            while not shutting_down.is_set():
                ld = sup.load()
                signature = (
                    sup.state,
                    sup.ready(),
                    sup.stalled(),
                    sup.step_s(),
                    sup.in_flight,
                    sup.prefill_tokens,
                    ld.queue_depth,
                    ld.running,
                    sup.route_keys_seen,
                )
                now = loop.time()
                if signature != last_signature or now - last_sent >= interval - tick / 2:
                    # The routing keys admitted since the last line: which unit took whose request.
                    line = writer.line(sup.ready_body().to_dict(), sup.route_keys_since(keys_sent))
                    keys_sent = sup.route_keys_seen
                    async with asyncio.timeout(sup.s.client_stall_s):  # a watcher that reads nothing is gone
                        await resp.write(line)
                    last_sent, last_signature = now, signature
                try:
                    await asyncio.wait_for(shutting_down.wait(), tick)
                except asyncio.TimeoutError:
                    pass
        except ConnectionError:
            pass  # the watcher went away
        except TimeoutError:
            if request.transport is not None:
                request.transport.abort()
        return resp

    return watch


def build_app(*, sup: UnitSupervisor, metrics: NodeMetrics) -> web.Application:
    app = web.Application(middlewares=[openai_errors], client_max_size=MAX_BODY_BYTES)
    api = LeaderApi(sup=sup, metrics=metrics)

    async def live(_: web.Request) -> web.Response:
        ok = sup.live()
        return web.json_response(
            {"alive": ok, "state": sup.state, "unit": sup.s.unit_id, "rank": sup.rank}, status=200 if ok else 503
        )

    async def container(_: web.Request) -> web.Response:
        ok = sup.container_healthy()
        return web.json_response(
            {"healthy": ok, "started": sup.started, "alive": sup.live(), "state": sup.state, "unit": sup.s.unit_id},
            status=200 if ok else 503,
        )

    async def ready(_: web.Request) -> web.Response:
        body = sup.ready_body()
        return web.json_response(body.to_dict(), status=200 if body.ready else 503)

    async def status(_: web.Request) -> web.Response:
        return web.json_response(sup.status_body().to_dict())

    shutting_down = asyncio.Event()

    async def stop_watches(_: web.Application) -> None:
        shutting_down.set()  # ends every watch, so the server's shutdown does not wait on them

    app.on_shutdown.append(stop_watches)

    watch = watch_handler(sup, shutting_down)

    async def prom(_: web.Request) -> web.Response:
        ld = sup.load()
        metrics.queue_depth.set(ld.queue_depth)
        metrics.running.set(ld.running)
        metrics.max_running.set(ld.max_running)
        metrics.kv_cache_used.set(ld.kv_cache_used)
        metrics.expected_wait.set(sup.reported_wait() if sup.is_leader else 0.0)
        metrics.engine_counters(ld)
        metrics.ready.set(1 if sup.ready() else 0)
        return web.Response(body=generate_latest(metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def not_leader(_request: web.Request) -> web.Response:
        return web.json_response(
            ApiError(
                421,
                f"this member is rank {sup.rank}, a follower: send API requests to the unit's leader (rank 0)",
                code="not_leader",
            ).body(),
            status=421,
        )

    app.router.add_get(contract.NODE_LIVE_PATH, live)
    app.router.add_get(contract.NODE_CONTAINER_HEALTH_PATH, container)
    app.router.add_get(contract.NODE_READY_PATH, ready)
    app.router.add_get(contract.NODE_WATCH_PATH, watch)
    app.router.add_get(STATUS_PATH, status)
    app.router.add_get(contract.METRICS_PATH, prom)

    def leader_only(handler: Any) -> Any:
        # An async handler of its own: aiohttp deprecates plain functions as handlers (a lambda that
        # returns a coroutine is one) and wraps each in another coroutine per request.
        async def serve(request: web.Request) -> web.StreamResponse:
            return await (handler(request) if sup.is_leader else not_leader(request))

        return serve

    app.router.add_get("/v1/models", leader_only(api.models))
    app.router.add_post("/v1/chat/completions", leader_only(api.chat))
    app.router.add_post("/v1/completions", leader_only(api.completions))
    return app
