"""A test double of one unit leader: a real aiohttp server speaking the node contract (health and API).

It is NOT the node runtime: no engine, no model. It answers /health/ready with a scripted state and
load, and /v1/* with canned completions or SSE streams whose timing and failures a test controls.
Used to specify the router's logic (failover, retries, shedding, drain) independently of the engine.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time

from aiohttp import web

import contract


class StandInUnit:
    """Knobs (set by tests at any time): state, load, refuse (None|503|429), chunks, chunk_delay_s,
    break_after (cut the connection after N chunks), first_byte_delay_s, gate (an asyncio.Event a
    stream waits on after its first chunk, a plain completion before answering).
    rank / cell / report_role: the member's identity in its ready body (rank 0 leads; without
    report_role the body carries only the rank, and the router must decide from that).
    members / leader: a leader's followers as it reports them, a follower's leader (host:port).
    watch: serve /health/watch as the node does (False: a member of an older revision, 404)."""

    def __init__(
        self,
        *,
        name: str,
        revision: str = "1",
        rank: int = 0,
        cell: str = "",
        report_role: bool = True,
        watch: bool = True,
    ) -> None:
        self.name = name
        self.revision = revision
        self.rank = rank
        self.cell = cell
        self.report_role = report_role
        self.watch = watch
        self.members: list[dict] = []
        self.leader = ""
        self.watchers = 0  # open watch streams
        self.watch_queries: list[dict[str, str]] = []  # each watch's query, as the router asked
        self.hang = False  # accept and keep watch streams open but send nothing (a hung host)
        self._stopping = asyncio.Event()
        self.state = "ready"
        self.queue_depth = 0
        self.running = 0
        self.max_running = 8
        self.kv_cache_used = 0.0
        self.refuse: int | None = None
        self.refuse_code: str | None = None  # the refusal's OpenAI error code (default: the status)
        self.retry_after = "2"  # the refusal's Retry-After
        self.wait_s = 0.0  # reported wait for a batch slot (load.wait_s)
        self.queue_timeout_s = 0.0  # reported queue timeout (load.queue_timeout_s; 0: not said)
        self.chunks = 3
        self.chunk_delay_s = 0.0
        self.break_after: int | None = None
        self.first_byte_delay_s = 0.0
        self.chunked_plain = False  # plain (non-SSE) bodies without Content-Length
        self.gate: asyncio.Event | None = None
        self.received: list[str] = []  # request ids, in arrival order
        self.authorizations: list[str] = []  # Authorization headers that reached the unit
        self.route_keys: list[str] = []  # contract.ROUTE_KEY_HEADER of each completion request ("" if none)
        self.route_prompts: list[str] = []  # and its contract.ROUTE_PROMPT_HEADER ("" if none)
        self.route_marks: list[str] = []  # and its contract.ROUTE_MARKS_HEADER ("" if none)
        self.active = 0
        self.max_active = 0
        self.disconnects = 0  # streams the client (router) abandoned
        self.stream_bytes = 0  # SSE bytes this unit's streams handed to their connection, ever
        self.polls = 0
        self.port: int | None = None
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self, port: int = 0) -> "StandInUnit":
        app = web.Application()
        app.router.add_get(contract.NODE_READY_PATH, self._ready)
        if self.watch:
            app.router.add_get(contract.NODE_WATCH_PATH, self._watch)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._complete)
        app.router.add_post("/v1/completions", self._complete)
        self._stopping = asyncio.Event()
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        self.port = sock.getsockname()[1]
        await web.SockSite(self._runner, sock).start()
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            self._stopping.set()  # ends the watch loops, which cleanup would wait for
            await runner.cleanup()

    # --- handlers ----------------------------------------------------------------------------
    def _headers(self, request: web.Request) -> dict[str, str]:
        return {
            contract.REQUEST_ID_HEADER: request.headers.get(contract.REQUEST_ID_HEADER, "none"),
            contract.UNIT_HEADER: self.name,
            contract.REVISION_HEADER: self.revision,
        }

    async def _open_resumable(
        self, request: web.Request, continuations: list[list[int]], opening_id: str
    ) -> tuple[web.StreamResponse, int]:
        """Open a stream that speaks the resume channel: a continuation (the router's continuation
        header and body) is appended to `continuations` and keeps its completion id and arrival time;
        a first answer gets `opening_id` and now. Returns the prepared response and the index of the
        first token to send (the number of tokens the continuation already has)."""
        payload = await request.json()
        cont = payload.get(contract.CONTINUATION_FIELD)
        start = 0
        if request.headers.get(contract.CONTINUATION_HEADER) == "1":
            continuations.append(list(cont["token_ids"]))
            start = len(cont["token_ids"])
        headers = {
            **self._headers(request),
            "Content-Type": "text/event-stream",
            contract.COMPLETION_ID_HEADER: cont["id"] if cont else opening_id,
            contract.ARRIVAL_HEADER: str(cont["created"] if cont else int(time.time())),
        }
        resp = web.StreamResponse(headers=headers)
        await resp.prepare(request)
        return resp, start

    def ready_body(self) -> dict:
        ready = self.state == "ready"
        body = {
            "ready": ready,
            "state": self.state,
            "unit": self.name,
            "revision": self.revision,
            "rank": self.rank,
            "world_size": 2,
            contract.ATTR_CELL: self.cell,
            "load": {
                "queue_depth": self.queue_depth,
                "running": self.running,
                "max_running": self.max_running,
                "kv_cache_used": self.kv_cache_used,
                "wait_s": self.wait_s,
                "queue_timeout_s": self.queue_timeout_s,
            },
        }
        if self.report_role:
            body[contract.ATTR_ROLE] = "leader" if self.rank == 0 else "follower"
        if self.members:
            body[contract.ATTR_MEMBERS] = self.members
        if self.leader:
            body[contract.ATTR_LEADER] = self.leader
        return body

    async def _ready(self, request: web.Request) -> web.Response:
        self.polls += 1
        body = self.ready_body()
        return web.json_response(body, status=200 if body["ready"] else 503)

    async def _watch(self, request: web.Request) -> web.StreamResponse:
        """The node's watch: a line now, then every `interval` the body if changed, else an empty line."""
        self.watch_queries.append(dict(request.query))
        interval = float(request.query.get("interval", "0.25"))
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await resp.prepare(request)
        self.watchers += 1
        last = b""
        try:
            while not self._stopping.is_set():
                if not self.hang:
                    line = json.dumps(self.ready_body()).encode()
                    await resp.write(line + b"\n" if line != last else b"\n")
                    last = line
                try:
                    await asyncio.wait_for(self._stopping.wait(), interval)
                except asyncio.TimeoutError:
                    pass
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self.watchers -= 1
        return resp

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": "tiny", "object": "model"}]}, headers=self._headers(request)
        )

    async def _complete(self, request: web.Request) -> web.StreamResponse:
        payload = await request.json()
        self.received.append(request.headers.get(contract.REQUEST_ID_HEADER, ""))
        self.route_keys.append(request.headers.get(contract.ROUTE_KEY_HEADER, ""))
        self.route_prompts.append(request.headers.get(contract.ROUTE_PROMPT_HEADER, ""))
        self.route_marks.append(request.headers.get(contract.ROUTE_MARKS_HEADER, ""))
        if "Authorization" in request.headers:
            self.authorizations.append(request.headers["Authorization"])
        if self.refuse is not None:
            return web.json_response(
                {
                    "error": {
                        "message": f"unit {self.name} refuses",
                        "type": "x",
                        "code": self.refuse_code or self.refuse,
                    }
                },
                status=self.refuse,
                headers={**self._headers(request), "Retry-After": self.retry_after},
            )
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            if self.first_byte_delay_s:
                try:  # cut short by stop(): a unit the router gave up on must not hold the test's end
                    await asyncio.wait_for(self._stopping.wait(), self.first_byte_delay_s)
                except asyncio.TimeoutError:
                    pass
            if payload.get("stream"):
                return await self._stream(request)
            if self.gate is not None:
                await self.gate.wait()
            text = " ".join(f"tok{i}" for i in range(self.chunks))
            if self.break_after is not None:
                # Announce a body, send part of it, then die: a unit that fails mid-response.
                resp = web.StreamResponse(headers=self._headers(request))
                if not self.chunked_plain:
                    resp.content_length = 1000
                resp.content_type = "application/json"
                await resp.prepare(request)
                await resp.write(b'{"id": "cmpl-partial", "choices": [')
                await asyncio.sleep(0.05)
                request.transport.abort()
                return resp
            return web.json_response(
                {
                    "id": "cmpl-1",
                    "object": "text_completion",
                    "created": int(time.time()),
                    "model": "tiny",
                    "unit": self.name,
                    "choices": [{"index": 0, "text": text, "finish_reason": "length"}],
                },
                headers=self._headers(request),
            )
        finally:
            self.active -= 1

    async def _stream(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(
            headers={**self._headers(request), "Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await resp.prepare(request)
        try:
            for i in range(self.chunks):
                if self.break_after is not None and i == self.break_after:
                    request.transport.abort()  # the unit dies mid-stream
                    return resp
                event = {
                    "id": "cmpl-s",
                    "object": "text_completion",
                    "model": "tiny",
                    "unit": self.name,
                    "choices": [{"index": 0, "text": f"tok{i} ", "finish_reason": None}],
                }
                data = b"data: " + json.dumps(event).encode() + b"\n\n"
                await resp.write(data)
                self.stream_bytes += len(data)
                if i == 0 and self.gate is not None:
                    await self.gate.wait()
                if self.chunk_delay_s:
                    await asyncio.sleep(self.chunk_delay_s)
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except (ConnectionError, asyncio.CancelledError):
            self.disconnects += 1
            raise
        return resp
