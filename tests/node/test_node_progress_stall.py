"""Gray failure on the leader: an engine process that answers but makes no progress (a stopped member,
a stuck collective) counts as stalled, and the unit then reports not ready so routers stop sending it
work; it is ready again as soon as tokens flow."""

from __future__ import annotations

import time

from runtime.engines.base import EngineState
from runtime.membership import Membership
from runtime.node.engine_config import EngineConfig
from runtime.node.engine_process import EngineProcess
from runtime.node.engine_protocol import Load
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
