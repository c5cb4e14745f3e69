"""One leader's /health/watch stream as the router reads it (contract.watch): the response head, then
one line at a time handed to the fleet."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from runtime.router.fleet import Fleet, Member

# A watch response head larger than this is not a flotilla member's.
_WATCH_HEAD_LIMIT = 16 * 1024


class WatchStream(asyncio.Protocol):
    """One leader's /health/watch stream, read without an HTTP client library: this is the router's
    steady cost per leader (a line per poll interval), so it is kept to a buffer scan and a JSON
    parse. Asked as HTTP/1.0, the member ends the body by closing the connection (no chunking)."""

    def __init__(self, fleet: Fleet, unit: Member, request: bytes) -> None:
        self._fleet = fleet
        self._unit = unit
        self._request = request
        self._buf = bytearray()
        self._head = True
        self.transport: asyncio.Transport | None = None
        self.outcome = "lost"  # lost | follower | unsupported
        self.ended: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport, but not an asyncio.Transport instance under uvloop (its TCPTransport
        # implements the interface without subclassing it), so no isinstance check here: one made
        # every watch fail under `--event-loop uvloop`, and every unit looked silent.
        self.transport = cast(asyncio.Transport, transport)
        self.transport.write(self._request)

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        if data and not buf and not self._head and data.find(b"\n") == len(data) - 1:
            # One whole line, nothing pending: most reads of a busy fleet; no buffer copies.
            if not self._fleet.on_watch_line(self._unit, data[:-1]):
                self.close("follower")
            return
        buf += data
        if self._head:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > _WATCH_HEAD_LIMIT:
                    self.close("lost")
                return
            status = buf[: buf.find(b"\r\n")].split(b" ", 2)
            code = int(status[1]) if len(status) > 1 and status[1].isdigit() else 0
            streams = b"application/x-ndjson" in bytes(buf[:end]).lower()
            del buf[: end + 4]
            if code == 404 or (code == 200 and not streams):
                # A member of an older revision (no watch there), or a server that answered with a
                # plain document: poll it instead.
                self.close("unsupported")
                return
            if code != 200:
                self.close("lost")
                return
            self._head = False
        start = 0
        while True:
            nl = buf.find(b"\n", start)
            if nl < 0:
                break
            line = bytes(buf[start:nl])
            start = nl + 1
            if not self._fleet.on_watch_line(self._unit, line):
                self.close("follower")
                return
        if start:
            del buf[:start]

    def close(self, outcome: str) -> None:
        self.outcome = outcome
        if self.transport is not None:
            self.transport.abort()  # no lingering FIN dance: the member may be dead

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.ended.done():
            self.ended.set_result(self.outcome)
