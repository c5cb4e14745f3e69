"""Scale-in under streaming load on real processes: two local units of two `runtime node` members
(reference engine, tiny model) behind a real router, started and drained by the scaler's own local
actuator (runtime/scaler/local_units.py: SIGTERM to every member, as ECS stops a service set to 0).
Every stream running on the unit that leaves is handed over by its leader and continues on the
other unit; no request fails."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

import pytest

from runtime import local
from runtime.scaler.local_units import ACTIVE, STOPPED, LocalUnits

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "router"))
from router_real_units import Load, RouterProcess  # noqa: E402
from router_testkit import run, wait_for  # noqa: E402

pytestmark = pytest.mark.timeout(300)


def describe(outcomes) -> str:
    bad = [o for o in outcomes if not o.ok]
    return f"{len(outcomes)} requests, {len(bad)} failed: " + "; ".join(
        f"[{o.status} {o.unit} stream={o.stream}] {o.error[:120]}" for o in bad[:8]
    )


def local_units(tmp_path: Path) -> LocalUnits:
    """The scaler's actuator over units planned exactly as `make local` plans them."""
    a = argparse.Namespace(nodes=2, engine="reference", model="tiny", drain_timeout=10.0)
    env, taken = local.base_environment(), set()
    return LocalUnits(
        plan=lambda unit_id: local.unit_processes(a, unit_id, tmp_path, taken, env),
        units_file=tmp_path / "units.txt",
        drain_timeout_s=10.0,
    )


async def until_state(units: LocalUnits, unit_id: str, state: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while units.units[unit_id].state != state:
        await asyncio.to_thread(units.poll)
        if time.monotonic() > deadline:
            raise AssertionError(f"{unit_id} not {state} after {timeout} s: {units.events}")
        await asyncio.sleep(0.2)


def test_scale_in_under_streaming_load_hands_every_stream_over_and_fails_none(tmp_path: Path):
    units = local_units(tmp_path)
    router = RouterProcess(
        tmp_path,
        name="r",
        args=[
            "--units-file",
            str(units.units_file),
            "--discovery-interval",
            "0.2",
            "--poll-interval",
            "0.2",
            "--drain-grace",
            "0",
        ],
    )
    marks: dict[str, float] = {}

    async def scenario():
        leaving, staying = units.start(), units.start()
        await asyncio.gather(*(until_state(units, u.unit_id, ACTIVE, 180) for u in (leaving, staying)))
        await router.start()
        await router.wait_routable(2)
        load = Load(pick_url=lambda: router.url, clients=8, stream_max_tokens=64, ignore_eos=True)

        async def scale_in():
            await wait_for(
                lambda: sum(o.unit == leaving.unit_id for o in load.outcomes) >= 5, timeout=60, what="traffic"
            )
            # Drain while a stream is under way on the unit, so the hand-over is exercised.
            await wait_for(
                lambda: load.live_streams.get(leaving.unit_id, 0) > 0, timeout=60, what="a stream", interval=0.001
            )
            marks["streams"] = load.live_streams[leaving.unit_id]
            units.drain(leaving.unit_id)
            marks["drained"] = time.monotonic()
            await until_state(units, leaving.unit_id, STOPPED, 60)
            marks["stopped"] = time.monotonic()

        def enough(outs) -> bool:
            return "stopped" in marks and sum(o.sent > marks["stopped"] for o in outs) >= 20

        await asyncio.gather(scale_in(), load.run(enough))
        return load.outcomes, await router.metrics(), leaving, staying

    try:
        outcomes, metrics, leaving, staying = run(scenario(), timeout=240.0)
    finally:
        router.stop()
        local.stop_all(units.members(), 20)
    failed = [o for o in outcomes if not o.ok]
    print(f"scale-in: {describe(outcomes)}; {marks['streams']} stream(s) on the unit when it drained")
    assert failed == [], describe(failed)
    # The streams moved because the unit handed them over (its leader's drain), not because it died
    # under them: the router counts the first as move_handover_unavailable, the second as
    # move_stream_broken.
    assert 'flotilla_router_retries_total{reason="move_handover_unavailable"}' in metrics, metrics
    assert 'reason="move_stream_broken"' not in metrics
    # Its members exited cleanly, and it left the router's units file once they had.
    assert all(m.process.returncode == 0 for m in leaving.members)
    assert units.units_file.read_text().split() == [staying.leader_url]
    # After it stopped, every request went to the unit that stayed.
    assert all(o.unit == staying.unit_id for o in outcomes if o.sent > marks["stopped"] + 1.0)
