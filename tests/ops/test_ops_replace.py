"""`flotilla replace-node`: a replacement is launched and joins the cluster before the node is
drained and terminated, or, without capacity, the node is kept; dry run and refusal by default.
The replacements run on the ECS model and the capacity-aware Auto Scaling stand-in (ecs_world.py)."""

from __future__ import annotations

import pytest


def _state(aws, unit, node) -> tuple[str, str]:
    ci = aws.ecs.describe_container_instances(
        cluster=unit.cluster_arn, containerInstances=[node.container_instance_arn]
    )["containerInstances"][0]
    asg = aws.autoscaling.describe_auto_scaling_instances(InstanceIds=[node.instance_id])["AutoScalingInstances"][0]
    return ci["status"], asg["HealthStatus"]


def test_dry_run_names_the_unit_rank_and_auto_scaling_group_and_changes_nothing(aws, fleet, run_cli):
    unit = fleet.add_unit(cell=0, index=0)
    fleet.add_unit(cell=0, index=1)
    node = unit.nodes[1]
    code, out = run_cli("replace-node", node.instance_id, "--dry-run")
    assert code == 0, out
    assert f"replace-node {node.instance_id}: rank 1 (follower) of cell0-unit0" in out
    assert f"Auto Scaling group {unit.asg_name}" in out
    assert "dry run: nothing changed" in out
    assert _state(aws, unit, node) == ("ACTIVE", "Healthy")


def test_replace_without_confirmation_is_refused_when_stdin_is_not_a_terminal(aws, fleet, run_cli):
    unit = fleet.add_unit(cell=0, index=0)
    fleet.add_unit(cell=0, index=1)
    code, out = run_cli("replace-node", unit.nodes[0].instance_id)
    assert code == 1
    assert "refusing to replace" in out and "--yes" in out
    assert _state(aws, unit, unit.nodes[0]) == ("ACTIVE", "Healthy")


def _ci(world, instance_id):
    return next(ci for ci in world.model.instances.values() if ci.ec2_instance_id == instance_id)


def _group(world, unit):
    (g,) = world.aws.autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[unit.asg])["AutoScalingGroups"]
    return g


@pytest.mark.parametrize("rollout", ["surge", "replace"])
def test_replace_launches_and_registers_the_replacement_before_draining_the_node(world, run_cli, rollout):
    unit = world.add_unit(cell=0, index=0, rollout=rollout)
    world.add_unit(cell=0, index=1)
    old = world.running_instances(unit)[0]
    max_before = _group(world, unit)["MaxSize"]
    code, out = run_cli("replace-node", old, "--yes", "--wait", "60", "--step-timeout", "60")
    assert code == 0, out
    assert f"{unit.unit_id}: ready again without {old}" in out
    asg_calls = [op for op, _ in world.aws.autoscaling.calls]
    ecs_calls = [(op, kw) for op, kw in world.model.calls if op == "UpdateContainerInstancesState"]
    assert asg_calls.index("LaunchInstances") < asg_calls.index("TerminateInstanceInAutoScalingGroup")
    (launched,) = [kw for op, kw in world.aws.autoscaling.calls if op == "LaunchInstances"]
    assert launched["RetryStrategy"] == "none" and launched["AvailabilityZones"] == ["us-east-1a"]
    assert ecs_calls and ecs_calls[0][1]["status"] == "DRAINING"
    # the old node's task had stopped (drained) before its instance was terminated
    old_tasks = [t for t in world.model.tasks.values() if world.instance_of(t) == old]
    assert old_tasks and all(t.stop_code == "ServiceSchedulerInitiated" for t in old_tasks)
    assert _ci(world, old).terminated
    new = world.running_instances(unit)
    assert old not in new and len(new) == 2
    g = _group(world, unit)
    assert g["DesiredCapacity"] == 2 and g["MaxSize"] == max_before
    if rollout == "replace":  # max == nodes: raised for the replacement, then set back
        assert f"max size {max_before} -> {max_before + 1}" in out and f"max size back to {max_before}" in out


def test_without_capacity_the_node_is_kept_and_the_error_says_why(world, run_cli):
    unit = world.add_unit(cell=0, index=0, rollout="replace")
    world.add_unit(cell=0, index=1)
    world.aws.autoscaling.capacity["us-east-1a"] = 0
    old = world.running_instances(unit)[0]
    code, out = run_cli("replace-node", old, "--yes", "--wait", "60", "--step-timeout", "60")
    flat = " ".join(out.split())
    assert code == 1
    assert "EC2 has no trn1.32xlarge capacity left in us-east-1a (InsufficientInstanceCapacity)" in flat
    assert "the node was not touched" in flat and "docs/runbooks/capacity-shortage.md" in flat
    assert _ci(world, old).status == "ACTIVE" and not _ci(world, old).terminated
    assert old in world.running_instances(unit)
    assert not any(op == "UpdateContainerInstancesState" for op, _ in world.model.calls)
    g = _group(world, unit)
    assert g["DesiredCapacity"] == 2 and g["MaxSize"] == 2  # the raised max is set back
    code, status = run_cli("status", "--unit", unit.unit_id)
    assert code == 0  # the unit still serves on the kept node


def test_a_replacement_that_never_joins_is_removed_and_the_node_kept(world, run_cli):
    unit = world.add_unit(cell=0, index=0)
    world.add_unit(cell=0, index=1)
    world.boot_ticks = 10**6  # its ECS agent never registers
    old = world.running_instances(unit)[0]
    code, out = run_cli("replace-node", old, "--yes", "--step-timeout", "0.01")
    assert code == 1
    assert "did not join the ECS cluster" in out and f"{old} was not touched" in " ".join(out.split())
    assert _ci(world, old).status == "ACTIVE"
    terminated = [
        kw["InstanceId"] for op, kw in world.aws.autoscaling.calls if op == "TerminateInstanceInAutoScalingGroup"
    ]
    assert len(terminated) == 1 and terminated[0] != old
    assert _group(world, unit)["DesiredCapacity"] == 2


def test_replacing_a_node_of_the_last_ready_unit_needs_force(aws, fleet, run_cli):
    unit = fleet.add_unit(cell=0, index=0)
    code, out = run_cli("replace-node", unit.nodes[0].instance_id, "--yes")
    assert code == 1 and "last ready unit" in out
    assert _state(aws, unit, unit.nodes[0]) == ("ACTIVE", "Healthy")


def test_an_instance_that_runs_no_member_is_reported(aws, fleet, run_cli):
    fleet.add_unit(cell=0, index=0)
    code, out = run_cli("replace-node", "i-0000000000000dead", "--dry-run")
    assert code == 1
    assert "i-0000000000000dead" in out and "runs no member" in out
