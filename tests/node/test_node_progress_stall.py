"""Gray failure on the leader: an engine process that answers but makes no progress (a stopped member,
a stuck collective) counts as stalled, and the unit then reports not ready so routers stop sending it
work; it is ready again as soon as tokens flow."""

from __future__ import annotations

import time

import pytest

from runtime.engines.base import EngineState
from runtime.membership import Membership
from runtime.node.engine_config import EngineConfig
from runtime.node.engine_process import EngineProcess, StepTimes
from runtime.node.engine_protocol import Load, Token
from runtime.node.settings import load_settings

SOLO = Membership(unit_id="u", revision="1", rank=0, world_size=1, dist_host="127.0.0.1", dist_port=1)
CONFIG = EngineConfig.from_settings(
    load_settings(["--engine", "echo", "--peers", "127.0.0.1:1", "--rank", "0"], {}), SOLO
)


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
