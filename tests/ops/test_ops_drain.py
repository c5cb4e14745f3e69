"""`flotilla drain-unit` / `restore-unit`: dry run by default, refusal without confirmation when
stdin is not a terminal, and the ECS changes when confirmed; the waits against the ECS model."""

from __future__ import annotations

import builtins
import sys

import pytest

from ops.fleet import DRAINED_IN_CONFIG_TAG, DRAINED_TAG


def _service(aws, unit):
    return aws.ecs.describe_services(cluster=unit.cluster_arn, services=[unit.service_name], include=["TAGS"])[
        "services"
    ][0]


def test_dry_run_says_what_would_happen_and_changes_nothing(aws, fleet, run_cli):
    unit = fleet.add_unit(cell=0, index=0)
    fleet.add_unit(cell=0, index=1)
    code, out = run_cli("drain-unit", "cell0-unit0", "--dry-run")
    assert code == 0
    assert "set desired count 2 -> 0" in out
    assert "1 other ready unit(s) keep serving" in out
    assert "dry run: nothing changed" in out
    assert _service(aws, unit)["desiredCount"] == 2


def test_without_yes_and_without_a_terminal_drain_is_refused(aws, fleet, run_cli):
    unit = fleet.add_unit(cell=0, index=0)
    fleet.add_unit(cell=0, index=1)
    assert not sys.stdin.isatty()
    code, out = run_cli("drain-unit", "cell0-unit0")
    assert code == 1
    assert "refusing to drain cell0-unit0 without confirmation: stdin is not a terminal" in out
    assert _service(aws, unit)["desiredCount"] == 2


def test_drain_with_yes_scales_to_zero_and_status_shows_it_drained(world, run_cli):
    unit = world.add_unit(cell=0, index=0)
    world.add_unit(cell=0, index=1)
    code, out = run_cli("drain-unit", "cell0-unit0", "--yes", "--wait", "600")
    assert code == 0, out
    assert "cell0-unit0: drained" in out
    svc = world.service(unit)
    assert svc["desiredCount"] == 0
    assert {"key": DRAINED_TAG, "value": "2"} in svc["tags"]
    code, out = run_cli("status")
    assert code == 0, out  # drained on purpose: not a failure
    assert "DRAINED" in out and "1/2 units ready, 1 drained" in out


def test_drain_wait_returns_only_once_every_member_has_stopped(world, run_cli):
    """ECS counts a task as running only in RUNNING: runningCount is 0 as soon as the members are
    STOPPING, i.e. while they finish their in-flight requests after SIGTERM. "drained" must wait for
    STOPPED (ECS task lifecycle)."""
    unit = world.add_unit(cell=0, index=0)
    world.add_unit(cell=0, index=1)
    seen: list[str] = []
    world.model.on_task_change.append(lambda t: seen.append(t.last_status) if t.group.endswith(unit.service) else None)
    code, out = run_cli("drain-unit", "cell0-unit0", "--yes", "--wait", "600")
    assert code == 0, out
    tasks = [t for t in world.model.tasks.values() if t.group == f"service:{unit.service}"]
    assert tasks and all(t.last_status == "STOPPED" for t in tasks)
    assert {"DEACTIVATING", "STOPPING", "DEPROVISIONING", "STOPPED"} <= set(seen)
    assert world.running_instances(unit) == []


def test_draining_the_last_ready_unit_needs_force(aws, fleet, run_cli):
    unit = fleet.add_unit(cell=0, index=0)
    code, out = run_cli("drain-unit", "cell0-unit0", "--yes")
    assert code == 1
    assert "last ready unit" in out and "--force" in out
    assert _service(aws, unit)["desiredCount"] == 2
    code, _ = run_cli("drain-unit", "cell0-unit0", "--yes", "--force")
    assert code == 0
    assert _service(aws, unit)["desiredCount"] == 0


def test_a_terminal_user_is_asked_and_no_means_nothing_changes(aws, fleet, run_cli, monkeypatch):
    unit = fleet.add_unit(cell=0, index=0)
    fleet.add_unit(cell=0, index=1)
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True, raising=False)
    monkeypatch.setattr(builtins, "input", lambda prompt="": "n")
    code, out = run_cli("drain-unit", "cell0-unit0")
    assert code == 1 and "not confirmed" in out
    assert _service(aws, unit)["desiredCount"] == 2
    monkeypatch.setattr(builtins, "input", lambda prompt="": "y")
    code, out = run_cli("drain-unit", "cell0-unit0")
    assert code == 0, out
    assert _service(aws, unit)["desiredCount"] == 0


def test_restore_brings_a_drained_unit_back_to_nodes_per_unit(world, run_cli):
    unit = world.add_unit(cell=0, index=0)
    world.add_unit(cell=0, index=1)
    assert run_cli("drain-unit", "cell0-unit0", "--yes", "--wait", "600")[0] == 0
    code, out = run_cli("restore-unit", "cell0-unit0", "--dry-run")
    assert code == 0 and "set desired count 0 -> 2" in out
    assert world.service(unit)["desiredCount"] == 0
    ticks = world.model.ticks
    code, out = run_cli("restore-unit", "cell0-unit0", "--yes", "--wait", "600")
    assert code == 0, out
    assert world.model.ticks - ticks >= 4  # PROVISIONING -> PENDING -> ACTIVATING -> RUNNING
    svc = world.service(unit)
    assert svc["desiredCount"] == 2 and svc["runningCount"] == 2
    assert DRAINED_TAG not in {t["key"] for t in svc.get("tags", [])}
    assert len(world.running_instances(unit)) == 2
    code, out = run_cli("status", "--unit", "cell0-unit0")
    assert code == 0 and "READY" in out


def test_draining_an_unknown_unit_names_the_known_ones(aws, fleet, run_cli):
    fleet.add_unit(cell=0, index=0)
    code, out = run_cli("drain-unit", "cell9-unit9", "--dry-run")
    assert code == 1
    assert "unit 'cell9-unit9' not found" in out and "cell0-unit0" in out


def _drain_in_config(world, unit) -> None:
    """What a deploy with the unit in drained_units leaves (stacks/unit.py): desired count 0 and both
    drain tags on the service."""
    svc = world.service(unit)
    world.model.tag_resource(
        resourceArn=svc["serviceArn"],
        tags=[{"key": DRAINED_TAG, "value": "2"}, {"key": DRAINED_IN_CONFIG_TAG, "value": "true"}],
    )
    world.model.update_service(cluster=unit.cluster, service=unit.service, desiredCount=0)
    world.model.settle()


def test_a_unit_drained_in_the_config_shows_drained_and_kept_and_restore_refuses_it(world, run_cli):
    unit = world.add_unit(cell=0, index=0)
    world.add_unit(cell=0, index=1)
    _drain_in_config(world, unit)
    code, out = run_cli("status")
    flat = " ".join(out.split())
    assert code == 0, out
    assert "1/2 units ready, 1 drained (1 by drained_units, kept across deploys)" in flat
    assert "warning" not in out
    code, out = run_cli("restore-unit", "cell0-unit0", "--yes")
    assert code == 1
    assert "cell0-unit0 is drained in the config (drained_units): remove it there and deploy" in " ".join(out.split())
    assert world.service(unit)["desiredCount"] == 0


def test_drain_unit_tells_how_to_keep_the_drain_across_deploys(aws, fleet, run_cli):
    fleet.add_unit(cell=0, index=0)
    fleet.add_unit(cell=0, index=1)
    code, out = run_cli("drain-unit", "cell0-unit0", "--dry-run")
    assert code == 0
    assert "add cell0-unit0 to drained_units in the config and deploy" in " ".join(out.split())


# --- a cell, or every unit: the emergency stop ---------------------------------------------------------
def test_drain_a_cell_stops_exactly_its_units_and_a_cell_holding_the_last_ready_units_needs_force(world, run_cli):
    a, b = world.add_unit(cell=0, index=0), world.add_unit(cell=0, index=1)
    c = world.add_unit(cell=1, index=0)
    code, out = run_cli("drain-unit", "--cell", "0", "--yes", "--wait", "600")
    assert code == 0, out
    assert "cell0-unit0: drained" in out and "cell0-unit1: drained" in out
    assert [world.service(u)["desiredCount"] for u in (a, b, c)] == [0, 0, 2]
    code, out = run_cli("drain-unit", "--cell", "cell1", "--yes")
    assert code == 1 and "draining 1 unit(s) of cell1 stops all serving; pass --force" in " ".join(out.split())
    assert world.service(c)["desiredCount"] == 2
    code, out = run_cli("drain-unit", "--cell", "cell7", "--yes")
    assert code == 1 and "cell 'cell7' not found" in out and "cell0, cell1" in out


def test_drain_all_is_the_emergency_stop_and_restore_all_undoes_it(world, run_cli):
    units = [world.add_unit(cell=0, index=0), world.add_unit(cell=0, index=1), world.add_unit(cell=1, index=0)]
    code, out = run_cli("drain-unit", "--all", "--dry-run")
    assert code == 0 and "0 other ready unit(s) keep serving" in out
    assert all(world.service(u)["desiredCount"] == 2 for u in units)
    code, out = run_cli("drain-unit", "--all")  # stdin is not a terminal
    assert code == 1 and "refusing to drain all 3 unit(s)" in " ".join(out.split())
    code, out = run_cli("drain-unit", "--all", "--yes", "--wait", "600")  # no --force: stopping all is the point
    assert code == 0, out
    assert all(world.service(u)["desiredCount"] == 0 and world.running_instances(u) == [] for u in units)
    code, out = run_cli("status")  # below the FleetReadyUnits threshold, drained or not: critical
    assert code == 3 and "0/3 units ready, 3 drained" in " ".join(out.split())
    code, out = run_cli("restore-unit", "--all", "--yes", "--wait", "600")
    assert code == 0, out
    assert all(world.service(u)["desiredCount"] == 2 for u in units)
    assert run_cli("status")[0] == 0


def test_a_unit_and_a_selection_flag_together_or_neither_are_bad_input(world, run_cli, capsys):
    world.add_unit(cell=0, index=0)
    for argv in (["cell0-unit0", "--all"], ["--cell", "0", "--all"], [], ["--cell", "zero"]):
        with pytest.raises(SystemExit) as exc:
            run_cli("drain-unit", *argv, "--dry-run")
        assert exc.value.code == 2, argv
    assert "'zero' is not a cell" in capsys.readouterr().err
