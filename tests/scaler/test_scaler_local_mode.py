"""`make local LOCAL_ARGS="--scaler ..."` (python -m runtime.local --scaler) under a load ramp: the
scaler starts a second whole unit when the load rises and drains one when it falls, through the same
router and drain paths as everything else; every request is answered."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from localmode import LocalMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "router"))
from router_real_units import Load  # noqa: E402
from router_testkit import run  # noqa: E402

pytestmark = pytest.mark.timeout(400)


def decisions(local: LocalMode) -> list[dict]:
    path = local.state / "scaler.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def leaders(local: LocalMode) -> list[str]:
    path = local.state / "units.txt"
    return path.read_text().split() if path.exists() else []


@pytest.mark.whole_machine  # units, the router, the scaler and a ramp of load on them
def test_the_scaler_adds_a_unit_as_load_rises_and_drains_one_as_it_falls_with_every_request_answered(tmp_path):
    local = LocalMode(
        tmp_path, "--scaler", "--units", "1", "--max-units", "2", "--nodes", "1", "--scaler-interval", "1"
    )
    outcomes = []
    try:
        local.wait_ready(timeout=180)
        processes = local.processes()

        async def ramp():
            busy = Load(pick_url=lambda: local.url, clients=24, stream_max_tokens=32, ignore_eos=True)
            added_at: list[float] = []

            def grown(outs) -> bool:
                if not added_at and any(d["add"] for d in decisions(local)):
                    added_at.append(time.monotonic())
                served = {o.unit for o in outs if added_at and o.sent > added_at[0]}
                return len(served) == 2 and len(outs) >= 50

            await busy.run(grown)
            quiet = Load(pick_url=lambda: local.url, clients=1, stream_max_tokens=32, ignore_eos=True)
            await quiet.run(lambda outs: len(leaders(local)) == 1 and len(outs) >= 5)
            return busy.outcomes + quiet.outcomes

        outcomes = run(ramp(), timeout=300.0)
        made = decisions(local)
        assert sum(d["add"] for d in made) == 1, made
        removed = [u for d in made for u in d["remove"]]
        assert len(removed) == 1, made
        failed = [o for o in outcomes if not o.ok]
        assert failed == [], f"{len(failed)} of {len(outcomes)} failed: {[o.error[:100] for o in failed[:5]]}"
        assert {o.unit for o in outcomes} == {"local-unit0", "local-unit1"}
        local.ctrl_c(processes + [p for p in local.processes() if p not in processes])
    finally:
        local.kill()
