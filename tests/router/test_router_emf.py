"""The router's ReadyUnits metric (CloudWatch EMF on stdout, docs/observability.md): one line per cell
learned from the members' ready bodies, plus the fleet-wide line, every ready_units_interval_s."""

from __future__ import annotations

import json

from router_standins import StandInUnit
from router_testkit import router_over, run, wait_for

import contract
from runtime.router.discovery import StaticDiscovery

SERVICE, CELL, READY = contract.METRIC_DIM_SERVICE, contract.METRIC_DIM_CELL, contract.METRIC_READY_UNITS


class Captured:
    """EMF lines read from pytest's captured stdout as they come."""

    def __init__(self, capsys) -> None:
        self.capsys = capsys
        self.lines: list[dict] = []

    def read(self) -> list[dict]:
        for raw in self.capsys.readouterr().out.splitlines():
            if raw.startswith('{"_aws"') and f'"{READY}"' in raw:  # not the traffic line of the same pass
                self.lines.append(json.loads(raw))
        return self.lines

    def rounds(self) -> list[dict[str, int]]:
        """Each emission as {cell or "": count}; a round ends with its fleet-wide line."""
        out, current = [], {}
        for line in self.read():
            current[line.get(CELL, "")] = line[READY]
            if CELL not in line:
                out.append(current)
                current = {}
        return out


def assert_ready_units_shape(line: dict) -> None:
    [directive] = line["_aws"]["CloudWatchMetrics"]
    assert directive["Namespace"] == contract.METRICS_NAMESPACE
    assert directive["Metrics"] == [{"Name": READY, "Unit": "Count"}]
    assert line[SERVICE] == contract.METRIC_SERVICE_VALUE and isinstance(line["_aws"]["Timestamp"], int)
    # a cell's count must never land in the fleet-wide series (FleetReadyUnits reads its Minimum)
    assert directive["Dimensions"] == ([[SERVICE, CELL]] if CELL in line else [[SERVICE]])


def test_ready_units_are_written_per_cell_and_fleet_wide(capsys):
    async def scenario():
        a0 = await StandInUnit(name="cell0-unit0", cell="cell0").start()
        a0_follower = await StandInUnit(name="cell0-unit0", cell="cell0", rank=1).start()
        a1 = await StandInUnit(name="cell0-unit1", cell="cell0").start()
        b0 = await StandInUnit(name="cell1-unit0", cell="cell1").start()
        members = [a0, a0_follower, a1, b0]
        out = Captured(capsys)
        discovery = StaticDiscovery(units=tuple(m.url for m in members))
        async with router_over([a0, a1, b0], discovery=discovery, ready_units_interval_s=0.1) as router:
            await wait_for(lambda: out.rounds() and out.rounds()[-1] == {"cell0": 2, "cell1": 1, "": 3})
            for line in out.lines:
                assert_ready_units_shape(line)
            b0.state = "forming"  # cell1's only unit reloads its model
            await wait_for(lambda: out.rounds()[-1] == {"cell0": 2, "cell1": 0, "": 2})
            await b0.stop()  # and then is gone altogether: cell1 still reports 0
            await wait_for(lambda: router.fleet.members[b0.url].state == "unreachable")
            seen = len(out.rounds())
            await wait_for(lambda: len(out.rounds()) > seen + 1)
            assert out.rounds()[-1] == {"cell0": 2, "cell1": 0, "": 2}
        for m in (a0, a0_follower, a1):
            await m.stop()

    run(scenario())


def test_without_cells_only_the_fleet_wide_line_is_written(capsys):
    async def scenario():
        a = await StandInUnit(name="local").start()
        out = Captured(capsys)
        async with router_over([a], ready_units_interval_s=0.1):
            await wait_for(lambda: out.rounds() and out.rounds()[-1] == {"": 1})
        assert all(set(r) == {""} for r in out.rounds())
        assert all(line["_aws"]["CloudWatchMetrics"][0]["Dimensions"] == [[SERVICE]] for line in out.lines)
        await a.stop()

    run(scenario())
