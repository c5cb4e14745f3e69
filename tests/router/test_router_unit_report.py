"""The router's unit states on stdout (CloudWatch Logs through the log driver): what `flotilla status
--health-via router-logs` reads from outside the VPC."""

from __future__ import annotations

import json

import aiohttp
from router_standins import StandInUnit
from router_testkit import post, router_over, run, wait_for

from contract import METRICS_NAMESPACE
from contract.scaling import METRIC_BUSY_REFUSALS, METRIC_REQUESTS, TRAFFIC_EVENT
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
        "max_running": 8,  # the stand-in's batch slots
        "wait_s": 0.0,
    }
    assert set(latest["cell1"]) == {"cell1-unit0"}


def test_each_interval_the_router_writes_its_requests_and_429s_of_the_interval_as_metrics(capsys):
    """The traffic line the scaler sums over routers: requests answered or refused, and those
    answered 429 (here: refused by the router because the only unit reports a full queue)."""

    async def scenario():
        unit = await StandInUnit(name="cell0-unit0", cell="cell0").start()
        lines: list[dict] = []
        async with router_over([unit], ready_units_interval_s=0.2, max_queue_depth=4) as router:
            async with aiohttp.ClientSession() as s:
                codes = [(await post(s, router))[0] for _ in range(5)]
                unit.queue_depth = 4
                await wait_for(lambda: router.fleet.members[unit.url].queue_depth == 4)
                codes += [(await post(s, router))[0] for _ in range(3)]

            def collect() -> bool:
                out = capsys.readouterr().out
                lines.extend(json.loads(line) for line in out.splitlines() if f'"{TRAFFIC_EVENT}"' in line)
                return sum(r[METRIC_REQUESTS] for r in lines) >= 8

            await wait_for(collect, timeout=10, what="traffic lines counting every request")
        await unit.stop()
        return codes, lines

    codes, lines = run(scenario())
    assert codes == [200] * 5 + [429] * 3
    assert sum(r[METRIC_REQUESTS] for r in lines) == 8
    assert sum(r[METRIC_BUSY_REFUSALS] for r in lines) == 3
    declared = lines[0]["_aws"]["CloudWatchMetrics"][0]
    assert declared["Namespace"] == METRICS_NAMESPACE and declared["Dimensions"] == [["Service"]]
