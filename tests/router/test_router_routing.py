"""Routing, failover and retry rules of the router, specified against stand-in units (test doubles)."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import openai
import pytest
from router_standins import StandInUnit
from router_testkit import base_url, metrics_url, post, router_over, run, wait_for

import contract
from runtime.router.fleet import _CONCURRENT_ASKS


def access_lines(stderr: str) -> list[dict]:
    """The router's access-log lines (one JSON object per routed request) among stderr's lines."""
    return [
        r
        for r in (json.loads(x) for x in stderr.splitlines() if x.startswith("{"))
        if r.get("event") == "router_request"
    ]


async def units(*names: str) -> list[StandInUnit]:
    return [await StandInUnit(name=n).start() for n in names]


async def stop_all(us) -> None:
    for u in us:
        await u.stop()


def test_request_reaches_a_ready_unit_and_keeps_the_client_request_id():
    async def scenario():
        (a,) = us = await units("a")
        async with router_over(us) as router, aiohttp.ClientSession() as s:
            status, headers, body = await post(s, router, headers={contract.REQUEST_ID_HEADER: "req-42"})
        await stop_all(us)
        assert status == 200
        assert headers[contract.REQUEST_ID_HEADER] == "req-42"
        assert headers[contract.UNIT_HEADER] == "a"
        assert a.received == ["req-42"]
        assert json.loads(body)["unit"] == "a"

    run(scenario())


def test_router_generates_a_request_id_when_the_client_sends_none():
    async def scenario():
        (a,) = us = await units("a")
        async with router_over(us) as router, aiohttp.ClientSession() as s:
            _, headers, _ = await post(s, router)
        await stop_all(us)
        rid = headers[contract.REQUEST_ID_HEADER]
        assert len(rid) == 32 and a.received == [rid]

    run(scenario())


def test_malformed_request_id_gets_400_naming_the_header():
    async def scenario():
        us = await units("a")
        async with router_over(us) as router, aiohttp.ClientSession() as s:
            status, _, body = await post(s, router, headers={contract.REQUEST_ID_HEADER: "bad id!"})
        await stop_all(us)
        assert status == 400
        assert contract.REQUEST_ID_HEADER in json.loads(body)["error"]["message"]
        assert us[0].received == []

    run(scenario())


def test_openai_client_works_through_the_router_streaming_and_not():
    async def scenario():
        us = await units("a")
        async with router_over(us) as router:
            client = openai.AsyncOpenAI(base_url=base_url(router) + "/v1", api_key="none", max_retries=0)
            done = await client.completions.create(model="tiny", prompt="hi", max_tokens=3)
            stream = await client.completions.create(model="tiny", prompt="hi", max_tokens=3, stream=True)
            pieces = [c.choices[0].text async for c in stream]
            models = await client.models.list()
            await client.close()
        await stop_all(us)
        assert done.choices[0].text == "tok0 tok1 tok2"
        assert pieces == ["tok0 ", "tok1 ", "tok2 "]
        assert [m.id for m in models.data] == ["tiny"]

    run(scenario())


def test_least_loaded_unit_by_reported_load_receives_the_request():
    async def scenario():
        a, b = us = await units("a", "b")
        a.queue_depth, a.running = 5, 8
        b.queue_depth, b.running = 0, 2
        async with router_over(us) as router, aiohttp.ClientSession() as s:
            await wait_for(lambda: router.fleet.members[a.url].queue_depth == 5)
            for _ in range(5):
                await post(s, router)
        await stop_all(us)
        assert len(b.received) == 5 and a.received == []

    run(scenario())


@pytest.mark.parametrize("policy", ["least_requests", "cache_aware"])
def test_router_outstanding_count_spreads_a_burst_between_idle_units(policy):
    """Ten requests of one prompt at once, reported load staying 0 (no poll in between): only what the
    router counts itself spreads them. By request count, exactly 5 and 5. By cache and work, the unit
    that took the key's last request keeps the next while its queue plus the request's uncached part is
    at most the other's plus the whole request plus a slack of what it is expected to hold
    (docs/routing.md, step 4): here the key's lead, about the whole prompt, so while its queue is at most
    about two prompts longer, the router counting each of its own sends whole until the unit reports
    (none of them is cached there yet). The first unit takes 3, the other then holds the key and takes
    6, until its queue is more than two prompts longer than the first's 3, and the last goes back: 4 and
    6, never further apart."""

    async def scenario():
        a, b = us = await units("a", "b")
        for u in us:
            u.first_byte_delay_s = 0.3
        async with router_over(us, poll_interval_s=5.0, balance=policy) as router, aiohttp.ClientSession() as s:
            await asyncio.gather(*(post(s, router) for _ in range(10)))
        await stop_all(us)
        return len(a.received), len(b.received)

    got = run(scenario())
    assert sum(got) == 10
    if policy == "least_requests":
        assert got == (5, 5)
    else:
        assert min(got) >= 4, got


def test_unit_that_is_not_ready_or_draining_gets_no_traffic():
    async def scenario():
        a, b, c = us = await units("a", "b", "c")
        b.state = "draining"
        c.state = "forming"
        async with router_over(us) as router, aiohttp.ClientSession() as s:
            for _ in range(6):
                await post(s, router)
        await stop_all(us)
        assert len(a.received) == 6 and b.received == [] and c.received == []

    run(scenario())


def test_a_failed_poll_marks_the_unit_unready_at_once():
    async def scenario():
        a, b = us = await units("a", "b")
        async with router_over(us) as router:
            unit = router.fleet.members[a.url]
            await a.stop()
            await router.fleet.poll_once(unit)
            assert not unit.routable and unit.state == "unreachable"
        await stop_all(us)

    run(scenario())


def test_unit_that_reforms_receives_traffic_again():
    async def scenario():
        a, b = us = await units("a", "b")
        async with router_over(us) as router, aiohttp.ClientSession() as s:
            a.state = "broken"
            await wait_for(lambda: not router.fleet.members[a.url].routable)
            for _ in range(4):
                await post(s, router)
            assert a.received == []
            a.state = "ready"
            b.queue_depth = 10
            await wait_for(
                lambda: router.fleet.members[a.url].routable and router.fleet.members[b.url].queue_depth == 10
            )
            await post(s, router)
        await stop_all(us)
        assert len(a.received) == 1

    run(scenario())


def test_connect_failure_moves_the_request_to_another_unit():
    async def scenario():
        # a has no watch (a member of an older revision): polled every 30 s, so when it dies the
        # router does not know yet and meets a refused connection.
        a = await StandInUnit(name="a", watch=False).start()
        b = await StandInUnit(name="b").start()
        us = [a, b]
        b.queue_depth = 3  # a is preferred
        async with router_over(us, poll_interval_s=30.0) as router, aiohttp.ClientSession() as s:
            # Routable after its first poll, a is then asked for its watch (a 404): stopped before that
            # answer, the router would find it gone through the watch and never try to send to it.
            await wait_for(lambda: router.fleet.members[a.url].watchable is False, what="a's watch to be found missing")
            await a.stop()  # the router does not know yet: no poll for 30 s
            status, headers, _ = await post(s, router)
            text = (await (await s.get(metrics_url(router))).read()).decode()
            assert not router.fleet.members[a.url].routable
        await stop_all(us)
        assert status == 200 and headers[contract.UNIT_HEADER] == "b"
        assert 'flotilla_router_retries_total{reason="connect"} 1.0' in text

    run(scenario())


def test_503_before_the_first_byte_moves_the_request_to_another_unit():
    async def scenario():
        a, b = us = await units("a", "b")
        b.queue_depth = 3
        a.refuse = 503
        async with router_over(us, poll_interval_s=30.0) as router, aiohttp.ClientSession() as s:
            status, headers, _ = await post(s, router, headers={contract.REQUEST_ID_HEADER: "r1"})
        await stop_all(us)
        assert status == 200 and headers[contract.UNIT_HEADER] == "b"
        assert a.received == ["r1"] and b.received == ["r1"]

    run(scenario())


def test_when_every_unit_refuses_the_last_refusal_reaches_the_client():
    async def scenario():
        (a,) = us = await units("a")
        a.refuse = 429
        async with router_over(us, poll_interval_s=30.0) as router, aiohttp.ClientSession() as s:
            status, headers, body = await post(s, router)
        await stop_all(us)
        assert status == 429 and headers["Retry-After"] == "2"
        assert "refuses" in json.loads(body)["error"]["message"]

    run(scenario())


def test_stream_broken_midway_ends_with_an_sse_error_and_is_never_replayed():
    async def scenario():
        a, b = us = await units("a", "b")
        b.queue_depth = 3
        a.break_after = 2
        async with router_over(us, poll_interval_s=30.0) as router:
            client = openai.AsyncOpenAI(base_url=base_url(router) + "/v1", api_key="none", max_retries=0)
            stream = await client.completions.create(model="tiny", prompt="hi", max_tokens=3, stream=True)
            pieces, error = [], None
            try:
                async for chunk in stream:
                    pieces.append(chunk.choices[0].text)
            except openai.APIError as exc:
                error = exc
            await client.close()
        await stop_all(us)
        assert pieces == ["tok0 ", "tok1 "]
        assert error is not None and "failed mid-response" in error.message
        assert b.received == []  # nothing was replayed on another unit

    run(scenario())


def test_unit_that_dies_before_a_plain_body_is_complete_is_retried_on_another_unit():
    async def scenario():
        a, b = us = await units("a", "b")
        b.queue_depth = 3
        a.break_after = 0  # announces a Content-Length, sends part of the body, dies
        async with router_over(us, poll_interval_s=30.0) as router, aiohttp.ClientSession() as s:
            status, headers, body = await post(s, router, headers={contract.REQUEST_ID_HEADER: "r2"})
        await stop_all(us)
        assert status == 200 and headers[contract.UNIT_HEADER] == "b"
        assert json.loads(body)["unit"] == "b" and a.received == ["r2"] == b.received

    run(scenario())


def test_chunked_plain_body_cut_short_is_an_error_at_the_client_not_a_short_success():
    async def scenario():
        a, b = us = await units("a", "b")
        b.queue_depth = 3
        a.break_after, a.chunked_plain = 0, True  # body of unknown length: relayed as it comes
        async with router_over(us, poll_interval_s=30.0) as router, aiohttp.ClientSession() as s:
            failed = False
            try:
                await post(s, router)
            except aiohttp.ClientPayloadError:
                failed = True
        await stop_all(us)
        assert failed and b.received == []

    run(scenario())


def test_stream_chunks_reach_the_client_before_the_unit_sends_the_next():
    async def scenario():
        (a,) = us = await units("a")
        a.gate = asyncio.Event()
        async with router_over(us) as router, aiohttp.ClientSession() as s:
            async with s.post(base_url(router) + "/v1/completions", json={"prompt": "hi", "stream": True}) as resp:
                first = await asyncio.wait_for(resp.content.readuntil(b"\n\n"), 5)
                a.gate.set()  # the unit sends the rest only after the client saw the first event
                rest = await resp.read()
        await stop_all(us)
        assert b"tok0" in first and b"tok1" in rest and rest.endswith(b"data: [DONE]\n\n")

    run(scenario())


def test_unit_silent_past_the_first_byte_timeout_gets_504():
    async def scenario():
        (a,) = us = await units("a")
        a.first_byte_delay_s = 0.8
        async with router_over(us, first_byte_timeout_s=0.2) as router, aiohttp.ClientSession() as s:
            status, _, body = await post(s, router)
        await stop_all(us)
        assert status == 504 and json.loads(body)["error"]["code"] == "unit_timeout"

    run(scenario())


def test_stream_silent_past_the_idle_timeout_ends_with_an_sse_error():
    async def scenario():
        (a,) = us = await units("a")
        a.gate = asyncio.Event()  # the stream stalls after its first event until the end
        async with router_over(us, idle_stream_timeout_s=0.3) as router, aiohttp.ClientSession() as s:
            async with s.post(base_url(router) + "/v1/completions", json={"prompt": "hi", "stream": True}) as resp:
                body = await resp.read()
            a.gate.set()
        await stop_all(us)
        events = [e for e in body.split(b"\n\n") if e]
        assert b"tok0" in events[0]
        assert json.loads(events[-1][len(b"data: ") :])["error"]["code"] == "idle_timeout"

    run(scenario())


def test_client_that_goes_away_releases_the_unit_stream():
    async def scenario():
        (a,) = us = await units("a")
        a.chunks, a.chunk_delay_s = 50, 0.05
        async with router_over(us) as router, aiohttp.ClientSession() as s:
            resp = await s.post(base_url(router) + "/v1/completions", json={"prompt": "x", "stream": True})
            await resp.content.readuntil(b"\n\n")
            resp.close()  # the client hangs up mid-stream
            await wait_for(lambda: a.disconnects == 1 and router.inflight == 0, timeout=5)
            assert router.fleet.members[a.url].outstanding == 0
        await stop_all(us)

    run(scenario())


def test_kv_cache_use_breaks_a_tie_in_reported_load():
    async def scenario():
        a, b = us = await units("a", "b")
        a.running, b.running = 2, 2
        a.kv_cache_used, b.kv_cache_used = 0.9, 0.1
        # The fewest-requests policy's tie-break (cache-aware routing ties by requests held, then chance).
        async with router_over(us, balance="least_requests") as router, aiohttp.ClientSession() as s:
            await wait_for(lambda: router.fleet.members[a.url].kv_cache_used == 0.9)
            for _ in range(4):
                await post(s, router)
        await stop_all(us)
        assert len(b.received) == 4 and a.received == []

    run(scenario())


def test_each_routed_request_leaves_one_json_log_line_and_sheds_leave_none(capsys):
    async def scenario():
        a, b = us = await units("a", "b")
        b.queue_depth = 3
        a.refuse = 503
        async with router_over(us, poll_interval_s=30.0) as router, aiohttp.ClientSession() as s:
            await post(s, router, headers={contract.REQUEST_ID_HEADER: "logged-1"})
            for u in router.fleet.members.values():
                u.mark_unready("test")
            status, _, _ = await post(s, router, headers={contract.REQUEST_ID_HEADER: "shed-1"})
        await stop_all(us)
        assert status == 503

    run(scenario())
    lines = access_lines(capsys.readouterr().err)
    assert [(r["request_id"], r["status"], r["unit"], r["attempts"]) for r in lines] == [("logged-1", 200, "b", 2)]
    assert lines[0]["event"] == "router_request" and lines[0]["duration_ms"] > 0


def test_each_access_log_line_carries_the_router_deployment_metrics_as_emf(capsys):
    """RouterAddedLatency and RouterFaults, extracted by CloudWatch Logs from the access log line (an
    EMF document: "_aws" with CloudWatchMetrics naming the namespace, dimensions and metrics,
    https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/CloudWatch_Embedded_Metric_Format_Specification.html):
    the router's blue/green deployment alarms read them (docs/observability.md)."""

    async def scenario():
        (a,) = us = await units("a")
        async with router_over(us) as router, aiohttp.ClientSession() as s:
            assert (await post(s, router, headers={contract.REQUEST_ID_HEADER: "fine"}))[0] == 200

            async def broken(*args, **kwargs):
                raise RuntimeError("a bug in this router revision")

            router.first_byte.attempt = broken
            assert (await post(s, router, headers={contract.REQUEST_ID_HEADER: "faulted"}))[0] == 500
        await stop_all(us)

    run(scenario())
    fine, faulted = access_lines(capsys.readouterr().err)
    for line in (fine, faulted):
        [directive] = line["_aws"]["CloudWatchMetrics"]
        assert directive["Namespace"] == contract.METRICS_NAMESPACE
        assert directive["Dimensions"] == [[contract.METRIC_DIM_SERVICE]]
    assert (fine["request_id"], fine["status"], fine[contract.METRIC_ROUTER_FAULTS]) == ("fine", 200, 0)
    assert 0 < fine[contract.METRIC_ROUTER_ADDED_LATENCY] < fine["duration_ms"]
    assert (faulted["request_id"], faulted["status"], faulted[contract.METRIC_ROUTER_FAULTS]) == ("faulted", 500, 1)
    assert contract.METRIC_ROUTER_ADDED_LATENCY not in faulted  # nothing reached the client


def test_two_requests_with_one_client_id_are_forwarded_with_it_and_logged_under_their_own_ids(capsys):
    async def scenario():
        (a,) = us = await units("a")
        a.chunks = 2
        async with router_over(us) as router, aiohttp.ClientSession() as s:
            same = {contract.REQUEST_ID_HEADER: "shared-by-two"}
            answers = await asyncio.gather(post(s, router, headers=same), post(s, router, headers=same))
        await stop_all(us)
        assert [(st, h[contract.REQUEST_ID_HEADER]) for st, h, _ in answers] == [(200, "shared-by-two")] * 2
        assert a.received == ["shared-by-two", "shared-by-two"]  # the correlation id travels on

    run(scenario())
    lines = access_lines(capsys.readouterr().err)
    assert [r["request_id"] for r in lines] == ["shared-by-two"] * 2
    assert len({r["id"] for r in lines}) == 2 and all(len(r["id"]) == 32 for r in lines)


class _UnitThatNoticesHangUps(StandInUnit):
    """A stand-in whose completions never answer, and which counts the requests the router gave up on
    (the node runtime cancels a request whose connection closes: handler_cancellation)."""

    hung_up = 0

    async def start(self, port: int = 0) -> "_UnitThatNoticesHangUps":
        from aiohttp import web

        async def never(request: web.Request) -> web.Response:
            self.received.append(request.headers.get(contract.REQUEST_ID_HEADER, ""))
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                self.hung_up += 1
                raise
            return web.json_response({})

        app = web.Application()
        app.router.add_get(contract.NODE_READY_PATH, self._ready)
        app.router.add_post("/v1/completions", never)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        return self


def test_a_client_that_hangs_up_before_a_plain_answer_releases_the_unit_request():
    async def scenario():
        unit = await _UnitThatNoticesHangUps(name="a").start()
        # The router's own give-up (first-byte timeout) is far off: only the hang-up can end it.
        async with router_over([unit], first_byte_timeout_s=60.0) as router, aiohttp.ClientSession() as s:
            call = asyncio.create_task(post(s, router))
            await wait_for(lambda: len(unit.received) == 1, what="the request to reach the unit")
            call.cancel()  # the client hangs up while the unit is still working
            await wait_for(lambda: unit.hung_up == 1 and router.inflight == 0, what="the unit to be released")
            assert router.fleet.members[unit.url].outstanding == 0
        await unit.stop()


def test_a_leader_whose_watch_falls_silent_stops_taking_requests():
    """A hung host sends no FIN: its stream simply goes quiet, and stale_after_s decides."""

    async def scenario():
        a, b = us = await units("a", "b")
        async with router_over(us, stale_after_s=0.5) as router, aiohttp.ClientSession() as s:
            a.hang = True
            # "silent" stays the reason while the hung host still accepts the watch's reconnects
            await wait_for(lambda: router.fleet.members[a.url].state == "silent", what="a to be found silent")
            before = len(a.received)
            for _ in range(6):
                await post(s, router)
            assert len(a.received) == before and len(b.received) >= 6
            a.hang = False  # it answers again: the next watch brings it back
            await wait_for(lambda: router.fleet.members[a.url].routable, what="a to come back")
        await stop_all(us)

    run(scenario())


def test_a_member_of_an_older_revision_without_the_watch_is_polled_and_routed_to():
    async def scenario():
        old = await StandInUnit(name="old", watch=False).start()
        async with router_over([old]) as router, aiohttp.ClientSession() as s:
            unit = router.fleet.members[old.url]
            await wait_for(lambda: unit.watchable is False, what="the watch to be found missing (404)")
            assert unit.routable
            polls = old.polls
            await wait_for(lambda: old.polls > polls + 2, what="more polls")
            status, _, _ = await post(s, router)
        await stop_all([old])
        assert status == 200 and len(old.received) == 1

    run(scenario())


def test_a_member_whose_leader_vouches_for_it_while_its_ask_waits_for_a_turn_is_not_asked():
    """A fleet starting asks hundreds of members at once, a few at a time (the router's ask limit): a
    follower its leader lists meanwhile needs no asking, and the ask neither goes out nor counts."""

    async def scenario():
        a, b = us = await units("a", "b")
        async with router_over(us) as router:
            fleet = router.fleet
            member, leader = fleet.members[b.url], fleet.members[a.url]
            before, counted = b.polls, dict(fleet.polls)
            # Every turn taken: the ask waits, as behind a fleet's first round of asks. All of them,
            # not only those free now: the router's own asks hold some, and give them back meanwhile.
            turns = _CONCURRENT_ASKS
            for _ in range(turns):
                await asyncio.wait_for(fleet._asks.acquire(), 5)
            ask = asyncio.create_task(fleet.poll_once(member))
            await asyncio.sleep(0.05)
            assert not ask.done()
            member.vouched_by = leader  # its leader's report listed it meanwhile
            for _ in range(turns):
                fleet._asks.release()
            await asyncio.wait_for(ask, 5)
            assert b.polls == before and dict(fleet.polls) == counted
            member.vouched_by = None  # the same ask, with nobody vouching, goes out and counts
            await fleet.poll_once(member)
            assert b.polls == before + 1 and sum(fleet.polls.values()) == sum(counted.values()) + 1
        await stop_all(us)

    run(scenario())
