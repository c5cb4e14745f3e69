"""`flotilla rollback` against the ECS model: after a `cdk deploy` (which deregisters replaced task
definitions unless the template retains them), in waves that are each ready before the next starts,
dry run and refusal by default."""

from __future__ import annotations

import pytest

import contract


def _deploy(world, units, revision="2", policy="Delete"):
    return world.cdk_deploy(units, revision=revision, update_replace_policy=policy)


def _td(world, unit) -> str:
    return world.service(unit)["taskDefinition"]


def _fleet(world, n_cells=1, per_cell=2, **kw):
    return [world.add_unit(cell=c, index=i, **kw) for c in range(n_cells) for i in range(per_cell)]


def test_rollback_after_a_cdk_deploy_that_deregistered_the_old_revision_registers_it_again(world, run_cli):
    """CloudFormation deregisters the replaced task definition once the update completes
    (aws/aws-cdk#24372) and ECS refuses an INACTIVE one in UpdateService: the rollback registers
    the old revision again and the unit comes back on it."""
    units = _fleet(world, per_cell=1)
    (old,) = _deploy(world, units, policy="Delete")
    assert world.model.task_defs[old].status == "INACTIVE"
    code, out = run_cli("rollback", "--unit", "cell0-unit0", "--yes", "--wait", "600")
    assert code == 0, out
    assert "INACTIVE: registered again as a new revision" in out
    new_td = _td(world, units[0])
    assert new_td.endswith(f"{units[0].family}:3")  # a third revision with the first one's content
    assert world.model.task_defs[new_td].request == world.model.task_defs[old].request
    assert world.revision_of(units[0]) == "1"
    assert "1 unit(s) in 1 wave(s)" in out and "wave 1: cell0-unit0 ready" in out


def test_rollback_after_a_cdk_deploy_with_retained_revisions_goes_back_to_the_revision_itself(world, run_cli):
    units = _fleet(world, per_cell=1)
    (old,) = _deploy(world, units, policy="Retain")
    assert world.model.task_defs[old].status == "ACTIVE"
    code, out = run_cli("rollback", "--all", "--yes")
    assert code == 0, out
    assert _td(world, units[0]) == old
    assert not any(op == "RegisterTaskDefinition" for op, _ in world.model.calls[-40:])


def test_rollback_waits_for_ecs_to_replace_the_members_not_for_the_api_call(world, run_cli):
    """UpdateService only starts a deployment: the wave is done once ECS has replaced the members
    and the unit answers ready on the old revision, which takes the model several scheduler ticks."""
    units = _fleet(world, per_cell=1)
    _deploy(world, units)
    ticks = world.model.ticks
    code, out = run_cli("rollback", "--all", "--yes")
    assert code == 0, out
    assert world.model.ticks - ticks >= 6  # PROVISIONING .. RUNNING, health check, old tasks stopped
    (deployment,) = world.service(units[0])["deployments"]
    assert deployment["rolloutState"] == "COMPLETED" and deployment["runningCount"] == 2
    code, status = run_cli("status", "--unit", "cell0-unit0")
    assert code == 0 and "READY" in status


def test_rollback_of_all_units_goes_in_waves_each_completed_before_the_next(world, run_cli):
    units = _fleet(world, n_cells=2, per_cell=3)
    _deploy(world, units)
    calls_before = len(world.model.calls)
    log_before = len(world.model.log)
    code, out = run_cli("rollback", "--all", "--yes", "--units-per-wave", "2")
    assert code == 0, out
    assert "6 unit(s) in 4 wave(s) of at most 2" in out  # cell0: 2 + 1, cell1: 2 + 1
    updates = [kw["service"] for op, kw in world.model.calls[calls_before:] if op == "UpdateService"]
    order = [u.service for u in units]
    assert updates == order
    # Never more than one wave's deployments in progress at a time, and each wave's deployments
    # completed before the next wave's started.
    events = world.model.log[log_before:]
    in_progress, most = set(), 0
    for _, what, service in events:
        if what == "deployment":
            in_progress.add(service)
        elif what == "completed":
            in_progress.discard(service)
        most = max(most, len(in_progress))
    assert most <= 2
    started = [s for _, what, s in events if what == "deployment"]
    completed = [s for _, what, s in events if what == "completed"]
    for first, second in ((order[0:2], order[2:3]), (order[2:3], order[3:5]), (order[3:5], order[5:6])):
        last_done = max(i for i, (_, w, s) in enumerate(events) if w == "completed" and s in first)
        first_next = min(i for i, (_, w, s) in enumerate(events) if w == "deployment" and s in second)
        assert last_done < first_next, (first, second)
    assert sorted(started) == sorted(completed) == sorted(order)
    assert all(world.revision_of(u) == "1" for u in units)


def test_the_default_wave_is_a_tenth_of_the_selected_units_and_at_least_one(world, run_cli):
    units = _fleet(world, per_cell=3)
    _deploy(world, units)
    code, out = run_cli("rollback", "--all", "--dry-run")
    assert code == 0, out
    assert "3 unit(s) in 3 wave(s) of at most 1" in out
    assert all(world.revision_of(u) == "2" for u in units)  # a dry run changes nothing


def test_a_wave_that_would_take_every_unit_at_once_is_refused(world, run_cli):
    units = _fleet(world, per_cell=2)
    _deploy(world, units)
    code, out = run_cli("rollback", "--all", "--yes", "--units-per-wave", "2")
    assert code == 2
    assert "--units-per-wave=2 would roll back all 2 units" in out and "give 1 to 1" in out
    assert all(world.revision_of(u) == "2" for u in units)


@pytest.mark.parametrize("value", ["0", "-3", "ten"])
def test_a_wave_size_below_one_or_not_a_number_is_a_usage_error(world, run_cli, capsys, value):
    with pytest.raises(SystemExit) as exc:
        run_cli("rollback", "--all", "--units-per-wave", value)
    assert exc.value.code == 2
    assert "--units-per-wave" in capsys.readouterr().err


def test_a_failed_wave_stops_the_rollback_and_says_how_to_go_on(world, run_cli):
    """The first wave's deployment trips the circuit breaker (the old revision cannot start any
    more): the second wave is never touched and the error names the command that continues."""
    units = _fleet(world, per_cell=3)
    (old0, old1, old2) = _deploy(world, units, policy="Retain")
    world.model.failing_task_definitions.add(old0)
    code, out = run_cli("rollback", "--all", "--yes", "--units-per-wave", "1")
    assert code == 1
    assert "wave 1: the rollback deployment of cell0-unit0 FAILED" in out
    flat = " ".join(out.split())  # the console wraps long lines
    assert "flotilla rollback --unit cell0-unit0 --unit cell0-unit1 --unit cell0-unit2 --to-revision 1" in flat
    assert [world.revision_of(u) for u in units[1:]] == ["2", "2"]
    updated = [
        kw["service"]
        for op, kw in world.model.calls
        if op == "UpdateService" and kw.get("taskDefinition") in (old1, old2)
    ]
    assert updated == []


def test_to_revision_leaves_units_already_on_it_alone_so_a_stopped_rollback_can_be_run_again(world, run_cli):
    units = _fleet(world, per_cell=3)
    _deploy(world, units)
    assert run_cli("rollback", "--unit", "cell0-unit0", "--yes")[0] == 0
    calls = len(world.model.calls)
    code, out = run_cli("rollback", "--all", "--to-revision", "1", "--yes")
    assert code == 0, out
    assert "already on revision 1: left alone" in out
    assert [kw["service"] for op, kw in world.model.calls[calls:] if op == "UpdateService"] == [
        units[1].service,
        units[2].service,
    ]
    assert all(world.revision_of(u) == "1" for u in units)


def test_rollback_dry_run_shows_from_and_to_and_changes_nothing(world, run_cli):
    units = _fleet(world, per_cell=1)
    _deploy(world, units, policy="Retain")
    new = _td(world, units[0])
    code, out = run_cli("rollback", "--unit", "cell0-unit0", "--dry-run")
    assert code == 0, out
    assert f"{units[0].family}:2 (revision 2)" in out and f"{units[0].family}:1 (revision 1)" in out
    assert "drift" in out and "revert the change in git" in out
    assert _td(world, units[0]) == new


def test_rollback_without_confirmation_is_refused_when_stdin_is_not_a_terminal(world, run_cli):
    units = _fleet(world, per_cell=1)
    _deploy(world, units)
    new = _td(world, units[0])
    code, out = run_cli("rollback", "--all")
    assert code == 1 and "refusing to roll back 1 unit(s)" in out
    assert _td(world, units[0]) == new


def test_rollback_of_a_cell_moves_only_that_cell_back(world, run_cli):
    a, b = _fleet(world, per_cell=2)
    c = world.add_unit(cell=1, index=0)
    _deploy(world, [a, b, c])
    code, out = run_cli("rollback", "--cell", "cell0", "--yes", "--units-per-wave", "1")
    assert code == 0, out
    assert [world.revision_of(u) for u in (a, b, c)] == ["1", "1", "2"]


def test_rollback_without_an_earlier_task_definition_is_refused(world, run_cli):
    world.add_unit(cell=0, index=0)
    code, out = run_cli("rollback", "--unit", "cell0-unit0", "--yes")
    assert code == 1
    assert "no earlier task definition" in out and "cdk deploy" in out


def test_a_retained_revision_identical_to_the_current_one_is_no_rollback_target(world, run_cli):
    """A deploy that re-registers the same content (e.g. a tag-only change) leaves an identical
    revision behind; going back to it would change nothing."""
    units = _fleet(world, per_cell=1)
    _deploy(world, units, revision="2", policy="Retain")
    _deploy(world, units, revision="2", policy="Retain")
    code, out = run_cli("rollback", "--all", "--dry-run")
    assert code == 0, out
    assert f"{units[0].family}:1 (revision 1)" in out


def test_a_rollback_survives_the_next_cdk_deploy_only_when_the_template_changes_nothing(world, run_cli):
    """What the runbook says about drift: CloudFormation leaves a service it does not update alone,
    and a deploy that changes the task definition replaces the rolled-back revision."""
    units = _fleet(world, per_cell=1)
    _deploy(world, units)
    assert run_cli("rollback", "--all", "--yes")[0] == 0
    assert world.revision_of(units[0]) == "1"
    _deploy(world, units, revision="3")
    assert world.revision_of(units[0]) == "3"
    env = world.model.task_defs[_td(world, units[0])].env()
    assert env[contract.ENV_REVISION] == "3"


def test_rollback_from_where_no_node_answers_changes_nothing_and_says_where_to_run(world, run_cli, monkeypatch):
    """Outside the VPC no wave could ever be seen ready: refuse before the first UpdateService."""
    import ops.fleet

    units = _fleet(world, per_cell=2)
    _deploy(world, units)
    monkeypatch.setattr(ops.fleet, "fetch_health", lambda address, timeout_s: (None, f"http://{address}: timed out"))
    code, out = run_cli("rollback", "--all", "--yes")
    assert code == 4
    assert "no node answers /health/ready from here" in out and "nothing was changed" in " ".join(out.split())
    assert all(world.revision_of(u) == "2" for u in units)
    code, out = run_cli("rollback", "--all", "--dry-run")  # planning still works from anywhere
    assert code == 0 and "2 unit(s) in 2 wave(s)" in out
