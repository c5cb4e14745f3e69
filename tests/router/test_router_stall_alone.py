"""A stream whose unit goes quiet past the stall bound moves only when another unit could take it.
With none routable (the fleet's one serving unit, slowed while another unit starts beside it, as
every local unit shares the machine's cores), the router keeps waiting on the stream's own unit, up
to --idle-stream-timeout, instead of calling it hung and ending the stream with no_unit_to_resume:
the same rule as a unit that leaves routing (runtime/router/waits.py Departure). With another unit
routable, the stall still moves the stream there."""

from __future__ import annotations

import asyncio
import json

import aiohttp
from aiohttp import web
from router_standins import StandInUnit
from router_testkit import base_url, router_over, run, wait_for

import contract

TOKENS = 6
PAUSE_S = 1.5  # the silence after the third token: past the stall bound (0.3 s), within the idle timeout


class PausingStandIn(StandInUnit):
    """A leader that speaks the resume channel (a resume comment names each event's token id) and,
    for a first answer, pauses PAUSE_S after its third token; a continuation runs straight through.
    Token i of the answer reads "t{i} "."""

    def __init__(self, *, name: str) -> None:
        super().__init__(name=name)
        self.continuations: list[list[int]] = []

    async def _stream(self, request: web.Request) -> web.StreamResponse:
        resp, start = await self._open_resumable(request, self.continuations, "cmpl-pausing")
        if start == 0:
            await resp.write((contract.RESUME_COMMENT + '{"t":[]}\n\n').encode())
        for i in range(start, TOKENS):
            if i == 3 and start == 0:
                await asyncio.sleep(PAUSE_S)
            event = {"id": "x", "object": "text_completion", "choices": [{"index": 0, "text": f"t{i} "}]}
            comment = contract.RESUME_COMMENT + json.dumps({"t": [i]}) + "\n"
            await resp.write(comment.encode() + b"data: " + json.dumps(event).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


def _one_stream(*, with_other_unit: bool) -> tuple[bytes, PausingStandIn, PausingStandIn]:
    """One stream that starts on a; b is routable only when with_other_unit (else still forming, as a
    unit that is starting)."""

    async def scenario():
        a = await PausingStandIn(name="a").start()
        b = await PausingStandIn(name="b").start()
        b.state = "forming"  # the stream starts on a
        async with router_over(
            [a, b], stream_stall_s=0.3, stream_stall_max_s=0.3, idle_stream_timeout_s=10.0, max_moves=2
        ) as router:
            body = {"model": "tiny", "prompt": "hi", "max_tokens": TOKENS, "stream": True}
            async with aiohttp.ClientSession() as s:
                async with s.post(base_url(router) + "/v1/completions", json=body) as r:
                    if with_other_unit:  # b turns ready once the stream runs on a, before a's pause ends
                        b.state = "ready"
                        await wait_for(lambda: router.fleet.routable_count() == 2, what="b to be routable")
                    raw = await asyncio.wait_for(r.read(), 20)
        await a.stop()
        await b.stop()
        return raw, a, b

    return run(scenario())


def _text(raw: bytes) -> tuple[str, list[bytes]]:
    events = [e for e in raw.split(b"\n\n") if e.startswith(b"data: ")]
    docs = [json.loads(e[6:]) for e in events if e != b"data: [DONE]"]
    return "".join(d["choices"][0]["text"] for d in docs if "choices" in d), events


def test_a_stream_whose_only_routable_unit_pauses_past_the_stall_bound_waits_for_it_and_ends_whole():
    raw, a, b = _one_stream(with_other_unit=False)
    text, events = _text(raw)
    assert events[-1] == b"data: [DONE]", raw  # not no_unit_to_resume: nowhere to go, so it waited
    assert text == "".join(f"t{i} " for i in range(TOKENS)), raw
    assert b"error" not in raw and b"flotilla" not in raw
    assert b.continuations == []


def test_a_stream_whose_unit_pauses_past_the_stall_bound_moves_when_another_unit_is_routable():
    raw, a, b = _one_stream(with_other_unit=True)
    text, events = _text(raw)
    assert events[-1] == b"data: [DONE]", raw
    assert text == "".join(f"t{i} " for i in range(TOKENS)), raw  # nothing lost, nothing twice
    assert b.continuations == [[0, 1, 2]]  # it moved at the stall, with the three tokens sent
