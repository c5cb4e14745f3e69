"""`flotilla replace-node`: swap a sick Trainium node for a fresh one, replacement first.

The replacement is launched into the unit's Auto Scaling group (same placement group, subnet and
AZ) with the synchronous LaunchInstances API, so a capacity shortage is known before anything is
touched: then the old node stays and the command says why. Only once the new instance has
registered with ECS is the old node's container instance drained (its task finishes in-flight work
and ECS starts the unit's task on the new instance) and the old instance terminated.
"""

from __future__ import annotations

import argparse
import uuid
from typing import Any

from rich.console import Console

from ops.aws import Aws, clients_for
from ops.commands import Subparsers
from ops.commands.common import add_confirm_options, confirmed, fleet_from_args, wait_until
from ops.diagnose import capacity_message
from ops.errors import OpsError, Refused
from ops.fleet import container_instances, live_tasks


def add_parser(sub: Subparsers) -> list[argparse.ArgumentParser]:
    p = sub.add_parser(
        "replace-node",
        help="launch a replacement for a node, then drain and terminate the node",
        description="Replace one node (EC2 instance) of a unit: launch a replacement in its Auto "
        "Scaling group and wait for it to join the ECS cluster, then drain the node's container "
        "instance and terminate it. If EC2 has no capacity the node is kept. Dry run unless confirmed.",
    )
    p.add_argument("instance_id", help="EC2 instance id of the node, e.g. i-0123456789abcdef0")
    p.add_argument("--force", action="store_true", help="replace even if its unit is the last ready one")
    p.add_argument(
        "--step-timeout",
        type=float,
        default=900.0,
        metavar="SECONDS",
        help="how long the replacement may take to join the cluster, and the node to drain (default %(default)s)",
    )
    p.add_argument(
        "--wait",
        type=float,
        default=0,
        metavar="SECONDS",
        help="then wait up to this long for the unit to be ready again (default: don't wait)",
    )
    add_confirm_options(p)
    p.set_defaults(handler=run)
    return [p]


def _group(aws: Aws, instance_id: str) -> dict[str, Any]:
    found = aws.autoscaling.describe_auto_scaling_instances(InstanceIds=[instance_id])["AutoScalingInstances"]
    if not found:
        raise OpsError(
            f"instance {instance_id} is in no Auto Scaling group: nothing would replace it; "
            "replace it by hand or check the unit's capacity provider"
        )
    name = found[0]["AutoScalingGroupName"]
    (group,) = aws.autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"]
    return dict(group)


def launch_replacement(aws: Aws, group: dict[str, Any], az: str) -> str:
    """One instance into the group, now or not at all (RetryStrategy none: no asynchronous retry
    that would add a node later). The instance ID, or OpsError naming why EC2 would not launch."""
    name = group["AutoScalingGroupName"]
    resp = aws.autoscaling.launch_instances(
        AutoScalingGroupName=name,
        RequestedCapacity=1,
        ClientToken=uuid.uuid4().hex,
        AvailabilityZones=[az],
        RetryStrategy="none",
    )
    ids = [i for batch in resp.get("Instances", []) for i in batch.get("InstanceIds", [])]
    if ids:
        return str(ids[0])
    errors = resp.get("Errors", [])
    text = "; ".join(f"{e.get('ErrorCode', '?')}: {e.get('ErrorMessage', '')}" for e in errors) or "no instance"
    explained = capacity_message(text)
    raise OpsError(
        f"no replacement could be launched in {name} ({explained or text}); the node was not touched "
        "and keeps its place in the unit"
    )


def registered_container_instance(aws: Aws, cluster: str, instance_id: str) -> str | None:
    """The ACTIVE ECS container instance on `instance_id`, once its agent has registered it."""
    for ci in container_instances(aws, cluster, status="ACTIVE"):
        if ci.get("ec2InstanceId") == instance_id:
            return str(ci["containerInstanceArn"])
    return None


def run(args: argparse.Namespace, console: Console) -> int:
    aws = clients_for(args)
    fleet = fleet_from_args(args, aws)
    unit, node = fleet.node(args.instance_id)
    group = _group(aws, args.instance_id)
    name = group["AutoScalingGroupName"]
    az = node.availability_zone or group["AvailabilityZones"][0]
    others = [u for u in fleet.units if u.unit_id != unit.unit_id and u.ready]
    raise_max = group["DesiredCapacity"] + 1 > group["MaxSize"]

    console.print(
        f"replace-node {args.instance_id}: rank {node.rank if node.rank is not None else '?'} "
        f"({node.role}) of {unit.unit_id}, {az}, node state {node.state}"
    )
    if raise_max:
        console.print(
            f"  0. Auto Scaling group {name}: max size {group['MaxSize']} -> {group['MaxSize'] + 1} for the "
            "replacement (set back at the end)"
        )
    console.print(
        f"  1. Auto Scaling group {name}: launch one replacement in {az} (the unit's placement group and "
        "subnet) and wait for it to join the ECS cluster; if EC2 has no capacity, stop here and keep the node"
    )
    console.print(
        f"  2. ECS: container instance of {args.instance_id} -> DRAINING; its task gets SIGTERM, finishes "
        f"in-flight requests and stops, and ECS starts the unit's task on the replacement; {unit.unit_id} "
        f"re-forms while the router routes around it ({len(others)} other ready unit(s))"
    )
    console.print(
        f"  3. once its task has stopped, terminate {args.instance_id} (the group's desired capacity goes back down)"
    )
    if not others and not args.force:
        raise Refused(
            f"{unit.unit_id} is the last ready unit: replacing its node stops all serving until it "
            "re-forms; pass --force if that is what you want"
        )
    if not confirmed(args, console, f"replace {args.instance_id}"):
        return 0
    if raise_max:
        aws.autoscaling.update_auto_scaling_group(AutoScalingGroupName=name, MaxSize=group["MaxSize"] + 1)
    try:
        replace_node(
            args, aws, console, unit_cluster=unit.cluster_arn, group=group, az=az, old=node.container_instance_arn
        )
    finally:
        if raise_max:
            aws.autoscaling.update_auto_scaling_group(AutoScalingGroupName=name, MaxSize=group["MaxSize"])
            console.print(f"{name}: max size back to {group['MaxSize']}")
    if args.wait:

        def check() -> tuple[bool, str]:
            u = fleet_from_args(args, aws, clusters={unit.cluster_arn}).unit(unit.unit_id)
            on_old = any(n.instance_id == args.instance_id for n in u.nodes)
            ready = u.ready and not on_old
            return ready, ("ready" if ready else f"{sum(n.ready for n in u.nodes)}/{u.nodes_per_unit} members ready")

        wait_until(check, timeout_s=args.wait, description=f"{unit.unit_id}: re-forming", console=console, poll_s=10.0)
        console.print(f"{unit.unit_id}: ready again without {args.instance_id}")
    return 0


def replace_node(
    args: argparse.Namespace,
    aws: Aws,
    console: Console,
    *,
    unit_cluster: str,
    group: dict[str, Any],
    az: str,
    old: str | None,
) -> None:
    name = group["AutoScalingGroupName"]
    new = launch_replacement(aws, group, az)
    console.print(f"{name}: launched {new}; waiting for it to join the cluster")

    def joined() -> tuple[bool, str]:
        ci = registered_container_instance(aws, unit_cluster, new)
        return ci is not None, ("registered" if ci else "booting")

    try:
        wait_until(joined, timeout_s=args.step_timeout, description=f"{new}: joining", console=console, poll_s=10.0)
    except OpsError:
        # Keep the unit as it was: the node still serves (or limps); the replacement goes.
        aws.autoscaling.terminate_instance_in_auto_scaling_group(InstanceId=new, ShouldDecrementDesiredCapacity=True)
        raise OpsError(
            f"the replacement {new} did not join the ECS cluster within {args.step_timeout:.0f}s and was "
            f"terminated; {args.instance_id} was not touched (check the instance's console output and "
            "the ECS agent)"
        ) from None
    if old is not None:
        aws.ecs.update_container_instances_state(cluster=unit_cluster, containerInstances=[old], status="DRAINING")
        console.print(f"{args.instance_id}: draining")

        def drained() -> tuple[bool, str]:
            # Draining tasks included: SIGTERM comes in STOPPING (live_tasks).
            busy = len(live_tasks(aws, unit_cluster, containerInstance=old))
            return busy == 0, f"{busy} task(s) not stopped yet"

        wait_until(drained, timeout_s=args.step_timeout, description=f"{args.instance_id}: draining", console=console)
    # Scale-in protection does not stop this call ("Instance scale-in protection does not protect
    # Auto Scaling instances from ... Manual termination through the terminate-instance-in-auto-scaling-group
    # command" — Auto Scaling user guide, ec2-auto-scaling-instance-protection.html).
    aws.autoscaling.terminate_instance_in_auto_scaling_group(
        InstanceId=args.instance_id, ShouldDecrementDesiredCapacity=True
    )
    console.print(f"{args.instance_id}: terminating; {new} takes its place")
