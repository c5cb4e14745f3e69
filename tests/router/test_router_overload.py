"""Busy is not broken: a full unit's 429 never changes its routability, a not-ready unit's 503 does, and
a router sends nothing to a unit that reports a wait past its queue timeout (stand-in units)."""

from __future__ import annotations

import asyncio
import json

import aiohttp
from router_standins import StandInUnit
from router_testkit import post, router_over, run, wait_for

import contract


async def units(*names: str) -> list[StandInUnit]:
    return [await StandInUnit(name=n).start() for n in names]


async def stop_all(us) -> None:
    for u in us:
        await u.stop()


def test_a_busy_429_never_changes_a_units_routability():
    async def scenario():
        (a,) = us = await units("a")
        a.refuse, a.refuse_code, a.retry_after = 429, contract.BUSY_CODE_SHED, "7"
        async with router_over(us, poll_interval_s=30.0) as router, aiohttp.ClientSession() as s:
            unit = router.fleet.members[a.url]
            answers = [await post(s, router) for _ in range(5)]
            routable_after_busy = unit.routable
            a.refuse = None  # room again: the very next request is served
            served = await post(s, router)
        await stop_all(us)
        assert [status for status, _, _ in answers] == [429] * 5
        assert all(h["Retry-After"] == "7" for _, h, _ in answers)  # the unit's own expected wait
        assert routable_after_busy
        assert served[0] == 200 and len(a.received) == 6

    run(scenario())


def test_a_503_queue_timeout_of_an_older_revision_is_busy_not_broken():
    async def scenario():
        (a,) = us = await units("a")
        a.refuse, a.refuse_code = 503, contract.BUSY_CODE_QUEUE_TIMEOUT
        async with router_over(us, poll_interval_s=30.0) as router, aiohttp.ClientSession() as s:
            status, _, _ = await post(s, router)
            routable = router.fleet.members[a.url].routable
        await stop_all(us)
        assert status == 503 and routable

    run(scenario())


def test_a_503_from_a_unit_that_reports_itself_not_ready_takes_it_out():
    async def scenario():
        a, b = us = await units("a", "b")
        b.queue_depth = 3  # a is the less loaded: the first pick
        a.refuse, a.refuse_code = 503, "unit_unavailable"
        async with router_over(us, poll_interval_s=30.0) as router, aiohttp.ClientSession() as s:
            status, headers, _ = await post(s, router)
            routable = router.fleet.members[a.url].routable
        await stop_all(us)
        assert status == 200 and headers[contract.UNIT_HEADER] == "b"
        assert not routable

    run(scenario())


def test_a_unit_reporting_a_wait_past_its_queue_timeout_gets_nothing_and_stays_routable():
    async def scenario():
        a, b = us = await units("a", "b")
        b.queue_depth = 3  # by load alone a would be picked
        a.wait_s, a.queue_timeout_s = 40.0, 25.0
        async with router_over(us) as router, aiohttp.ClientSession() as s:
            await wait_for(lambda: router.fleet.members[a.url].wait_s == 40.0)
            answers = [await post(s, router) for _ in range(5)]
            routable = router.fleet.members[a.url].routable
        await stop_all(us)
        assert [h[contract.UNIT_HEADER] for _, h, _ in answers] == ["b"] * 5
        assert a.received == [] and routable

    run(scenario())


def test_every_unit_full_gets_429_at_once_with_the_shortest_expected_wait():
    async def scenario():
        a, b = us = await units("a", "b")
        a.wait_s, b.wait_s = 40.2, 31.5
        a.queue_timeout_s = b.queue_timeout_s = 25.0
        async with router_over(us) as router, aiohttp.ClientSession() as s:
            fleet = router.fleet
            await wait_for(lambda: fleet.members[a.url].wait_s == 40.2 and fleet.members[b.url].wait_s == 31.5)
            status, headers, body = await asyncio.wait_for(post(s, router), 1.0)  # told at once, not queued
            routable = fleet.routable_count()
        await stop_all(us)
        assert status == 429 and headers["Retry-After"] == "32"
        assert json.loads(body)["error"]["code"] == "overloaded"
        assert a.received == [] and b.received == [] and routable == 2

    run(scenario())


def test_no_unit_ready_is_still_503_no_unit_ready_when_units_are_also_full():
    async def scenario():
        (a,) = us = await units("a")
        a.wait_s, a.queue_timeout_s = 40.0, 25.0
        async with router_over(us) as router, aiohttp.ClientSession() as s:
            a.state = "draining"
            await wait_for(lambda: router.fleet.routable_count() == 0)
            status, _, body = await post(s, router)
        await stop_all(us)
        assert status == 503 and json.loads(body)["error"]["code"] == "no_unit_ready"

    run(scenario())


def test_a_units_retry_after_past_what_sdks_honour_reaches_the_client_capped():
    """openai-python gives up at once on a Retry-After above 120 s (contract/busy.py): a unit of an
    older revision that sends more is passed on capped."""

    async def scenario():
        (a,) = us = await units("a")
        a.refuse, a.refuse_code, a.retry_after = 429, contract.BUSY_CODE_SHED, "3600"
        async with router_over(us, poll_interval_s=30.0) as router, aiohttp.ClientSession() as s:
            status, headers, _ = await post(s, router)
        await stop_all(us)
        assert status == 429 and headers["Retry-After"] == str(contract.RETRY_AFTER_MAX_S)

    run(scenario())
