"""A streamed response's server-sent events, each write bounded, and what a request has put out so far."""

from __future__ import annotations

import asyncio
import json
import time

from aiohttp import web
from pydantic import BaseModel


class RequestProgress:
    """A request's output so far: when its first token came, and its tokens (every choice's)."""

    __slots__ = ("first_token", "tokens")

    def __init__(self) -> None:
        self.first_token: float | None = None
        self.tokens = 0

    def token(self) -> None:
        if self.first_token is None:
            self.first_token = time.time()


def sse_event(payload: BaseModel | dict) -> bytes:
    body = payload.model_dump() if isinstance(payload, BaseModel) else payload
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


class EventStream:
    """One streamed response's server-sent events. Every write is bounded: a client that stops
    reading must not hold its batch slot for ever (past the bound it counts as gone)."""

    def __init__(self, request: web.Request, headers: dict[str, str], *, stall_s: float) -> None:
        self.request, self.stall_s = request, stall_s
        self.resp = web.StreamResponse(
            status=200,
            headers={
                **headers,
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",
            },
        )

    async def open(self) -> None:
        await self.resp.prepare(self.request)

    async def write(self, data: bytes, *, last: bool = False) -> None:
        """Write `data` if any (`last`: and end the stream; write_eof drains the buffer too, so it is
        bounded the same way); ConnectionError when the client accepted nothing for the bound."""
        if not data and not last:
            return
        try:
            async with asyncio.timeout(self.stall_s):
                await (self.resp.write_eof(data) if last else self.resp.write(data))
        except TimeoutError:
            if self.request.transport is not None:
                self.request.transport.abort()
            raise ConnectionError(f"the client accepted nothing for {self.stall_s:g} s") from None

    async def send(self, payload: BaseModel | dict, *, last: bool = False) -> None:
        await self.write(sse_event(payload), last=last)
