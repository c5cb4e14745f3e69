"""The watch protocol reads through any stream transport, not only asyncio's own classes.

uvloop's TCPTransport implements asyncio's transport interface without subclassing
asyncio.Transport (uvloop/handles/basetransport.pyx), and `--event-loop auto` runs the router on
uvloop wherever it is installed. A protocol that insisted on the class raised in connection_made:
no watch line was ever read and every unit fell silent."""

from __future__ import annotations

import asyncio

from router_testkit import run

from runtime.router.watch_stream import WatchStream


class DuckTransport:
    """What uvloop hands a protocol: write/abort/close, and no asyncio.Transport base class."""

    def __init__(self) -> None:
        self.written = b""
        self.aborted = False

    def write(self, data: bytes) -> None:
        self.written += data

    def abort(self) -> None:
        self.aborted = True

    def close(self) -> None:
        self.aborted = True

    def get_extra_info(self, name: str, default=None):
        return default


class Lines:
    def __init__(self) -> None:
        self.lines: list[bytes] = []

    def on_watch_line(self, unit, line: bytes) -> bool:
        self.lines.append(line)
        return True


def test_a_transport_that_is_not_an_asyncio_transport_subclass_carries_the_watch():
    async def scenario():
        fleet = Lines()
        proto = WatchStream(fleet, None, b"GET /health/watch HTTP/1.0\r\n\r\n")  # type: ignore[arg-type]
        transport = DuckTransport()
        assert not isinstance(transport, asyncio.Transport)
        proto.connection_made(transport)  # type: ignore[arg-type]
        proto.data_received(b"HTTP/1.0 200 OK\r\nContent-Type: application/x-ndjson\r\n\r\n")
        proto.data_received(b'{"load": {"in_flight": 1}}\n\n')
        proto.data_received(b'{"load": {"in_flight": 2}}\n')
        return transport, fleet

    transport, fleet = run(scenario())
    assert transport.written == b"GET /health/watch HTTP/1.0\r\n\r\n"
    assert fleet.lines == [b'{"load": {"in_flight": 1}}', b"", b'{"load": {"in_flight": 2}}']
    assert not transport.aborted
