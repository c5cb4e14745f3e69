"""A deliberately fast stand-in unit for the router benchmark: raw asyncio HTTP/1.1, keep-alive.

It answers /health/ready (ready, idle), a small non-streaming completion, and an SSE stream of
`--events` events, so that the measured cost is the router's, not the backend's. Not a unit.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

READY = json.dumps(
    {
        "ready": True,
        "state": "ready",
        "unit": "bench",
        "revision": "1",
        "rank": 0,
        "world_size": 1,
        "load": {"queue_depth": 0, "running": 0, "max_running": 64, "kv_cache_used": 0.0},
    }
).encode()
COMPLETION = json.dumps(
    {
        "id": "cmpl-bench",
        "object": "text_completion",
        "created": 0,
        "model": "tiny",
        "choices": [{"index": 0, "text": "hello world", "finish_reason": "length"}],
        "usage": {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6},
    }
).encode()


def response(status: bytes, body: bytes, ctype: bytes = b"application/json") -> bytes:
    return (
        b"HTTP/1.1 "
        + status
        + b"\r\nContent-Type: "
        + ctype
        + b"\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\nX-Flotilla-Unit: bench\r\nX-Flotilla-Revision: 1\r\n\r\n"
        + body
    )


STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
    b"X-Flotilla-Unit: bench\r\n\r\n"
)
# The [DONE] event in its chunk, then the empty chunk that ends the response.
STREAM_END = b"%x\r\n%s\r\n0\r\n\r\n" % (len(b"data: [DONE]\n\n"), b"data: [DONE]\n\n")


def _chunk(event: bytes) -> bytes:
    """One HTTP/1.1 chunk carrying one SSE event."""
    return b"%x\r\n%s\r\n" % (len(event), event)


def sse_chunks(events: int) -> list[bytes]:
    out = [STREAM_HEAD]
    for i in range(events):
        ev = (
            b"data: "
            + json.dumps(
                {
                    "id": "cmpl-bench",
                    "object": "text_completion",
                    "choices": [{"index": 0, "text": f" tok{i}", "finish_reason": None}],
                }
            ).encode()
            + b"\n\n"
        )
        out.append(_chunk(ev))
    out.append(STREAM_END)
    return out


async def paced_stream(transport, events: int, pace_s: float) -> None:
    """Events spaced like decode steps, each stamped with CLOCK_MONOTONIC (shared by every process
    on the machine), so the client can measure each event's delivery latency."""
    transport.write(STREAM_HEAD)
    for i in range(events):
        await asyncio.sleep(pace_s)
        ev = b'data: {"t": %.9f, "choices": [{"index": 0, "text": " tok%d"}]}\n\n' % (time.perf_counter(), i)
        transport.write(_chunk(ev))
    transport.write(STREAM_END)


class Backend(asyncio.Protocol):
    ready = response(b"200 OK", READY)
    completion = response(b"200 OK", COMPLETION)
    stream: list[bytes] = []
    paced_events = 16
    pace_s = 0.005

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.buf = b""

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end]
            length = 0
            lower = head.lower()
            at = lower.find(b"content-length:")
            if at >= 0:
                length = int(lower[at + 15 :].split(b"\r\n", 1)[0])
            if len(self.buf) < end + 4 + length:
                return
            body = self.buf[end + 4 : end + 4 + length]
            self.buf = self.buf[end + 4 + length :]
            if head.startswith(b"GET /health"):
                self.transport.write(self.ready)
            elif b'"paced": true' in body:
                asyncio.get_running_loop().create_task(paced_stream(self.transport, self.paced_events, self.pace_s))
            elif b'"stream": true' in body or b'"stream":true' in body:
                # one write per event, as a token-by-token unit would do
                for chunk in self.stream:
                    self.transport.write(chunk)
            else:
                self.transport.write(self.completion)


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--events", type=int, default=32)
    args = ap.parse_args()
    Backend.stream = sse_chunks(args.events)
    server = await asyncio.get_running_loop().create_server(Backend, "127.0.0.1", args.port, backlog=1024)
    print("backend ready", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
