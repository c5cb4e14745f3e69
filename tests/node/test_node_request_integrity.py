"""Request integrity on a real leader: a client's X-Request-Id never keys anything, a request the
unit cannot finish ends with an error (never a short answer that looks complete), a body of any
shape is the client's error, a client that leaves gives its batch slot back, and a request that waits
past the queue timeout or runs past the request timeout ends with an error and frees its slot."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from nodeproc import Unit, wait_for

import contract


def sse_payloads(body: bytes) -> list[str]:
    return [e[len(b"data: ") :].decode() for e in body.split(b"\n\n") if e.startswith(b"data: ")]


async def _complete(session: aiohttp.ClientSession, url: str, body: dict, headers: dict | None = None):
    async with session.post(url + "/completions", json=body, headers=headers or {}) as r:
        return r.status, r.headers.copy(), await r.read()


def test_two_requests_with_one_client_request_id_each_get_only_their_own_tokens(new_unit):
    # echo generates the prompt's own bytes, so a token of the other request would show at once
    unit = new_unit(engine="echo", world_size=1).start().wait_ready()
    shared = {contract.REQUEST_ID_HEADER: "same-id-from-two-clients"}

    async def both():
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
            return await asyncio.gather(
                *(
                    _complete(
                        s, unit.url, {"model": "tiny", "prompt": ch * 8, "max_tokens": 60, "stream": stream}, shared
                    )
                    for ch, stream in (("a", True), ("b", True), ("c", False), ("d", False))
                )
            )

    results = asyncio.run(both())
    ids = set()
    for (status, headers, raw), ch, stream in zip(results, "abcd", (True, True, False, False)):
        assert status == 200 and headers[contract.REQUEST_ID_HEADER] == "same-id-from-two-clients"
        if stream:
            events = sse_payloads(raw)
            assert events[-1] == "[DONE]"
            chunks = [json.loads(e) for e in events[:-1]]
            text = "".join(c["choices"][0]["text"] for c in chunks)
            reasons = [c["choices"][0]["finish_reason"] for c in chunks]
            assert reasons[-1] == "length" and set(reasons[:-1]) == {None}
            ids |= {c["id"] for c in chunks}
        else:
            body = json.loads(raw)
            text, reason = body["choices"][0]["text"], body["choices"][0]["finish_reason"]
            assert reason == "length"
            ids.add(body["id"])
        assert text == ch * 60, f"request {ch} got {text!r}"
    assert len(ids) == 4  # each completion has its own id, whatever the client called it


def _drain_cut(new_unit, *, stream: bool):
    """A leader SIGTERMed with a 1 s drain while a 1,500-token request runs: what the client gets."""
    unit = new_unit(engine="echo", world_size=1, FLOTILLA_DRAIN_TIMEOUT_S="1").start().wait_ready()
    body = {"model": "tiny", "prompt": "abc", "max_tokens": 1500, "stream": stream}

    async def scenario():
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
            task = asyncio.create_task(_complete(s, unit.url, body))
            await asyncio.to_thread(
                wait_for,
                lambda: unit.leader.ready()[1]["load"]["running"] == 1,
                timeout=20,
                what="the long request to be running",
            )
            unit.leader.sigterm()
            return await task

    out = asyncio.run(scenario())
    assert unit.leader.wait(timeout=30) == 0
    return out


def test_a_drain_that_times_out_ends_a_stream_with_an_error_event_and_no_done(new_unit):
    status, _, raw = _drain_cut(new_unit, stream=True)
    assert status == 200  # the status line went out with the first token
    events = sse_payloads(raw)
    assert "[DONE]" not in events, events[-3:]
    last = json.loads(events[-1])
    assert last["error"]["type"] == "service_unavailable" and "drain" in last["error"]["message"], last
    chunks = [json.loads(e) for e in events[:-1]]
    assert 0 < len(chunks) < 1500 and {c["choices"][0]["finish_reason"] for c in chunks} == {None}


def test_a_drain_that_times_out_answers_a_non_streamed_request_503_with_retry_after(new_unit):
    status, headers, raw = _drain_cut(new_unit, stream=False)
    body = json.loads(raw)
    assert status == 503 and headers.get("Retry-After"), body
    assert body["error"]["type"] == "service_unavailable" and "drain" in body["error"]["message"]


def _post_raw(url: str, data: bytes, content_type: str = "application/json") -> tuple[int, dict]:
    async def go():
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s:
            async with s.post(url + "/chat/completions", data=data, headers={"Content-Type": content_type}) as r:
                return r.status, await r.json(content_type=None)

    return asyncio.run(go())


def test_a_body_nested_five_thousand_arrays_deep_gets_a_400_naming_the_limit(shared_unit):
    status, err = _post_raw(shared_unit.url, b"[" * 5000 + b"]" * 5000)
    assert status == 400 and err["error"]["type"] == "invalid_request_error", err
    assert "nested" in err["error"]["message"]
    deep_field = b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "x": ' + b"[" * 200
    status, err = _post_raw(shared_unit.url, deep_field + b"]" * 200 + b"}")
    assert status == 400 and "nested" in err["error"]["message"], err


def test_a_body_in_an_unknown_charset_is_read_as_utf8_json_not_a_500(shared_unit):
    body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).encode()
    status, out = _post_raw(shared_unit.url, body, "application/json; charset=no-such-charset")
    assert status == 200, out


def test_a_client_that_disconnects_gives_its_batch_slot_to_a_queued_request(new_unit):
    unit = new_unit(FLOTILLA_MAX_RUNNING="1").start().wait_ready()
    long = {"model": "tiny", "prompt": "walk away", "max_tokens": 1500, "stream": True, "ignore_eos": True}
    short = {"model": "tiny", "prompt": "next", "max_tokens": 4, "ignore_eos": True}

    async def scenario():
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as s:
            r = await s.post(unit.url + "/completions", json=long, headers={contract.REQUEST_ID_HEADER: "leaves"})
            for _ in range(3):
                await r.content.readuntil(b"\n\n")
            queued = asyncio.create_task(_complete(s, unit.url, short, {contract.REQUEST_ID_HEADER: "waits"}))
            await asyncio.to_thread(
                wait_for,
                lambda: unit.leader.ready()[1]["load"]["queue_depth"] == 1,
                timeout=20,
                what="the short request to wait for the only slot",
            )
            r.close()  # the client goes away
            return await queued

    status, _, raw = asyncio.run(scenario())
    assert status == 200 and json.loads(raw)["usage"]["completion_tokens"] == 4
    ends = {
        e["request_id"]: e
        for e in wait_for(
            lambda: (
                len(unit.leader.log_events("engine_request_end")) >= 2 and unit.leader.log_events("engine_request_end")
            ),
            timeout=20,
            what="the engine's account of both requests",
        )
    }
    assert ends["leaves"]["ending"] == "cancelled" and ends["leaves"]["generated"] < 1500
    assert (ends["waits"]["ending"], ends["waits"]["generated"]) == ("length", 4)


def _load(unit: Unit) -> dict:
    return unit.leader.ready()[1]["load"]


async def _until(unit: Unit, what: str, predicate) -> None:
    await asyncio.to_thread(wait_for, lambda: predicate(_load(unit)), timeout=30, what=what)


def _engine_end(unit: Unit, request_id: str) -> dict:
    """The engine's own account of one request (its engine_request_end log line)."""
    return wait_for(
        lambda: next((e for e in unit.leader.log_events("engine_request_end") if e["request_id"] == request_id), None),
        timeout=20,
        what=f"the engine's account of {request_id}",
    )


def _served(status: int, raw: bytes) -> bool:
    return status == 200 and json.loads(raw)["choices"][0]["finish_reason"] == "length"


@pytest.mark.timeout(180)
def test_a_request_that_gets_no_batch_slot_within_the_queue_timeout_ends_429_and_leaves_no_trace(new_unit):
    # --shed queue-timeout: the unit admits every request and refuses only when the wait ran out.
    unit = new_unit(engine="echo", world_size=1, FLOTILLA_QUEUE_TIMEOUT_S="1", FLOTILLA_SHED="queue-timeout")
    unit = unit.start().wait_ready()
    slots = _load(unit)["max_running"]
    hold = {"model": "tiny", "prompt": "hold", "max_tokens": 2000, "stream": True}  # 20 s of echo steps
    short = {"model": "tiny", "prompt": "next", "max_tokens": 4}

    async def scenario():
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=90)) as s:
            holders = [await s.post(unit.url + "/completions", json=hold) for _ in range(slots)]
            await _until(unit, "every batch slot to be taken", lambda ld: ld["running"] == slots)
            plain = await _complete(s, unit.url, short, {contract.REQUEST_ID_HEADER: "queued-plain"})
            streamed = await _complete(
                s, unit.url, {**short, "stream": True}, {contract.REQUEST_ID_HEADER: "queued-streamed"}
            )
            # Gone from the engine's queue while the slots are still held: nothing waits for a slot.
            await _until(unit, "the engine queue to empty", lambda ld: ld["queue_depth"] == 0)
            still_running = _load(unit)["running"]
            for r in holders:
                r.close()
            await _until(unit, "the holders to leave", lambda ld: ld["running"] == 0)
            after = await _complete(s, unit.url, short)
            return plain, streamed, still_running, after

    (status, headers, raw), (s_status, _, s_raw), still_running, (a_status, _, a_raw) = asyncio.run(scenario())
    err = json.loads(raw)["error"]
    assert status == 429 and int(headers["Retry-After"]) >= 1, err  # busy, not broken
    assert (err["type"], err["code"]) == ("rate_limit_error", "queue_timeout") and "queue" in err["message"]
    assert s_status == 200  # the status line went out before the wait
    events = sse_payloads(s_raw)
    assert "[DONE]" not in events and json.loads(events[-1])["error"]["code"] == "queue_timeout", events
    assert still_running == slots
    for rid in ("queued-plain", "queued-streamed"):
        assert (_engine_end(unit, rid)["ending"], _engine_end(unit, rid)["generated"]) == ("cancelled", 0)
    assert _served(a_status, a_raw), a_raw


def test_a_resumable_stream_that_gets_no_batch_slot_within_the_queue_timeout_is_handed_back_to_the_router(new_unit):
    """Busy, not failed: the router may wait for a slot (here or on another unit) and continue the
    stream, so the queue_timeout ending of a stream the router asked to be resumable opens with a
    move comment, as a broken unit's does (the router drops the event; runtime/router/resume.py)."""
    unit = new_unit(engine="echo", world_size=1, FLOTILLA_QUEUE_TIMEOUT_S="1", FLOTILLA_SHED="queue-timeout")
    unit = unit.start().wait_ready()
    slots = _load(unit)["max_running"]
    hold = {"model": "tiny", "prompt": "hold", "max_tokens": 2000, "stream": True}  # 20 s of echo steps
    short = {"model": "tiny", "prompt": "next", "max_tokens": 4, "stream": True}

    async def scenario():
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=90)) as s:
            holders = [await s.post(unit.url + "/completions", json=hold) for _ in range(slots)]
            await _until(unit, "every batch slot to be taken", lambda ld: ld["running"] == slots)
            resumable = await _complete(s, unit.url, short, {contract.RESUME_HEADER: "1"})
            for r in holders:
                r.close()
            return resumable

    status, _, raw = asyncio.run(scenario())
    assert status == 200  # the status line went out before the wait
    move = (contract.MOVE_COMMENT + contract.BUSY_CODE_QUEUE_TIMEOUT + "\n").encode()
    assert move in raw, raw
    last = raw.rstrip(b"\n").rsplit(b"\n\n", 1)[-1]
    assert last.startswith(move) and json.loads(last.split(b"data: ", 1)[1])["error"]["code"] == "queue_timeout", raw
    assert b"[DONE]" not in raw


@pytest.mark.timeout(180)
def test_a_full_unit_refuses_at_once_with_429_and_the_expected_wait_when_it_would_wait_past_the_queue_timeout(
    new_unit,
):
    unit = new_unit(engine="echo", world_size=1, FLOTILLA_QUEUE_TIMEOUT_S="1").start().wait_ready()
    slots = _load(unit)["max_running"]
    hold = {"model": "tiny", "prompt": "hold", "max_tokens": 2000, "stream": True}  # 20 s of echo steps
    short = {"model": "tiny", "prompt": "next", "max_tokens": 4}

    async def scenario():
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=90)) as s:
            holders = [await s.post(unit.url + "/completions", json=hold) for _ in range(slots)]
            for r in holders:  # two tokens each: the unit has measured its pace
                for _ in range(2):
                    await r.content.readline()
                    await r.content.readline()
            await _until(unit, "a reported wait past the queue timeout", lambda ld: ld["wait_s"] > 1)
            plain = await _complete(s, unit.url, short, {contract.REQUEST_ID_HEADER: "shed-plain"})
            streamed = await _complete(s, unit.url, {**short, "stream": True}, {contract.REQUEST_ID_HEADER: "shed-s"})
            queued = _load(unit)["queue_depth"]
            async with s.get(unit.leader.url + contract.METRICS_PATH) as r:
                metrics = await r.text()
            for r in holders:
                r.close()
            await _until(unit, "the holders to leave", lambda ld: ld["running"] == 0)
            after = await _complete(s, unit.url, short)
            return plain, streamed, queued, metrics, after

    plain, streamed, queued, metrics, (a_status, _, a_raw) = asyncio.run(scenario())
    for status, headers, raw in (plain, streamed):  # the streamed one too: refused before its status line
        err = json.loads(raw)["error"]
        assert status == 429 and (err["type"], err["code"]) == ("rate_limit_error", contract.BUSY_CODE_SHED), raw
        # Retry-After is the expected wait: the holders have most of 2,000 steps left, so well past 1 s.
        assert int(headers["Retry-After"]) > 1 and "at capacity" in err["message"]
    assert queued == 0  # refused before the engine's queue: nothing waits
    shed = [e for e in unit.leader.log_events("request") if e.get("error_kind") == "shed"]
    assert sorted(e["request_id"] for e in shed) == ["shed-plain", "shed-s"]
    assert 'flotilla_request_errors_total{endpoint="/v1/completions",kind="shed"} 2.0' in metrics
    wait = next(line for line in metrics.splitlines() if line.startswith("flotilla_expected_wait_seconds "))
    assert float(wait.split()[1]) > 1  # what an operator sees: the wait past the queue timeout
    assert _served(a_status, a_raw), a_raw


@pytest.mark.timeout(180)
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_requests_past_the_request_timeout_end_with_an_error_and_give_their_slots_back(new_unit, stream):
    unit = (
        new_unit(engine="echo", world_size=1, FLOTILLA_QUEUE_TIMEOUT_S="3", FLOTILLA_REQUEST_TIMEOUT_S="3")
        .start()
        .wait_ready()
    )
    slots = _load(unit)["max_running"]
    long = {"model": "tiny", "prompt": "long", "max_tokens": 1500, "stream": stream}  # 15 s of echo steps
    short = {"model": "tiny", "prompt": "next", "max_tokens": 4}

    async def scenario():
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=90)) as s:
            cut = await asyncio.gather(
                *(_complete(s, unit.url, long, {contract.REQUEST_ID_HEADER: f"long-{i}"}) for i in range(slots))
            )
            await _until(unit, "the engine to drop the stopped requests", lambda ld: ld["running"] == 0)
            # Every slot was taken by a stopped request: only freed slots can serve these at once.
            after = await asyncio.gather(*(_complete(s, unit.url, short) for _ in range(slots)))
            return cut, after

    cut, after = asyncio.run(scenario())
    for status, headers, raw in cut:
        if stream:
            assert status == 200
            events = sse_payloads(raw)
            assert "[DONE]" not in events, events[-3:]
            err = json.loads(events[-1])["error"]
            chunks = [json.loads(e) for e in events[:-1]]
            assert chunks and {c["choices"][0]["finish_reason"] for c in chunks} == {None}
        else:
            assert status == 504, raw
            err = json.loads(raw)["error"]
        assert err["code"] == "deadline_exceeded" and "request timeout" in err["message"], err
    for i in range(slots):
        end = _engine_end(unit, f"long-{i}")
        assert end["ending"] == "cancelled" and 0 < end["generated"] < 1500, end
    assert all(_served(status, raw) for status, _, raw in after), after
