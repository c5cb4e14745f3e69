"""Gray failure on the leader: an engine process that answers but makes no progress (a stopped member,
a stuck collective) counts as stalled, and the unit then reports not ready so routers stop sending it
work; it is ready again as soon as tokens flow."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest

from runtime.engines.base import EngineState, GenerationRequest, SamplingParams
from runtime.engines.reference import ReferenceEngine
from runtime.membership import Membership
from runtime.node import engine_process
from runtime.node.engine_config import EngineConfig
from runtime.node.engine_host import load_event
from runtime.node.engine_process import EngineProcess, StepTimes
from runtime.node.engine_protocol import Done, Load, Token, encode
from runtime.node.settings import load_settings

SOLO = Membership(unit_id="u", revision="1", rank=0, world_size=1, dist_host="127.0.0.1", dist_port=1)
CONFIG = EngineConfig.from_settings(
    load_settings(["--engine", "echo", "--peers", "127.0.0.1:1", "--rank", "0"], {}), SOLO
)
REQUEST = dict(correlation_id="", prompt="x", max_tokens=1, default_max_tokens=1, temperature=0.0, top_p=1.0)


def _engine(running: int, quiet_s: float) -> EngineProcess:
    e = EngineProcess(config=CONFIG)
    e.load = Load(state=EngineState.READY, running=running, max_running=8)
    e.last_progress = time.monotonic() - quiet_s
    return e


def test_running_sequences_without_a_token_past_the_bound_are_a_stall():
    assert _engine(running=2, quiet_s=10.0).stalled(3.0)


def test_an_engine_producing_tokens_is_not_stalled():
    assert not _engine(running=2, quiet_s=0.0).stalled(3.0)


def test_an_idle_engine_is_never_stalled_however_long_it_was_quiet():
    assert not _engine(running=0, quiet_s=3600.0).stalled(3.0)


def test_the_first_request_of_an_idle_engine_starts_the_clock_afresh():
    e = _engine(running=0, quiet_s=3600.0)
    # not started: the request ends at once, but the clock was reset
    e.submit("r1", correlation_id="", prompt="x", max_tokens=1, default_max_tokens=1, temperature=0.0, top_p=1.0)
    e.load = Load(state=EngineState.READY, running=1, max_running=8)
    assert not e.stalled(3.0)


def test_an_engine_whose_recent_steps_were_long_may_stay_silent_past_the_floor():
    # A busy engine: its last steps took 4 s (long prefills of other requests, a big batch).
    e = _engine(running=2, quiet_s=5.0)
    e.steps.note(4.0, time.monotonic())
    assert not e.stalled(3.0)  # 5 s quiet is within twice its step plus a second (9 s)
    e.last_progress = time.monotonic() - 10.0
    assert e.stalled(3.0)  # past it: hung


def test_the_stall_bound_stops_at_its_ceiling():
    e = _engine(running=2, quiet_s=31.0)
    e.steps.note(100.0, time.monotonic())  # a step that long (e.g. the pause before a SIGCONT)
    assert e.stall_after(3.0, 30.0) == 30.0
    assert e.stalled(3.0, 30.0)


def test_a_token_teaches_the_engine_its_step_time_and_idle_time_does_not():
    e = _engine(running=1, quiet_s=0.0)
    now = time.monotonic()
    e.last_progress = now - 2.5  # the last token (or the work reaching an idle engine) 2.5 s ago
    e.last_report = now
    e._relay(Token(id="r1", token_id=7, text="x"))
    assert e.step_s() == pytest.approx(2.5)
    # An idle engine's first request starts the clock afresh: the idle hour is no step.
    idle = _engine(running=0, quiet_s=3600.0)
    idle.submit("r2", correlation_id="", prompt="x", max_tokens=1, default_max_tokens=1, temperature=0.0, top_p=1.0)
    idle.last_report = time.monotonic()
    idle._relay(Token(id="r2", token_id=7, text="x"))
    assert idle.step_s() < 3600.0


def test_a_long_step_is_forgotten_two_windows_later():
    steps = StepTimes(window_s=60.0)
    steps.note(8.0, 0.0)
    assert steps.longest(59.0) == 8.0
    assert steps.longest(61.0) == 8.0  # the previous window still counts
    assert steps.longest(121.0) == 0.0


# --- a prompt prefilled over several steps --------------------------------------------------------
# The reference engine prefills at most max_prefill_tokens of a prompt per step, so a long prompt on
# an otherwise idle engine takes several steps before its first token. Each completed step is
# progress: the unit is busy, not hung.

CHUNK_S = 2.5  # each chunk step, on the test's clock: below the 3 s floor, four of them far above it
BUDGET = 24
PROMPT = [(11 * i + 5) % 240 + 10 for i in range(90)]  # byte-level ids of the tiny tokenizer: 4 chunks


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


class _Pipe:
    """The engine process as EngineProcess sees it: lines on its stdout, commands swallowed."""

    def __init__(self) -> None:
        self.stdout = asyncio.StreamReader()
        self.stdin = self
        self.pid = 0
        self.returncode = None

    def write(self, data: bytes) -> None:
        pass

    async def wait(self) -> int:
        await asyncio.Event().wait()  # never exits while the test runs
        return 0


def _reports_per_step() -> tuple[list[Load], list[bool]]:
    """A real reference engine (tiny) prefilling PROMPT in BUDGET-token chunks: the load report its
    engine process sends (engine_host) as each step begins, so reports[i] is the report once i steps
    have completed, and whether step i yielded the prompt's first token (its last chunk)."""
    reports: list[Load] = []
    tokened: list[bool] = []

    async def run() -> None:
        engine = ReferenceEngine(SOLO, model="tiny", max_prefill_tokens=BUDGET, prefix_caching=False)
        await engine.start()
        step = engine.executor.leader_step

        def recording(cmd):
            reports.append(load_event(engine))
            tokened.append(bool(cmd.prefill) and not cmd.ongoing)
            return step(cmd)

        engine.executor.leader_step = recording
        try:
            one = SamplingParams(max_tokens=1, ignore_eos=True)
            req = GenerationRequest(request_id="long", prompt_token_ids=tuple(PROMPT), sampling=one)
            assert len([ev async for ev in engine.generate(req)]) == 1
            reports.append(load_event(engine))
        finally:
            await engine.shutdown()

    asyncio.run(asyncio.wait_for(run(), timeout=120))
    return reports, tokened


def test_a_prompt_prefilled_over_several_steps_is_progress_and_a_hang_between_its_chunks_is_still_a_stall(
    monkeypatch,
):
    reports, tokened = _reports_per_step()
    chunks = tokened.index(True) + 1
    assert chunks == 4, tokened  # the prompt took 4 steps before its first token
    clock = _Clock()
    monkeypatch.setattr(engine_process, "time", clock)

    async def replay() -> None:
        e = EngineProcess(config=CONFIG)
        pipe = _Pipe()
        e.proc = pipe
        reader = asyncio.create_task(e._read())

        async def send(ev) -> None:
            clock.now += 0.001  # each line arrives at its own instant
            pipe.stdout.feed_data(encode(ev))
            while e.last_report != clock.now:
                await asyncio.sleep(0)

        async def wait(seconds: float, report: Load) -> None:
            """seconds of the engine working on a step: its process reports its load every 0.1 s."""
            end = clock.now + seconds
            while clock.now + 0.1 < end:
                clock.now += 0.1
                await send(report)
            clock.now = end

        try:
            await send(Load(state=EngineState.READY, max_running=8))
            e.submit("long", **REQUEST)  # an idle engine: its clock starts here
            for i in range(chunks):
                await wait(CHUNK_S, reports[i])
                assert not e.stalled(3.0, 30.0), f"stalled while step {i + 1} of {chunks} ran"
                await send(reports[i + 1])  # the step completed
                if tokened[i]:
                    await send(Token(id="long", token_id=7, text="x", finish_reason="length"))
                assert not e.stalled(3.0, 30.0), f"stalled after step {i + 1} of {chunks} completed"
            # Its pace is a step's, not the whole prefill's: 2 x 2.5 s + 1 s, not 2 x 10 s + 1 s.
            assert e.step_s() == pytest.approx(CHUNK_S, abs=0.2)
            assert e.stall_after(3.0, 30.0) == pytest.approx(2 * CHUNK_S + 1, abs=0.5)

            # The same prompt on an engine that hangs after two of its chunks: still a stall, within
            # the bound its own steps set.
            await send(Done(id="long"))
            done = reports[-1].steps
            later = [dataclasses.replace(r, steps=done + r.steps) for r in reports]
            e.submit("hung", **REQUEST)
            for i in range(2):
                await wait(CHUNK_S, later[i])
                await send(later[i + 1])
            bound = e.stall_after(3.0, 30.0)
            await wait(bound - 0.2, later[2])  # nothing completes any more; the reports go on
            assert not e.stalled(3.0, 30.0)
            await wait(0.4, later[2])
            assert e.stalled(3.0, 30.0), "an engine whose steps stopped completing is a stall"
        finally:
            reader.cancel()

    asyncio.run(replay())


def _reported(e: EngineProcess, clock: _Clock, after_s: float, **load) -> None:
    clock.now += after_s
    e.last_report = clock.now  # as _read notes every line
    e._loaded(Load(state=EngineState.READY, max_running=8, **load))


def test_a_step_the_tokens_already_told_of_adds_no_step_time(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(engine_process, "time", clock)
    e = EngineProcess(config=CONFIG)
    _reported(e, clock, 0.0, running=1, steps=10)
    clock.now += 0.02
    e.last_report = clock.now
    e._relay(Token(id="r1", token_id=7, text="x"))  # the decode step's token, to the millisecond
    token_at = e.last_progress
    _reported(e, clock, 0.08, running=1, steps=11)  # the same step, counted 80 ms later
    assert e.last_progress == token_at
    _reported(e, clock, 0.1, running=1, steps=12)  # a step with no token since the last report
    assert e.last_progress == clock.now
    assert e.step_s() == pytest.approx(0.18)


def test_steps_of_an_engine_that_holds_nothing_are_no_progress(monkeypatch):
    # The step that frees a finished request's KV yields no token either: an idle engine's clock (its
    # canary's, its first request's) does not move for it.
    clock = _Clock()
    monkeypatch.setattr(engine_process, "time", clock)
    e = EngineProcess(config=CONFIG)
    _reported(e, clock, 0.0, running=0, steps=10)
    idle_since = e.last_progress
    _reported(e, clock, 5.0, running=0, steps=11)
    assert e.last_progress == idle_since
    assert e.step_s() == 0.0
