"""The router's unit states on stdout (CloudWatch Logs through the log driver): what `flotilla status
--health-via router-logs` reads from outside the VPC."""

from __future__ import annotations

import json

from router_standins import StandInUnit
from router_testkit import router_over, run, wait_for

from runtime.router.unit_report import EVENT


def test_each_interval_every_unit_s_state_is_written_one_line_per_cell(capsys):
    async def scenario():
        a = await StandInUnit(name="cell0-unit0", cell="cell0").start()
        b = await StandInUnit(name="cell0-unit1", cell="cell0").start()
        c = await StandInUnit(name="cell1-unit0", cell="cell1").start()
        b.state = "forming"
        async with router_over([a, b, c], ready_units_interval_s=0.05) as router:
            await wait_for(lambda: len(router.fleet.cells) == 2)
            lines: list[dict] = []

            def collect() -> bool:
                out = capsys.readouterr().out
                lines.extend(json.loads(line) for line in out.splitlines() if f'"{EVENT}"' in line)
                return len({r["cell"] for r in lines}) == 2

            await wait_for(collect, what="a report of both cells")
        for u in (a, b, c):
            await u.stop()
        return lines

    lines = run(scenario())
    latest = {r["cell"]: r["units"] for r in lines}
    assert latest["cell0"]["cell0-unit0"]["routable"] is True
    assert latest["cell0"]["cell0-unit1"] == {
        "routable": False,
        "state": "forming",
        "revision": "1",
        "queue_depth": 0,
        "running": 0,
        "in_flight": -1,
        "prefill_tokens": -1,
    }
    assert set(latest["cell1"]) == {"cell1-unit0"}
