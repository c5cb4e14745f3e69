"""Load shedding, /health and /metrics of the router, specified against stand-in units (test doubles)."""

from __future__ import annotations

import asyncio
import json

import aiohttp
from router_standins import StandInUnit
from router_testkit import base_url, metrics_url, post, router_over, run, wait_for


def test_every_unit_saturated_by_reported_queue_gets_429_with_retry_after():
    async def scenario():
        a = await StandInUnit(name="a").start()
        a.queue_depth = 4
        async with router_over([a], max_queue_depth=4) as router, aiohttp.ClientSession() as s:
            await wait_for(lambda: router.fleet.members[a.url].queue_depth == 4)
            status, headers, body = await post(s, router)
        await a.stop()
        assert status == 429 and headers["Retry-After"] == "1"
        assert json.loads(body)["error"]["code"] == "overloaded"
        assert a.received == []

    run(scenario())


def test_router_never_has_more_than_its_cap_in_flight_to_a_unit_and_sheds_the_rest():
    async def scenario():
        a = await StandInUnit(name="a").start()
        a.gate = asyncio.Event()
        async with router_over([a], max_outstanding_per_unit=3) as router, aiohttp.ClientSession() as s:

            async def stream():
                async with s.post(base_url(router) + "/v1/completions", json={"prompt": "x", "stream": True}) as resp:
                    return resp.status, await resp.read()

            streams = [asyncio.create_task(stream()) for _ in range(3)]
            await wait_for(lambda: a.active == 3)
            extra = await asyncio.gather(*(post(s, router) for _ in range(20)))
            a.gate.set()
            done = await asyncio.gather(*streams)
        await a.stop()
        assert [status for status, _, _ in extra] == [429] * 20
        assert all(status == 200 and body.endswith(b"[DONE]\n\n") for status, body in done)
        assert a.max_active == 3 and len(a.received) == 3

    run(scenario())


def test_no_ready_unit_gets_503_with_retry_after():
    async def scenario():
        a = await StandInUnit(name="a").start()
        a.state = "forming"
        async with router_over([a]) as router, aiohttp.ClientSession() as s:
            status, headers, body = await post(s, router)
        await a.stop()
        assert status == 503 and headers["Retry-After"] == "1"
        assert json.loads(body)["error"]["code"] == "no_unit_ready"

    run(scenario())


def test_router_health_is_ok_even_when_no_unit_is_ready():
    async def scenario():
        a = await StandInUnit(name="a").start()
        a.state = "broken"
        async with router_over([a]) as router, aiohttp.ClientSession() as s:
            async with s.get(base_url(router) + "/health") as resp:
                status, body = resp.status, await resp.json()
        await a.stop()
        assert status == 200 and body == {"status": "ok", "routable_units": 0}

    run(scenario())


def test_router_health_turns_503_the_moment_a_drain_starts():
    async def scenario():
        a = await StandInUnit(name="a").start()
        async with router_over([a], drain_grace_s=0.5) as router, aiohttp.ClientSession() as s:
            drain = asyncio.create_task(router.drain())
            await asyncio.sleep(0)
            async with s.get(base_url(router) + "/health") as resp:
                health = resp.status
            status, _, _ = await post(s, router)  # still served during the grace period
            assert await drain is True
            late, headers, _ = await post(s, router)
        await a.stop()
        assert health == 503 and status == 200
        assert late == 503 and headers["Connection"] == "close"

    run(scenario())


def test_metrics_show_unit_state_routed_retries_shed_and_added_latency():
    async def scenario():
        a, b = [await StandInUnit(name=n, revision="7").start() for n in ("a", "b")]
        b.state = "draining"
        async with router_over([a, b], max_queue_depth=2) as router, aiohttp.ClientSession() as s:
            await post(s, router)
            a.queue_depth = 2
            await wait_for(lambda: router.fleet.members[a.url].queue_depth == 2)
            await post(s, router)
            async with s.get(metrics_url(router)) as resp:
                text = await resp.text()
        await a.stop()
        await b.stop()
        assert f'flotilla_router_unit_routable{{revision="7",unit="a",unit_url="{a.url}"}} 1.0' in text
        assert f'flotilla_router_unit_state{{revision="7",state="draining",unit="b",unit_url="{b.url}"}} 1.0' in text
        assert 'flotilla_router_requests_total{code="200",unit="a"} 1.0' in text
        assert 'flotilla_router_shed_total{reason="saturated"} 1.0' in text
        assert "flotilla_router_added_latency_seconds_count 1.0" in text
        assert "flotilla_router_routable_units 1.0" in text

    run(scenario())
