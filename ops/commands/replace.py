"""`flotilla replace-node`: swap a sick Trainium node for a fresh one.

ECS drains the node's container instance (its task gets SIGTERM and drains), then Auto Scaling
marks the instance unhealthy, which terminates it and launches a replacement in the unit's
placement group (health replacement goes ahead despite scale-in protection). The unit is not ready
from the first step until the replacement has joined and the unit has re-formed.
"""

from __future__ import annotations

import argparse

from rich.console import Console

from ops.aws import clients_for
from ops.commands import Subparsers
from ops.commands.common import add_confirm_options, confirmed, fleet_from_args, wait_until
from ops.errors import OpsError, Refused


def add_parser(sub: Subparsers) -> list[argparse.ArgumentParser]:
    p = sub.add_parser(
        "replace-node",
        help="drain a node's task and have Auto Scaling replace its instance",
        description="Replace one node (EC2 instance) of a unit: drain its ECS container instance, "
        "then mark it unhealthy so its Auto Scaling group launches a replacement. "
        "Dry run unless confirmed.",
    )
    p.add_argument("instance_id", help="EC2 instance id of the node, e.g. i-0123456789abcdef0")
    p.add_argument("--force", action="store_true", help="replace even if its unit is the last ready one")
    p.add_argument(
        "--wait",
        type=float,
        default=0,
        metavar="SECONDS",
        help="wait up to this long for the unit to be ready again (default: don't wait)",
    )
    add_confirm_options(p)
    p.set_defaults(handler=run)
    return [p]


def run(args: argparse.Namespace, console: Console) -> int:
    aws = clients_for(args)
    fleet = fleet_from_args(args, aws)
    unit, node = fleet.node(args.instance_id)
    asg = aws.autoscaling.describe_auto_scaling_instances(InstanceIds=[args.instance_id])["AutoScalingInstances"]
    if not asg:
        raise OpsError(
            f"instance {args.instance_id} is in no Auto Scaling group: nothing would replace it; "
            "replace it by hand or check the unit's capacity provider"
        )
    group = asg[0]["AutoScalingGroupName"]
    others = [u for u in fleet.units if u.unit_id != unit.unit_id and u.ready]

    console.print(
        f"replace-node {args.instance_id}: rank {node.rank if node.rank is not None else '?'} "
        f"({node.role}) of {unit.unit_id}, {node.availability_zone or '?'}, node state {node.state}"
    )
    console.print(
        f"  1. ECS: container instance -> DRAINING; the task gets SIGTERM and drains; "
        f"{unit.unit_id} stops being ready and the router routes around it "
        f"({len(others)} other ready unit(s))"
    )
    console.print(
        f"  2. Auto Scaling group {group}: instance -> Unhealthy; it is terminated and a replacement "
        "launches in the unit's placement group and subnet"
    )
    console.print(
        f"  3. ECS starts the unit's missing task on the new instance; the {unit.nodes_per_unit} members "
        "rendezvous again (ranks by topology) and the unit becomes ready"
    )
    if not others and not args.force:
        raise Refused(
            f"{unit.unit_id} is the last ready unit: replacing its node stops all serving until it "
            "re-forms; pass --force if that is what you want"
        )
    if not confirmed(args, console, f"replace {args.instance_id}"):
        return 0
    if node.container_instance_arn:
        aws.ecs.update_container_instances_state(
            cluster=unit.cluster_arn, containerInstances=[node.container_instance_arn], status="DRAINING"
        )
    aws.autoscaling.set_instance_health(
        InstanceId=args.instance_id, HealthStatus="Unhealthy", ShouldRespectGracePeriod=False
    )
    console.print(f"{args.instance_id}: draining and marked Unhealthy; Auto Scaling replaces it")
    if args.wait:

        def check() -> tuple[bool, str]:
            u = fleet_from_args(args, aws, clusters={unit.cluster_arn}).unit(unit.unit_id)
            on_old = any(n.instance_id == args.instance_id for n in u.nodes)
            ready = u.ready and not on_old
            return ready, ("ready" if ready else f"{sum(n.ready for n in u.nodes)}/{u.nodes_per_unit} members ready")

        wait_until(check, timeout_s=args.wait, description=f"{unit.unit_id}: re-forming", console=console, poll_s=10.0)
        console.print(f"{unit.unit_id}: ready again without {args.instance_id}")
    return 0
