"""A streaming client that stays connected but stops reading: the router's buffers stay bounded, the
request ends once the client has accepted nothing for --idle-stream-timeout (docs/router.md, "client
hang-up": such a client "counts as gone"), the unit's stream is closed (which cancels it in the
engine and frees its batch slot) and nothing stays counted in flight."""

from __future__ import annotations

import asyncio
from pathlib import Path

from router_standins import StandInUnit
from router_testkit import router_over, run, wait_for
from testnet import StalledReader

IDLE_S = 1.0


def _kernel_max(name: str) -> int:
    """The most Linux's autotuning lets one socket buffer hold (the third figure of the sysctl)."""
    return int(Path(f"/proc/sys/net/ipv4/{name}").read_text().split()[2])


# What may sit in buffers between the unit and a client that reads nothing: the stand-in's send
# buffer and the router's receive buffer from it (Linux autotunes each up to tcp_wmem / tcp_rmem's
# max, as the peer's window allows: the client's tiny window keeps the router's send buffer to it
# small), plus aiohttp's 64 KiB write-buffer limit before a drain (aiohttp 3.14.5
# http_writer.py:158,211) and its reader's high-water mark of twice its limit (streams.py:118):
# 2 MiB of slack for both. A router that read the unit's stream regardless of its client would
# take all of the stream, which is twice that.
BOUND_BYTES = _kernel_max("tcp_wmem") + _kernel_max("tcp_rmem") + 2 * 1024 * 1024
CHUNKS = 2 * BOUND_BYTES // 150  # the stand-in's events are 150-odd bytes


def test_a_client_that_stops_reading_is_dropped_after_the_idle_bound_and_the_unit_stream_is_released():
    async def scenario():
        unit = await StandInUnit(name="a").start()
        unit.chunks = CHUNKS
        try:
            async with router_over([unit], idle_stream_timeout_s=IDLE_S) as router:
                client = StalledReader(router.port, "/v1/completions", {"prompt": "hi", "stream": True})
                status = await asyncio.to_thread(client.open)
                try:
                    assert status.startswith(b"HTTP/1.1 200"), status
                    await wait_for(lambda: unit.active == 1, what="the unit to stream")
                    # Once the buffers fill the unit's writes block; the router gives up on the client
                    # IDLE_S after its own write blocked and closes the unit's stream.
                    await wait_for(
                        lambda: unit.disconnects == 1 and unit.active == 0,
                        timeout=IDLE_S + 20,
                        what="the router to close the unit's stream of a client that reads nothing",
                    )
                    assert unit.stream_bytes < BOUND_BYTES, unit.stream_bytes
                    await wait_for(lambda: router.inflight == 0, what="the request to leave the in-flight count")
                    assert router.fleet.members[unit.url].outstanding == 0
                    assert await asyncio.to_thread(client.closed_by_peer), "the router kept the client's connection"
                finally:
                    client.close()
                # The unit stays routable and serves the next request.
                assert router.fleet.routable_count() == 1
        finally:
            await unit.stop()

    run(scenario())
