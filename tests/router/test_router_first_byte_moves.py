"""A request whose unit stops before answering starts again on another unit: the router gives up a
request still waiting for its first byte once its unit leaves routing for a failure (a stopped
leader goes silent, a hung engine reports not ready), within the move budget. Nothing of the first
unit's answer can reach the client: its connection is closed before the second unit is asked."""

from __future__ import annotations

import asyncio
import json

import aiohttp
from router_standins import StandInUnit
from router_testkit import base_url, router_over, run, wait_for

import contract

HUNG_S = 30.0  # far past every bound below: only leaving the unit ends the wait


async def _pair() -> tuple[StandInUnit, StandInUnit]:
    a, b = [await StandInUnit(name=n).start() for n in ("a", "b")]
    b.state = "forming"  # the request goes to a: b becomes routable only once a holds it
    a.first_byte_delay_s = HUNG_S
    return a, b


async def _stop(*us: StandInUnit) -> None:
    for u in us:
        await u.stop()


async def _post(session: aiohttp.ClientSession, router, payload: dict) -> tuple[int, dict, bytes]:
    async with session.post(base_url(router) + "/v1/completions", json=payload) as resp:
        return resp.status, dict(resp.headers), await resp.read()


def _retries(router, reason: str) -> float:
    return router.metrics.retries.labels(reason)._value.get()


def test_a_plain_request_whose_leader_stops_before_answering_is_answered_whole_by_another_unit():
    async def scenario():
        a, b = await _pair()
        async with router_over([a, b], first_byte_timeout_s=HUNG_S) as router, aiohttp.ClientSession() as s:
            call = asyncio.create_task(_post(s, router, {"model": "tiny", "prompt": "hi", "max_tokens": 3}))
            await wait_for(lambda: len(a.received) == 1, what="the request to reach a")
            b.state = "ready"
            a.hang = True  # a stopped leader: its watch falls silent, its answer never comes
            status, headers, body = await asyncio.wait_for(call, 15)
            moved = _retries(router, "left_before_first_byte")
        await _stop(a, b)
        assert status == 200, body
        assert headers[contract.UNIT_HEADER] == "b" and json.loads(body)["unit"] == "b"
        assert len(a.received) == 1 and len(b.received) == 1  # asked once each: one answer
        assert moved == 1

    run(scenario())


def test_a_stream_whose_leader_stops_before_its_first_byte_is_streamed_once_by_another_unit():
    async def scenario():
        a, b = await _pair()
        async with router_over([a, b], first_byte_timeout_s=HUNG_S) as router, aiohttp.ClientSession() as s:
            payload = {"model": "tiny", "prompt": "hi", "max_tokens": 3, "stream": True}
            call = asyncio.create_task(_post(s, router, payload))
            await wait_for(lambda: len(a.received) == 1, what="the request to reach a")
            b.state = "ready"
            a.state = "broken"  # its engine hung: the leader answers, and says it is not ready
            status, headers, body = await asyncio.wait_for(call, 15)
        await _stop(a, b)
        assert status == 200 and headers[contract.UNIT_HEADER] == "b"
        events = [json.loads(e[len(b"data: ") :]) for e in body.split(b"\n\n") if e.startswith(b"data: {")]
        assert [e["choices"][0]["text"] for e in events] == ["tok0 ", "tok1 ", "tok2 "]
        assert {e["unit"] for e in events} == {"b"} and body.endswith(b"data: [DONE]\n\n")

    run(scenario())


def test_a_request_on_a_draining_unit_is_left_to_the_unit():
    """A draining leader hands its requests over itself (or finishes them): the router keeps waiting."""

    async def scenario():
        a, b = await _pair()
        a.first_byte_delay_s = 2.5  # longer than the router's look-and-grace, shorter than its timeout
        async with router_over([a, b], first_byte_timeout_s=HUNG_S) as router, aiohttp.ClientSession() as s:
            call = asyncio.create_task(_post(s, router, {"model": "tiny", "prompt": "hi", "max_tokens": 3}))
            await wait_for(lambda: len(a.received) == 1, what="the request to reach a")
            b.state = "ready"
            a.state = "draining"
            status, headers, _ = await asyncio.wait_for(call, 15)
        await _stop(a, b)
        assert status == 200 and headers[contract.UNIT_HEADER] == "a"
        assert b.received == []

    run(scenario())


def test_without_moves_a_request_waits_for_its_unit_to_the_first_byte_timeout():
    async def scenario():
        a, b = await _pair()
        async with router_over([a, b], first_byte_timeout_s=3.0, max_moves=0) as router, aiohttp.ClientSession() as s:
            call = asyncio.create_task(_post(s, router, {"model": "tiny", "prompt": "hi", "max_tokens": 3}))
            await wait_for(lambda: len(a.received) == 1, what="the request to reach a")
            b.state = "ready"
            a.hang = True
            status, _, body = await asyncio.wait_for(call, 15)
        await _stop(a, b)
        assert status == 504 and json.loads(body)["error"]["code"] == "unit_timeout"
        assert b.received == []

    run(scenario())


def test_the_moves_before_the_first_byte_are_bounded_by_the_move_budget():
    async def scenario():
        a, b = await _pair()
        c = await StandInUnit(name="c").start()
        c.state = "forming"
        b.first_byte_delay_s = HUNG_S
        async with (
            router_over([a, b, c], first_byte_timeout_s=4.0, max_moves=1) as router,
            aiohttp.ClientSession() as s,
        ):
            call = asyncio.create_task(_post(s, router, {"model": "tiny", "prompt": "hi", "max_tokens": 3}))
            await wait_for(lambda: len(a.received) == 1, what="the request to reach a")
            b.state = "ready"
            a.hang = True
            await wait_for(lambda: len(b.received) == 1, what="the request to move to b")
            c.state = "ready"
            b.hang = True  # b stops too, but the one move is spent: the request stays with b
            status, _, body = await asyncio.wait_for(call, 15)
        await _stop(a, b, c)
        assert status == 504 and json.loads(body)["error"]["code"] == "unit_timeout"
        assert c.received == []

    run(scenario())


def test_with_no_other_unit_routable_a_request_keeps_waiting_for_its_unit():
    async def scenario():
        (a,) = [await StandInUnit(name="a").start()]
        a.first_byte_delay_s = 4.0
        async with router_over([a], first_byte_timeout_s=HUNG_S) as router, aiohttp.ClientSession() as s:
            call = asyncio.create_task(_post(s, router, {"model": "tiny", "prompt": "hi", "max_tokens": 3}))
            await wait_for(lambda: len(a.received) == 1, what="the request to reach a")
            a.hang = True  # out of routing, and nowhere else to go
            await wait_for(lambda: not router.fleet.members[a.url].ready, what="a to leave routing")
            await asyncio.sleep(2 * router.settings.stale_after_s)  # past the grace a move would need
            a.hang = False
            status, headers, _ = await asyncio.wait_for(call, 15)
            moved = _retries(router, "left_before_first_byte")
        await _stop(a)
        assert status == 200 and headers[contract.UNIT_HEADER] == "a"
        assert moved == 0

    run(scenario())
