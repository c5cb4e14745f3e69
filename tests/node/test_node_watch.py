"""/health/watch on the node's real HTTP app: the router's watch client reads it, and an open watch
never holds up the node's shutdown."""

from __future__ import annotations

import asyncio
import json

from aiohttp import web

from runtime.membership import Membership
from runtime.node.metrics import NodeMetrics
from runtime.node.server import build_app
from runtime.node.settings import load_settings
from runtime.node.supervisor import ROUTE_KEYS_KEPT, UnitSupervisor
from runtime.router.discovery import StaticDiscovery
from runtime.router.fleet import Fleet
from runtime.router.settings import RouterSettings


class _NeverJoins:
    async def join(self) -> Membership:
        raise AssertionError("not called")

    async def changed(self, current: Membership) -> bool:
        return False


async def _until(done, tries: int = 500) -> None:
    """Wait, at most `tries` x 10 ms, for done() (a report reaching the router); the caller asserts."""
    for _ in range(tries):
        if done():
            return
        await asyncio.sleep(0.01)


async def _serve_forming_leader() -> tuple[web.AppRunner, int, UnitSupervisor]:
    s = load_settings(["--peers", "127.0.0.1:18000", "--rank", "0", "--unit", "u7", "--cell", "cell3"], {})
    sup = UnitSupervisor(settings=s, rendezvous=_NeverJoins(), metrics=NodeMetrics())
    runner = web.AppRunner(build_app(sup=sup, metrics=NodeMetrics()), handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host="127.0.0.1", port=0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, port, sup


def test_the_router_watches_a_node_and_the_open_watch_does_not_hold_up_its_shutdown():
    async def scenario():
        runner, port, sup = await _serve_forming_leader()
        url = f"http://127.0.0.1:{port}"
        settings = RouterSettings(units=(url,), poll_interval_s=0.05, stale_after_s=5.0)
        fleet = Fleet(settings=settings, discovery=StaticDiscovery(units=(url,)))
        await fleet.start()
        try:
            for _ in range(500):
                if fleet.watch_lines >= 5:
                    break
                await asyncio.sleep(0.01)
            unit = fleet.members[url]
            assert fleet.watch_lines >= 5 and unit.watch is not None
            # A rank-0 member that is still forming: watched as a leader, not routable.
            assert (unit.role, unit.state, unit.routable, unit.unit, unit.cell) == (
                "leader",
                "forming",
                False,
                "u7",
                "cell3",
            )
            assert fleet.polls["follower"] == 0
            # aiohttp waits up to 60 s for running handlers at shutdown; the watch ends at once.
            await asyncio.wait_for(runner.cleanup(), 10)
            for _ in range(500):
                if unit.watch is None:
                    break
                await asyncio.sleep(0.01)
            assert unit.watch is None and unit.state == "unreachable"
        finally:
            await fleet.close()

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_outstanding_prefill_tokens_reach_the_router_within_the_change_report():
    async def scenario():
        runner, port, sup = await _serve_forming_leader()
        url = f"http://127.0.0.1:{port}"
        settings = RouterSettings(units=(url,), poll_interval_s=10.0, change_report_s=0.02, stale_after_s=30.0)
        fleet = Fleet(settings=settings, discovery=StaticDiscovery(units=(url,)))
        try:
            await fleet.start()
            unit = fleet.members[url]
            await _until(lambda: unit.watch is not None and unit.prefill_tokens == 0)
            assert unit.prefill_tokens == 0  # reported, not the -1 of a unit that does not say
            sup.prefill_tokens = 4096  # prompts accepted at the leader's API, not yet at a first token
            await _until(lambda: unit.prefill_tokens == 4096)
            assert unit.prefill_tokens == 4096
        finally:
            await fleet.close()
            await runner.cleanup()

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_a_change_of_requests_in_flight_is_sent_at_once_not_at_the_next_heartbeat():
    async def scenario():
        runner, port, sup = await _serve_forming_leader()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            # Heartbeats every 10 s, changes checked every 20 ms.
            writer.write(b"GET /health/watch?interval=10&changes=0.02 HTTP/1.0\r\n\r\n")
            await reader.readuntil(b"\r\n\r\n")
            first = json.loads(await reader.readline())
            assert first["load"]["in_flight"] == 0
            sup.in_flight = 3  # three requests arrived at the leader's API
            second = json.loads(await asyncio.wait_for(reader.readline(), 5))
            assert second["load"]["in_flight"] == 3
            writer.close()
        finally:
            await runner.cleanup()

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_a_line_for_a_load_change_carries_the_load_only_and_the_router_takes_it():
    async def scenario():
        runner, port, sup = await _serve_forming_leader()
        url = f"http://127.0.0.1:{port}"
        fleet = Fleet(
            settings=RouterSettings(units=(url,), poll_interval_s=0.05, stale_after_s=5.0),
            discovery=StaticDiscovery(units=(url,)),
        )
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /health/watch?interval=10&changes=0.02 HTTP/1.0\r\n\r\n")
            await reader.readuntil(b"\r\n\r\n")
            await reader.readline()  # the whole body
            sup.in_flight = 2
            line = await asyncio.wait_for(reader.readline(), 5)
            assert set(json.loads(line)) == {"load"}
            writer.close()
            await fleet.start()
            unit = fleet.members[url]
            for _ in range(500):
                if unit.watch is not None and unit.in_flight == 2:
                    break
                await asyncio.sleep(0.01)
            sup.in_flight = 5
            for _ in range(500):
                if unit.in_flight == 5:
                    break
                await asyncio.sleep(0.01)
            assert (unit.in_flight, unit.unit, unit.state) == (5, "u7", "forming")
        finally:
            await fleet.close()
            await runner.cleanup()

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_a_watch_line_lists_the_routing_keys_admitted_since_the_last_and_the_router_notes_their_unit():
    async def scenario():
        runner, port, sup = await _serve_forming_leader()
        url = f"http://127.0.0.1:{port}"
        try:
            sup.note_route_key(11)  # admitted before the watch began: not sent
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /health/watch?interval=10&changes=0.02 HTTP/1.0\r\n\r\n")
            await reader.readuntil(b"\r\n\r\n")
            assert "keys" not in json.loads(await reader.readline())
            big = 2**64 - 1  # keys are 64-bit BLAKE2b hashes (runtime/router/balance.py)
            sup.note_route_key(big)
            sup.note_route_key(7)  # nothing else changed: the keys alone make a line
            line = json.loads(await asyncio.wait_for(reader.readline(), 5))
            assert set(line) == {"load", "keys"} and line["keys"] == [big, 7]
            sup.in_flight = 1
            assert "keys" not in json.loads(await asyncio.wait_for(reader.readline(), 5))  # sent once
            writer.close()
            fleet = Fleet(
                settings=RouterSettings(units=(url,), poll_interval_s=0.05, stale_after_s=5.0),
                discovery=StaticDiscovery(units=(url,)),
            )
            try:
                await fleet.start()
                unit = fleet.members[url]
                await _until(lambda: unit.watch is not None and unit.in_flight == 1)
                sup.note_route_key(99)
                await _until(lambda: fleet.holders.get(99) is unit)
                assert fleet.holders.get(99) is unit and fleet.holders.get(11) is None
            finally:
                await fleet.close()
        finally:
            await runner.cleanup()

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_a_leader_keeps_only_its_latest_routing_keys_for_a_watch_that_fell_behind():
    s = load_settings(["--peers", "127.0.0.1:18000", "--rank", "0", "--unit", "u7"], {})
    sup = UnitSupervisor(settings=s, rendezvous=_NeverJoins(), metrics=NodeMetrics())
    seen = sup.route_keys_seen
    for k in range(ROUTE_KEYS_KEPT + 5):
        sup.note_route_key(k, (k, 1, 2) if k % 2 else None)  # odd keys came with a completion prompt
    assert [k for k, _ in sup.route_keys_since(seen)] == list(range(5, ROUTE_KEYS_KEPT + 5))
    last = ROUTE_KEYS_KEPT + 3
    assert sup.route_keys_since(sup.route_keys_seen - 2) == [
        (last, (last, 1, 2) if last % 2 else None),
        (last + 1, (last + 1, 1, 2) if (last + 1) % 2 else None),
    ]
    assert sup.route_keys_since(sup.route_keys_seen) == []
