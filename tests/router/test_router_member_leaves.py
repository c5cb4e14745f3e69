"""A member leaving discovery while requests to it are open: they complete (or end with an explicit
error when the member then stops answering), nothing hangs, no new request reaches it, and the
router forgets it once its last request ended (docs/discovery.md: "no new requests go there")."""

from __future__ import annotations

import asyncio
import json

import aiohttp
from router_standins import StandInUnit
from router_testkit import base_url, router_over, run, wait_for

from runtime.router.discovery import StaticDiscovery

STREAM = {"model": "tiny", "prompt": "hi", "stream": True}
PLAIN = {"model": "tiny", "prompt": "hi", "max_tokens": 3}
BOUNDED = aiohttp.ClientTimeout(total=5)


async def _open_on_a_then_leave(router, a, b, s, units_file):
    """A stream and a plain request held open on `a`, then `a` leaves the units file."""
    stream = await s.post(base_url(router) + "/v1/completions", json=STREAM)
    first = await asyncio.wait_for(stream.content.readuntil(b"\n\n"), 5)
    assert b"tok0" in first
    plain = asyncio.ensure_future(s.post(base_url(router) + "/v1/completions", json=PLAIN))
    await wait_for(lambda: a.active == 2, what="both requests to reach a")
    units_file.write_text(f"{b.url}\n")
    await wait_for(lambda: router.fleet.members[a.url].removed, what="the router to see a leave")
    return stream, plain


def test_requests_open_on_a_member_that_leaves_discovery_complete_and_new_ones_go_elsewhere(tmp_path):
    async def scenario():
        a, b = [await StandInUnit(name=n).start() for n in ("a", "b")]
        units_file = tmp_path / "units.txt"
        units_file.write_text(f"{a.url}\n")
        a.gate = asyncio.Event()
        try:
            async with (
                router_over([a], discovery=StaticDiscovery(units_file=str(units_file))) as router,
                aiohttp.ClientSession() as s,
            ):
                stream, plain = await _open_on_a_then_leave(router, a, b, s, units_file)
                await wait_for(lambda: router.fleet.routable_count() == 1, what="b to be routable")
                # While a still serves its open requests, new ones reach b only.
                received = len(a.received)
                for _ in range(4):
                    async with s.post(base_url(router) + "/v1/completions", json=PLAIN, timeout=BOUNDED) as resp:
                        assert resp.status == 200 and (await resp.json())["unit"] == "b"
                assert len(a.received) == received and len(b.received) == 4
                assert a.url in router.fleet.members  # kept while its requests are open
                a.gate.set()
                rest = await asyncio.wait_for(stream.read(), 5)
                answer = await asyncio.wait_for(plain, 5)
                assert rest.endswith(b"data: [DONE]\n\n") and b"error" not in rest
                assert answer.status == 200 and (await answer.json())["unit"] == "a"
                await wait_for(lambda: a.url not in router.fleet.members, what="the router to forget a")
                assert router.inflight == 0
        finally:
            a.gate.set()
            await a.stop()
            await b.stop()

    run(scenario())


def test_requests_open_on_a_member_that_left_and_then_hangs_end_with_an_explicit_error(tmp_path):
    async def scenario():
        a, b = [await StandInUnit(name=n).start() for n in ("a", "b")]
        units_file = tmp_path / "units.txt"
        units_file.write_text(f"{a.url}\n")
        a.gate = asyncio.Event()  # never set while the router waits: the member hangs
        try:
            async with (
                router_over(
                    [a], discovery=StaticDiscovery(units_file=str(units_file)), idle_stream_timeout_s=0.5
                ) as router,
                aiohttp.ClientSession() as s,
            ):
                stream, plain = await _open_on_a_then_leave(router, a, b, s, units_file)
                rest = await asyncio.wait_for(stream.read(), 10)
                events = [e for e in rest.split(b"\n\n") if e]
                assert json.loads(events[-1][len(b"data: ") :])["error"]["code"] == "idle_timeout"
                assert b"[DONE]" not in rest
                # The plain request is bounded by --first-byte-timeout (5 s here): a 504, not a hang.
                answer = await asyncio.wait_for(plain, 15)
                assert answer.status == 504 and (await answer.json())["error"]["code"] == "unit_timeout"
                await wait_for(lambda: a.url not in router.fleet.members, what="the router to forget a")
                assert router.inflight == 0 and b.received == []
        finally:
            a.gate.set()
            await a.stop()
            await b.stop()

    run(scenario())
