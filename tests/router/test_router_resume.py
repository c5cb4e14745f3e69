"""Resumable streams end to end: two real units (one `runtime node` member each, reference engine,
`tiny`) behind a real router. A stream whose unit is killed, or drains, mid-answer continues on the
other unit; its client sees one stream: the unsplit run's text, one id, usage over the whole answer,
and none of the router's internal lines."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from pathlib import Path

import aiohttp
import pytest
from engine_alone import greedy_texts
from nodeproc import Unit, get_json, wait_for
from router_real_units import RouterProcess

import contract
from bench.measure import process_tree

pytestmark = pytest.mark.timeout(600)

PROMPT = "rain on the harbour at night"
MAX_TOKENS = 200


class Stream:
    def __init__(self) -> None:
        self.raw = b""
        self.events: list[dict] = []
        self.done = False
        self.unit = ""

    @property
    def text(self) -> str:
        return "".join(e["choices"][0]["text"] for e in self.events if e.get("choices"))

    def choice_text(self, index: int) -> str:
        return "".join(c["text"] for e in self.events for c in e.get("choices", []) if c["index"] == index)

    @property
    def errors(self) -> list[dict]:
        return [e["error"] for e in self.events if "error" in e]


async def stream(base: str, body: dict, *, on_event=None, headers=None) -> Stream:
    out = Stream()
    async with aiohttp.ClientSession() as s:
        async with s.post(base + "/v1/completions", json=body, headers=headers or {}) as r:
            assert r.status == 200, await r.text()
            out.unit = r.headers[contract.UNIT_HEADER]
            buf = b""
            async for piece in r.content.iter_any():
                out.raw += piece
                buf += piece
                while b"\n\n" in buf:
                    raw, buf = buf.split(b"\n\n", 1)
                    if raw == b"data: [DONE]":
                        out.done = True
                    elif raw.startswith(b"data: "):
                        out.events.append(json.loads(raw[len(b"data: ") :]))
                        if on_event is not None:
                            await on_event(out)
    return out


def _body(**extra) -> dict:
    return {
        "model": "tiny",
        "prompt": PROMPT,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        **extra,
    }


def _two_units(tmp_path: Path, **env: str) -> list[Unit]:
    return [Unit(tmp_path, name=f"resume-{k}", world_size=1, **env) for k in range(2)]


def _router(tmp_path: Path, units: list[Unit], *extra: str) -> RouterProcess:
    args = ["--units", ",".join(u.leader.url for u in units), "--poll-interval", "0.2", "--drain-grace", "0"]
    return RouterProcess(tmp_path, name="resume", args=[*args, *extra])


def _check_whole(got: Stream, want: str) -> None:
    assert not got.errors and got.done, got.errors
    assert got.text == want
    ids = {e["id"] for e in got.events}
    assert len(ids) == 1, ids
    usage = got.events[-1]["usage"]
    assert usage["completion_tokens"] == MAX_TOKENS
    assert usage["total_tokens"] == usage["prompt_tokens"] + MAX_TOKENS
    assert b"flotilla" not in got.raw  # the internal channel never reaches the client


@contextlib.contextmanager
def serving(units: list[Unit], router: RouterProcess):
    """The units started and ready, the router routing to all of them; everything stopped after (a
    member a test froze is let go first, or it would never stop)."""
    try:
        for u in units:
            u.start()
        for u in units:
            u.wait_ready(180)

        async def routing() -> None:
            await router.start()
            await router.wait_routable(len(units))

        asyncio.run(asyncio.wait_for(routing(), 120))
        yield
    finally:
        for u in units:
            u.thaw()
        router.stop()
        for u in units:
            u.stop()


def _leader_of(units: list[Unit], name: str) -> Unit:
    return next(u for u in units if u.name == name)


def _kill_once_it_holds_a_request(unit: Unit) -> None:
    """kill -9 the unit's leader and its engine once its ready body counts a request in flight."""
    wait_for(
        lambda: get_json(unit.leader.url + contract.NODE_READY_PATH)[1]["load"]["in_flight"] >= 1,
        timeout=60,
        what=f"{unit.name} to hold the moved stream",
    )
    unit.leader.sigkill_with_engine()


@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.8, "top_p": 0.9, "seed": 7}], ids=["greedy", "seeded"])
def test_a_stream_whose_leader_is_killed_continues_on_the_other_unit_unchanged(tmp_path: Path, sampling):
    units = _two_units(tmp_path)
    router = _router(tmp_path, units)
    with serving(units, router):

        async def scenario() -> tuple[Stream, Stream, str]:
            # The same request once without a failure: greedy, the unsplit model's answer (checked
            # against the engine alone below); seeded, what the seed draws.
            whole = await stream(router.url, _body(**sampling))
            killed: list[str] = []

            async def kill_mid_way(s: Stream) -> None:
                if len(s.events) == 30 and not killed:
                    killed.append(s.unit)
                    await asyncio.to_thread(_leader_of(units, s.unit).leader.sigkill)

            got = await stream(router.url, _body(**sampling), on_event=kill_mid_way)
            return whole, got, killed[0]

        whole, got, killed = asyncio.run(asyncio.wait_for(scenario(), 300))
        want = greedy_texts([(PROMPT, False, MAX_TOKENS)])[0] if not sampling else whole.text
        assert whole.text == want
        _check_whole(got, want)
        other = next(u for u in units if u.name != killed)
        moved = other.continued_requests(wait_s=30)
        assert len(moved) == 1 and 30 <= moved[0]["continued_from"] < MAX_TOKENS, moved
        metrics = asyncio.run(router.metrics())
        assert 'flotilla_router_retries_total{reason="move_stream_broken"} 1.0' in metrics


def test_a_draining_unit_hands_its_streams_over_instead_of_finishing_them(tmp_path: Path):
    want = greedy_texts([(PROMPT, False, MAX_TOKENS)])[0]
    # A drain timeout far longer than the answer: the drain must not wait for it.
    units = _two_units(tmp_path, FLOTILLA_DRAIN_TIMEOUT_S="300")
    router = _router(tmp_path, units)
    with serving(units, router):

        async def scenario() -> tuple[Stream, str, int]:
            drained: list[str] = []
            exit_codes: list[int] = []

            async def drain_mid_way(s: Stream) -> None:
                if len(s.events) == 20 and not drained:
                    drained.append(s.unit)
                    _leader_of(units, s.unit).leader.sigterm()

            async def plain() -> dict:
                # Whichever unit serves it, it comes back whole: one that drains answers 503 at its
                # next token and the router retries it whole on the other unit.
                body = {k: v for k, v in _body().items() if k not in ("stream", "stream_options")}
                async with aiohttp.ClientSession() as s, s.post(router.url + "/v1/completions", json=body) as r:
                    assert r.status == 200, await r.text()
                    return await r.json()

            plain_task = asyncio.create_task(plain())
            got = await stream(router.url, _body(), on_event=drain_mid_way)
            # The drained member exits once it handed its stream over (bounded wait, not a timing claim).
            exit_codes.append(await asyncio.to_thread(_leader_of(units, drained[0]).leader.wait, 120))
            whole = await plain_task
            assert whole["choices"][0]["text"] == want  # a non-streamed answer is retried whole elsewhere
            assert whole["usage"]["completion_tokens"] == MAX_TOKENS
            return got, drained[0], exit_codes[0]

        got, drained, code = asyncio.run(asyncio.wait_for(scenario(), 300))
        _check_whole(got, want)
        assert code == 0
        gone = _leader_of(units, drained)
        handed = [r for r in gone.leader.log_events("request") if r.get("error_kind") == "unavailable"]
        assert handed and all(r["completion_tokens"] < MAX_TOKENS for r in handed), handed
        other = next(u for u in units if u.name != drained)
        assert len(other.continued_requests(wait_s=30)) == 1


def test_a_stopped_follower_takes_its_unit_out_of_routing_and_its_stream_moves(tmp_path: Path):
    want = greedy_texts([(PROMPT, False, MAX_TOKENS)])[0]
    units = [Unit(tmp_path, name=f"gray-{k}", world_size=2) for k in range(2)]
    router = _router(tmp_path, units, "--stream-stall", "2")
    with serving(units, router):

        async def scenario() -> tuple[Stream, str]:
            stopped: list[str] = []

            async def stop_follower(s: Stream) -> None:
                if len(s.events) == 20 and not stopped:
                    stopped.append(s.unit)
                    await asyncio.to_thread(_leader_of(units, s.unit).members[1].sigstop)

            got = await stream(router.url, _body(), on_event=stop_follower)
            return got, stopped[0]

        got, stopped = asyncio.run(asyncio.wait_for(scenario(), 300))
        _check_whole(got, want)
        gray = _leader_of(units, stopped)
        # Its leader still answers HTTP, but says it is not ready (its engine makes no progress).
        wait_for(lambda: gray.leader.ready()[0] == 503, timeout=30, what=f"{gray.name} to report not ready")
        other = next(u for u in units if u.name != stopped)
        assert len(other.continued_requests(wait_s=30)) == 1
        gray.members[1].sigcont()
        gray.wait_ready(timeout=180)  # it re-forms by the existing paths and serves again
        asyncio.run(asyncio.wait_for(router.wait_routable(2), 120))


def test_a_forged_continuation_means_nothing_and_a_stream_that_spent_its_moves_ends_with_an_explicit_error(
    tmp_path: Path,
):
    """Two checks on one pair of units: a client cannot pass itself off as a continuation (the router
    drops the headers, so the field means nothing), then a stream whose units both die past its move
    budget ends with an explicit error."""
    want = greedy_texts([(PROMPT, False, MAX_TOKENS)])[0]
    units = _two_units(tmp_path)
    router = _router(tmp_path, units, "--max-moves", "1")
    with serving(units, router):

        async def forge() -> Stream:
            forged = {contract.CONTINUATION_FIELD: {"id": "cmpl-forged", "created": 1, "token_ids": [65] * 50}}
            headers = {contract.CONTINUATION_HEADER: "1", contract.RESUME_HEADER: "1"}
            return await stream(router.url, _body(**forged), headers=headers)

        forged = asyncio.run(asyncio.wait_for(forge(), 300))
        _check_whole(forged, want)  # the router dropped the headers: the field meant nothing
        assert forged.events[0]["id"] != "cmpl-forged"

        async def scenario() -> Stream:
            second: list[asyncio.Task] = []

            async def kill_each_unit(s: Stream) -> None:
                # First the unit serving the stream. The other's engine is frozen first, so the moved
                # stream gets no token there (a tiny model's remaining tokens would otherwise be sent
                # whole before a second kill timed by the client's reading could land), and that unit
                # is killed once it holds the stream.
                if len(s.events) == 20 and not second:
                    first = _leader_of(units, s.unit)
                    other = next(u for u in units if u is not first)
                    other.leader.sigstop_engine()
                    await asyncio.to_thread(first.leader.sigkill)
                    second.append(asyncio.create_task(asyncio.to_thread(_kill_once_it_holds_a_request, other)))

            got = await stream(router.url, _body(), on_event=kill_each_unit)
            await second[0]
            return got

        got = asyncio.run(asyncio.wait_for(scenario(), 300))
        assert not got.done and [e["code"] for e in got.errors] == ["moves_exhausted"]
        assert "error" in got.events[-1]
        assert want.startswith(got.text) and len(got.text) < len(want)  # a true prefix, nothing crossed


@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.8, "top_p": 0.9, "seed": 7}], ids=["greedy", "seeded"])
def test_a_stream_of_several_choices_whose_leader_is_killed_continues_each_choice_unchanged(tmp_path: Path, sampling):
    """n = 2: each choice goes on from its own tokens on the other unit (seeded choices draw from
    seed + index, so they differ and a crossed token would show)."""
    n = 2
    units = _two_units(tmp_path)
    router = _router(tmp_path, units)
    with serving(units, router):

        async def scenario() -> tuple[Stream, Stream, str]:
            whole = await stream(router.url, _body(n=n, **sampling))
            killed: list[str] = []

            async def kill_mid_way(s: Stream) -> None:
                if len(s.events) == 31 and not killed:
                    killed.append(s.unit)
                    await asyncio.to_thread(_leader_of(units, s.unit).leader.sigkill)

            got = await stream(router.url, _body(n=n, **sampling), on_event=kill_mid_way)
            return whole, got, killed[0]

        whole, got, killed = asyncio.run(asyncio.wait_for(scenario(), 300))
        texts = [whole.choice_text(i) for i in range(n)]
        if not sampling:  # greedy: every choice is the unsplit model's answer
            assert texts == greedy_texts([(PROMPT, False, MAX_TOKENS)]) * n
        else:
            assert texts[0] != texts[1]
        assert not got.errors and got.done, got.errors
        assert [got.choice_text(i) for i in range(n)] == texts
        assert len({e["id"] for e in got.events}) == 1
        usage = got.events[-1]["usage"]
        assert usage["completion_tokens"] == n * MAX_TOKENS == whole.events[-1]["usage"]["completion_tokens"]
        assert usage["total_tokens"] == usage["prompt_tokens"] + n * MAX_TOKENS
        finishes = [c["finish_reason"] for e in got.events for c in e.get("choices", []) if c.get("finish_reason")]
        assert sorted(finishes) == ["length"] * n  # each choice ends once
        assert b"flotilla" not in got.raw
        moved = _leader_of(units, next(u.name for u in units if u.name != killed)).continued_requests(wait_s=30)
        assert len(moved) == 1 and 30 <= moved[0]["continued_from"] < n * MAX_TOKENS, moved


def test_a_leader_reports_tokens_only_when_asked_and_only_for_streams_it_can_move(tmp_path: Path):
    unit = Unit(tmp_path, name="direct", world_size=1)
    try:
        unit.start()
        unit.wait_ready(180)

        async def raw(body: dict, headers: dict) -> bytes:
            got = await stream(unit.leader.url, body, headers=headers)
            assert got.done, got.errors
            return got.raw

        async def scenario() -> dict[str, bytes]:
            asked = {contract.RESUME_HEADER: "1"}
            return {
                "asked": await raw(_body(max_tokens=8), asked),
                "not asked": await raw(_body(max_tokens=8), {}),
                "n=2": await raw(_body(max_tokens=8, n=2), asked),
            }

        seen = asyncio.run(asyncio.wait_for(scenario(), 120))
        marker = contract.RESUME_COMMENT.encode()
        assert seen["asked"].count(marker) == 1 + 8  # the opening, then one per token event
        assert marker not in seen["not asked"]
        assert seen["n=2"].count(marker) == 1 + 2 * 8  # each choice's token events name their choice
        assert b'"i":1' in seen["n=2"] and b'"f":1' in seen["n=2"]
    finally:
        unit.stop()


def _engine_pids(member) -> list[int]:
    """A member's engine process and its children (not the member's own HTTP process)."""
    return process_tree(member.proc.pid)[1:]


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        os.kill(pid, sig)


def test_a_request_sent_to_a_hung_engine_starts_again_on_another_unit(tmp_path: Path):
    """Before its first byte: the hung unit's leader still answers HTTP, holds the requests and sends
    nothing; it reports not ready once they made no progress for FLOTILLA_PROGRESS_STALL_S, and the
    router starts them again, whole, on the other unit."""
    want = greedy_texts([(PROMPT, False, MAX_TOKENS)])[0]
    units = _two_units(tmp_path)
    router = _router(tmp_path, units)
    with serving(units, router):
        hung, spare = units
        frozen = _engine_pids(hung.leader)
        try:

            async def scenario() -> tuple[Stream, dict]:
                spare.leader.sigstop()  # out of routing for a moment, so the requests go to the hung unit
                await router.wait_routable(1)
                _signal_all(frozen, signal.SIGSTOP)
                plain_body = {k: v for k, v in _body().items() if k not in ("stream", "stream_options")}

                async def plain() -> dict:
                    url = router.url + "/v1/completions"
                    async with aiohttp.ClientSession() as s, s.post(url, json=plain_body) as r:
                        assert r.status == 200, await r.text()
                        return await r.json()

                calls = asyncio.gather(stream(router.url, _body()), plain())
                await asyncio.to_thread(
                    wait_for,
                    lambda: _held(hung) >= 2,
                    timeout=60,
                    what="both requests to reach the hung unit",
                )
                spare.leader.sigcont()
                got, whole = await calls
                return got, whole

            got, whole = asyncio.run(asyncio.wait_for(scenario(), 300))
        finally:
            _signal_all(frozen, signal.SIGCONT)
        _check_whole(got, want)
        assert got.unit == spare.name
        assert whole["choices"][0]["text"] == want and whole["usage"]["completion_tokens"] == MAX_TOKENS
        metrics = asyncio.run(router.metrics())
        assert 'flotilla_router_retries_total{reason="left_before_first_byte"} 2.0' in metrics


def _held(unit: Unit) -> int:
    """Requests the unit's leader holds now (its ready body's in_flight)."""
    status, body = unit.leader.ready()
    return int((body or {}).get("load", {}).get("in_flight", 0))


def test_an_idle_unit_whose_engine_hangs_leaves_routing_and_returns_once_it_answers(tmp_path: Path):
    """No traffic at all: the leader's own one-token canary finds the hung engine."""
    units = _two_units(tmp_path, FLOTILLA_CANARY_IDLE_S="1")
    router = _router(tmp_path, units)
    with serving(units, router):
        hung = units[0]
        frozen = _engine_pids(hung.leader)
        _signal_all(frozen, signal.SIGSTOP)
        try:
            # The bound: canary idle (1 s) + FLOTILLA_PROGRESS_STALL_S (3 s) + one watch line; waited
            # for generously (a loaded machine), never timed, but under FLOTILLA_ENGINE_STALL_S (60 s),
            # whose re-form would also say not ready.
            wait_for(lambda: hung.leader.ready()[0] == 503, timeout=30, what=f"{hung.name} to report not ready")
            asyncio.run(asyncio.wait_for(router.wait_routable(1), 60))
            got = asyncio.run(asyncio.wait_for(stream(router.url, _body()), 120))
            assert got.unit == units[1].name and got.done
        finally:
            _signal_all(frozen, signal.SIGCONT)
        # The canary's answer comes once the engine runs again: back in rotation.
        asyncio.run(asyncio.wait_for(router.wait_routable(2), 120))
        # Canaries are not client traffic: the idle unit's leader logged no request.
        assert hung.leader.log_events("request") == []


def test_a_stream_whose_unit_dies_while_the_other_is_full_waits_for_a_slot_and_continues(tmp_path: Path):
    """One batch slot per unit: when a unit dies, the only other one is busy with a long answer. Busy
    is not broken: the moved stream waits for that answer to end and then continues there, whole,
    instead of ending with no_unit_to_resume (what losing a unit of a full fleet did to every
    stream on it)."""
    units = _two_units(tmp_path, FLOTILLA_MAX_RUNNING="1", FLOTILLA_QUEUE_TIMEOUT_S="1")
    router = _router(tmp_path, units, "--first-byte-timeout", "240")
    with serving(units, router):

        async def scenario() -> tuple[Stream, Stream, str]:
            long_started = asyncio.Event()

            async def note_start(s: Stream) -> None:
                long_started.set()

            # The long answer holds its unit's only slot for the whole scenario. Another prompt than the
            # moved stream's: the same one would count as cached on the long answer's unit, and a router
            # that has not yet heard that unit is full would send the second stream there too.
            long = asyncio.create_task(
                stream(router.url, _body(max_tokens=1500, prompt="the long tide"), on_event=note_start)
            )
            await asyncio.wait_for(long_started.wait(), 60)
            killed: list[str] = []

            async def kill_mid_way(s: Stream) -> None:
                if len(s.events) == 30 and not killed:
                    killed.append(s.unit)
                    await asyncio.to_thread(_leader_of(units, s.unit).leader.sigkill)

            got = await stream(router.url, _body(), on_event=kill_mid_way)
            return await long, got, killed[0]

        long, got, killed = asyncio.run(asyncio.wait_for(scenario(), 400))
        assert long.unit != killed and not long.errors and long.done
        _check_whole(got, greedy_texts([(PROMPT, False, MAX_TOKENS)])[0])
        moved = _leader_of(units, long.unit).continued_requests(wait_s=30)
        assert len(moved) == 1 and moved[0]["continued_from"] >= 30, moved
