"""The `--wait` / `--step-timeout` budgets of drain-unit, restore-unit and replace-node share one
loop (ops.commands.common.wait_until) over one task query (ops.fleet.live_tasks): when a budget
runs out, every command says so the same way, on one line, with exit status 1."""

from __future__ import annotations

import time
import types

import pytest

import ops.commands.common as common
from ops.errors import EXIT_FAILED

PROCESS_SLEEP = time.sleep  # as the process has it before any fixture runs


@pytest.fixture
def clock(monkeypatch):
    """Ten seconds pass between two looks at the clock, so a 5 s budget runs out after the first
    check whatever the machine's speed."""
    now = [0.0]

    def monotonic() -> float:
        now[0] += 10.0
        return now[0]

    monkeypatch.setattr(common, "time", types.SimpleNamespace(monotonic=monotonic))


def test_the_ecs_world_waits_without_sleeping_and_leaves_time_sleep_to_the_rest_of_the_process(world):
    """The waits' pause is replaced, not time.sleep: every other thread of the test process (an
    in-process node's step watch, a server's loop) keeps its own sleep instead of spinning."""
    assert time.sleep is PROCESS_SLEEP
    assert common.pause is not PROCESS_SLEEP


def _error_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("error:")]


def test_drain_wait_running_out_names_the_members_still_draining(world, clock, run_cli):
    unit = world.add_unit(cell=0, index=0)
    world.add_unit(cell=0, index=1)
    code, out = run_cli("drain-unit", unit.unit_id, "--yes", "--wait", "5")
    assert code == EXIT_FAILED
    assert _error_lines(out) == [
        f"error: {unit.service}: members stopping: not done after 5s (running 2, 2 not stopped yet (draining))"
    ]
    assert "drained (every member" not in out


def test_restore_wait_running_out_says_how_many_members_run(world, clock, run_cli):
    unit = world.add_unit(cell=0, index=0)
    world.add_unit(cell=0, index=1)
    world.model.settle()
    assert run_cli("drain-unit", unit.unit_id, "--yes")[0] == 0
    world.model.settle()
    code, out = run_cli("restore-unit", unit.unit_id, "--yes", "--wait", "5")
    assert code == EXIT_FAILED
    assert _error_lines(out) == [f"error: {unit.service}: running -> 2: not done after 5s (running 0)"]


def test_replace_step_timeout_while_the_node_drains_names_its_tasks(world, clock, run_cli):
    unit = world.add_unit(cell=0, index=0)
    world.add_unit(cell=0, index=1)
    world.boot_ticks = 0  # the replacement registers at the first look, so the drain step is the one that runs out
    old = world.running_instances(unit)[0]
    code, out = run_cli("replace-node", old, "--yes", "--step-timeout", "5")
    assert code == EXIT_FAILED
    assert _error_lines(out) == [f"error: {old}: draining: not done after 5s (1 task(s) not stopped yet)"]
    assert "terminating" not in out  # the old node is not terminated while its task still drains
