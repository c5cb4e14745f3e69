"""How long a stream may go without a token before its unit counts as hung: twice the unit's own
longest recent step plus a second, at least the floor setting (contract.ready.stall_bound). Two real
echo-engine units whose steps take longer than the floor (a busy unit on a loaded host) behind a real
router: the leader learns its step time from its first tokens (here an idle canary's), reports it,
and both the leader's progress watch and the router's stream stall derive their bound from it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from nodeproc import Unit, get_json, wait_for
from router_real_units import RouterProcess
from test_router_resume import Stream, serving, stream

pytestmark = pytest.mark.timeout(600)

PROMPT = "abcdefgh"  # the echo engine answers with the prompt's bytes, cycled


def _units(tmp_path: Path, name: str, step_s: float, **env: str) -> list[Unit]:
    settings = {
        "FLOTILLA_ECHO_STEP_S": str(step_s),
        "FLOTILLA_CANARY_IDLE_S": "1",  # an idle leader's one-token canary teaches it its step time
        **env,
    }
    return [Unit(tmp_path, name=f"{name}-{k}", world_size=1, engine="echo", **settings) for k in range(2)]


def _router(tmp_path: Path, units: list[Unit], *extra: str) -> RouterProcess:
    args = ["--units", ",".join(u.leader.url for u in units), "--poll-interval", "0.2", "--drain-grace", "0"]
    return RouterProcess(tmp_path, name="stall", args=[*args, *extra])


def _learned_steps(units: list[Unit], at_least_s: float) -> None:
    """Until each leader is ready and reports a step of at least `at_least_s` (its canaries ran)."""
    for u in units:

        def learned(u: Unit = u) -> bool:
            status, body = get_json(u.leader.url + "/health/ready")
            return status == 200 and body["load"]["step_s"] >= at_least_s

        wait_for(learned, timeout=60, what=f"{u.name} to report its step time")


def _body(max_tokens: int) -> dict:
    return {"model": "tiny", "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "stream": True}


def _want(max_tokens: int) -> str:
    return "".join(PROMPT[i % len(PROMPT)] for i in range(max_tokens))


def test_a_busy_unit_whose_steps_outlast_the_stall_floor_keeps_its_stream(tmp_path: Path):
    # Steps of 1 s against floors of 0.5 s: by the floors alone the leader would report itself not
    # ready, and the router would take the stream for stalled, at every step (each step is twice
    # the floor; a loaded host only lengthens steps, which the derived bound follows).
    units = _units(tmp_path, "busy", 1.0, FLOTILLA_PROGRESS_STALL_S="0.5")
    router = _router(tmp_path, units, "--stream-stall", "0.5")
    with serving(units, router):
        _learned_steps(units, 0.8)
        asyncio.run(asyncio.wait_for(router.wait_routable(2), 60))
        got: Stream = asyncio.run(asyncio.wait_for(stream(router.url, _body(5)), 120))
        assert not got.errors and got.done, got.errors
        assert got.text == _want(5)
        assert [len(u.continued_requests()) for u in units] == [0, 0]  # it never moved
        metrics = asyncio.run(router.metrics())
        assert "move_" not in metrics, [line for line in metrics.splitlines() if "move_" in line]


def test_a_unit_silent_past_its_derived_bound_loses_its_stream(tmp_path: Path):
    # Only the router's stream stall can notice here: the leaders' own progress watch is set far off.
    # Steps of 1 s against a floor of 0.5 s: the stream survives its unit's steps only if the bound
    # derives from them, and moves off the frozen engine only if the derived bound is finite (the
    # idle timeout and the ceiling are far beyond the test's own bound).
    units = _units(tmp_path, "hung", 1.0, FLOTILLA_PROGRESS_STALL_S="600", FLOTILLA_PROGRESS_STALL_MAX_S="600")
    router = _router(
        tmp_path, units, "--stream-stall", "0.5", "--stream-stall-max", "600", "--idle-stream-timeout", "600"
    )
    with serving(units, router):
        _learned_steps(units, 0.8)
        asyncio.run(asyncio.wait_for(router.wait_routable(2), 60))
        frozen: list[Unit] = []

        async def freeze_after_two(s: Stream) -> None:
            if len(s.events) == 2 and not frozen:
                unit = next(u for u in units if u.name == s.unit)
                frozen.append(unit)
                await asyncio.to_thread(unit.leader.sigstop_engine)

        got: Stream = asyncio.run(asyncio.wait_for(stream(router.url, _body(8), on_event=freeze_after_two), 120))
        assert not got.errors and got.done, got.errors
        assert got.text == _want(8)
        other = next(u for u in units if u is not frozen[0])
        moved = other.continued_requests(wait_s=30)
        assert len(moved) == 1 and moved[0]["continued_from"] >= 2, moved
        metrics = asyncio.run(router.metrics())
        assert 'flotilla_router_retries_total{reason="move_idle_timeout"} 1.0' in metrics
