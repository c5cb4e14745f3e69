"""A stream moving off a failed unit to a unit that turns out to be full: the unit reported a free
batch slot, took the continuation, then found no slot within its queue timeout (its load report and
the move raced) and handed the stream back with a queue_timeout move comment. Busy is not broken:
the router gives the move back and continues the stream there once a slot frees, within the wait
that began when the stream first had to move, instead of ending it with no_unit_to_resume."""

from __future__ import annotations

import asyncio
import json

import aiohttp
from aiohttp import web
from router_standins import StandInUnit
from router_testkit import base_url, router_over, run, wait_for

import contract


class ResumableStandIn(StandInUnit):
    """A leader that speaks the resume channel (runtime/node/server.py: a resume comment names each
    event's token id; a movable error event opens with a move comment). Each streamed request takes
    the next step of `script`: ("cut", n) sends n tokens and drops the connection (a killed unit),
    ("busy",) hands the stream back with a queue_timeout move comment before any token (what the
    node sends when no batch slot came free within its queue timeout), ("finish", n) sends n tokens
    and ends. Token i of the answer reads "t{i} ", counted from the continuation's tokens."""

    def __init__(self, *, name: str, script: list[tuple]) -> None:
        super().__init__(name=name)
        self.script = list(script)
        self.continuations: list[list[int]] = []  # each continuation's token ids, in arrival order

    async def _stream(self, request: web.Request) -> web.StreamResponse:
        resp, start = await self._open_resumable(request, self.continuations, "cmpl-moving")
        step = self.script.pop(0)
        if step[0] == "busy":
            error = {"error": {"message": "no batch slot", "type": "rate_limit_error", "code": "queue_timeout"}}
            move = contract.MOVE_COMMENT + contract.BUSY_CODE_QUEUE_TIMEOUT + "\n"
            await resp.write(move.encode() + b"data: " + json.dumps(error).encode() + b"\n\n")
            await resp.write_eof()
            return resp
        if start == 0:  # a first answer says at once that it may move (the node's opening comment)
            await resp.write((contract.RESUME_COMMENT + '{"t":[]}\n\n').encode())
        for i in range(start, start + step[1]):
            event = {"id": "x", "object": "text_completion", "choices": [{"index": 0, "text": f"t{i} "}]}
            comment = contract.RESUME_COMMENT + json.dumps({"t": [i]}) + "\n"
            await resp.write(comment.encode() + b"data: " + json.dumps(event).encode() + b"\n\n")
            await asyncio.sleep(0.01)
        if step[0] == "cut":
            request.transport.abort()
            return resp
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


def _moving_stream(b_script: list[tuple], first_byte_timeout_s: float) -> tuple[bytes, ResumableStandIn, list[float]]:
    """One stream through the router: it starts on a, whose connection breaks after five tokens, and
    moves to b, which follows b_script. The client's raw body, b, and the router's move counters
    (after a's break, after b's hand-backs)."""

    async def scenario():
        a = await ResumableStandIn(name="a", script=[("cut", 5)]).start()
        b = await ResumableStandIn(name="b", script=b_script).start()
        b.state = "forming"  # the stream starts on a
        async with router_over([a, b], first_byte_timeout_s=first_byte_timeout_s, max_moves=1) as router:
            b.state = "ready"
            await wait_for(lambda: router.fleet.routable_count() == 2, what="b to be routable")
            body = {"model": "tiny", "prompt": "hi", "max_tokens": 10, "stream": True}
            async with aiohttp.ClientSession() as s:
                async with s.post(base_url(router) + "/v1/completions", json=body) as r:
                    raw = await asyncio.wait_for(r.read(), 20)
            retries = router.metrics.retries
            moves = [retries.labels(f"move_{r}")._value.get() for r in ("stream_broken", "handover_queue_timeout")]
        await a.stop()
        await b.stop()
        return raw, b, moves

    return run(scenario())


def test_a_continuation_a_full_unit_hands_back_for_want_of_a_slot_continues_there_once_one_frees():
    raw, b, moves = _moving_stream([("busy",), ("busy",), ("finish", 5)], first_byte_timeout_s=30.0)
    events = [e for e in raw.split(b"\n\n") if e.startswith(b"data: ")]
    assert events[-1] == b"data: [DONE]", raw
    text = "".join(json.loads(e[6:])["choices"][0]["text"] for e in events[:-1])
    assert text == "".join(f"t{i} " for i in range(10)), raw  # nothing lost, nothing twice
    assert b"flotilla" not in raw and b"error" not in raw
    # b was asked three times with the same five tokens: two refusals for want of a slot gave the one
    # move of the budget back each time, so the third could still continue the stream there.
    assert b.continuations == [list(range(5))] * 3
    assert moves == [1, 2]


def test_a_continuation_handed_back_for_want_of_a_slot_past_the_first_byte_timeout_ends_with_no_unit_to_resume():
    """A unit that reports free slots but never gives one: the stream waits no longer than
    --first-byte-timeout from when it first had to move, then ends with an explicit error."""
    raw, b, _ = _moving_stream([("busy",)] * 1000, first_byte_timeout_s=1.5)
    events = [e for e in raw.split(b"\n\n") if e.startswith(b"data: ")]
    text = "".join(json.loads(e[6:])["choices"][0]["text"] for e in events[:-1])
    assert text == "".join(f"t{i} " for i in range(5)), raw  # the true prefix, then the error
    assert json.loads(events[-1][6:])["error"]["code"] == "no_unit_to_resume", raw
    assert b"[DONE]" not in raw
    assert 1 <= len(b.continuations) <= 1.5 / 0.25 + 1  # asked once a report period at most, within the bound
