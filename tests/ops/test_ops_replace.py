"""`flotilla replace-node`: drain the node's container instance, then mark the instance Unhealthy
so its Auto Scaling group replaces it; dry run and refusal by default."""

from __future__ import annotations


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


def test_replace_with_yes_drains_the_container_instance_and_marks_it_unhealthy(aws, fleet, run_cli):
    unit = fleet.add_unit(cell=0, index=0)
    fleet.add_unit(cell=0, index=1)
    node = unit.nodes[0]
    code, out = run_cli("replace-node", node.instance_id, "--yes")
    assert code == 0, out
    assert _state(aws, unit, node) == ("DRAINING", "Unhealthy")
    other = unit.nodes[1]
    assert _state(aws, unit, other) == ("ACTIVE", "Healthy")


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
