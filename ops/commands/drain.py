"""`flotilla drain-unit` / `flotilla restore-unit`: take one unit out of service and bring it back.

Draining scales the unit's ECS service to 0: ECS deregisters its members from Cloud Map and sends
SIGTERM; each node stops taking work, finishes in-flight requests and exits, and the router routes
around it. A service tag marks the unit as drained on purpose, so `status` does not page for it
and restore-unit knows to bring it back.
"""

from __future__ import annotations

import argparse

from rich.console import Console

from ops.aws import Aws, clients_for
from ops.commands import Subparsers
from ops.commands.common import add_confirm_options, confirmed, fleet_from_args, wait_until
from ops.errors import Refused
from ops.fleet import DRAINED_IN_CONFIG_TAG, DRAINED_TAG, live_tasks


def add_parser(sub: Subparsers) -> list[argparse.ArgumentParser]:
    d = sub.add_parser(
        "drain-unit",
        help="take a unit out of service: finish in-flight work, stop its nodes",
        description="Scale a unit's ECS service to 0 after its members finish in-flight requests "
        "(SIGTERM drain). Dry run unless confirmed.",
    )
    d.add_argument("unit", help="unit id, e.g. cell0-unit3")
    d.add_argument("--force", action="store_true", help="drain even if it leaves no other ready unit")
    d.add_argument(
        "--wait",
        type=float,
        default=0,
        metavar="SECONDS",
        help="wait up to this long for every member to finish its in-flight requests and stop (default: don't wait)",
    )
    add_confirm_options(d)
    d.set_defaults(handler=run_drain)
    r = sub.add_parser(
        "restore-unit",
        help="bring a drained unit back to its node count",
        description="Scale a drained unit's ECS service back to its nodes_per_unit. Dry run unless confirmed.",
    )
    r.add_argument("unit", help="unit id, e.g. cell0-unit3")
    r.add_argument(
        "--wait",
        type=float,
        default=0,
        metavar="SECONDS",
        help="wait up to this long for the members to run (default: don't wait)",
    )
    add_confirm_options(r)
    r.set_defaults(handler=run_restore)
    return [d, r]


def wait_for_running(aws: Aws, *, cluster: str, service: str, want: int, timeout_s: float, console: Console) -> None:
    """Poll the service until runningCount == want (progress bar; OpsError on timeout)."""

    def check() -> tuple[bool, str]:
        svc = aws.ecs.describe_services(cluster=cluster, services=[service])["services"][0]
        return svc.get("runningCount", 0) == want, f"running {svc.get('runningCount', 0)}"

    wait_until(check, timeout_s=timeout_s, description=f"{service}: running -> {want}", console=console)


def wait_for_stopped(aws: Aws, *, cluster: str, service: str, timeout_s: float, console: Console) -> None:
    """Poll until no task of the service is left that has not STOPPED: every member has drained and
    exited (runningCount alone reaches 0 while they still drain: live_tasks)."""

    def check() -> tuple[bool, str]:
        svc = aws.ecs.describe_services(cluster=cluster, services=[service])["services"][0]
        busy = len(live_tasks(aws, cluster, serviceName=service))
        running = svc.get("runningCount", 0)
        return running == 0 and busy == 0, f"running {running}, {busy} not stopped yet (draining)"

    wait_until(check, timeout_s=timeout_s, description=f"{service}: members stopping", console=console)


def run_drain(args: argparse.Namespace, console: Console) -> int:
    aws = clients_for(args)
    fleet = fleet_from_args(args, aws)
    unit = fleet.unit(args.unit)
    if unit.desired == 0:
        console.print(f"{unit.unit_id} is already drained (desired count 0)")
        return 0
    others = [u for u in fleet.units if u.unit_id != unit.unit_id and u.ready]
    console.print(f"drain-unit {unit.unit_id} ({unit.cell_id}, service {unit.service_name}):")
    console.print(f"  1. set desired count {unit.desired} -> 0 and tag {DRAINED_TAG}={unit.desired}")
    console.print(
        "  2. ECS deregisters the members from Cloud Map and sends SIGTERM; each node reports "
        "'draining', finishes in-flight requests and exits"
    )
    console.print(f"  3. the router routes around it: {len(others)} other ready unit(s) keep serving")
    console.print(
        "  note: a later `cdk deploy` that updates this unit's service sets its desired count back "
        f"to {unit.nodes_per_unit}: to keep it drained, add {unit.unit_id} to drained_units in the config "
        "and deploy"
    )
    if not others and not args.force:
        raise Refused(
            f"{unit.unit_id} is the last ready unit: draining it stops all serving; pass --force "
            "if that is what you want"
        )
    if not confirmed(args, console, f"drain {unit.unit_id}"):
        return 0
    aws.ecs.tag_resource(resourceArn=unit.service_arn, tags=[{"key": DRAINED_TAG, "value": str(unit.desired)}])
    aws.ecs.update_service(cluster=unit.cluster_arn, service=unit.service_name, desiredCount=0)
    console.print(f"{unit.unit_id}: desired count 0; members are draining")
    if args.wait:
        wait_for_stopped(aws, cluster=unit.cluster_arn, service=unit.service_name, timeout_s=args.wait, console=console)
        console.print(f"{unit.unit_id}: drained (every member finished its in-flight requests and stopped)")
    return 0


def run_restore(args: argparse.Namespace, console: Console) -> int:
    aws = clients_for(args)
    fleet = fleet_from_args(args, aws, health=False)
    unit = fleet.unit(args.unit)
    # The task definition's FLOTILLA_NODES_PER_UNIT, not the tag: a unit of any other size cannot form.
    want = unit.nodes_per_unit
    if DRAINED_IN_CONFIG_TAG in unit.tags:
        raise Refused(
            f"{unit.unit_id} is drained in the config (drained_units): remove it there and deploy; "
            "restoring it here would last only until the next deploy"
        )
    if unit.desired == want and DRAINED_TAG not in unit.tags:
        console.print(f"{unit.unit_id} is not drained (desired count {unit.desired})")
        return 0
    console.print(
        f"restore-unit {unit.unit_id}: set desired count {unit.desired} -> {want}, remove tag "
        f"{DRAINED_TAG}; the members rendezvous and the router adds the unit once it is ready"
    )
    if not confirmed(args, console, f"restore {unit.unit_id}"):
        return 0
    aws.ecs.update_service(cluster=unit.cluster_arn, service=unit.service_name, desiredCount=want)
    aws.ecs.untag_resource(resourceArn=unit.service_arn, tagKeys=[DRAINED_TAG])
    console.print(f"{unit.unit_id}: desired count {want}")
    if args.wait:
        wait_for_running(
            aws, cluster=unit.cluster_arn, service=unit.service_name, want=want, timeout_s=args.wait, console=console
        )
        console.print(
            f"{unit.unit_id}: {want} members running; `flotilla status --unit {unit.unit_id}` shows when it is ready"
        )
    return 0
