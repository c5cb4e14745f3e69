"""`flotilla drain-unit` / `flotilla restore-unit`: take a unit, a cell's units or every unit (the
emergency stop) out of service, and bring them back.

Draining scales the unit's ECS service to 0: ECS deregisters its members from Cloud Map and sends
SIGTERM; each node stops taking work, finishes in-flight requests and exits, and the router routes
around it. A service tag marks the unit as drained on purpose, so `status` does not page for it
and restore-unit knows to bring it back.
"""

from __future__ import annotations

import argparse
import time

from rich.console import Console

from ops.aws import Aws, clients_for
from ops.commands import Subparsers
from ops.commands.common import add_confirm_options, cell_id, confirmed, fleet_from_args, select, wait_until
from ops.errors import OpsError, Refused
from ops.fleet import DRAINED_IN_CONFIG_TAG, DRAINED_TAG, Fleet, Unit, live_tasks


def _add_selection(p: argparse.ArgumentParser, verb: str) -> None:
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("unit", nargs="?", help=f"the unit to {verb}, e.g. cell0-unit3")
    which.add_argument("--cell", type=cell_id, metavar="CELL", help=f"{verb} every unit of this cell (cell0 or 0)")
    which.add_argument("--all", action="store_true", help=f"{verb} every unit of the deployment")


def add_parser(sub: Subparsers) -> list[argparse.ArgumentParser]:
    d = sub.add_parser(
        "drain-unit",
        help="take a unit (or a cell, or every unit: an emergency stop) out of service",
        description="Scale units' ECS services to 0 after their members finish in-flight requests "
        "(SIGTERM drain): one unit, every unit of a cell (--cell), or every unit (--all, the emergency stop "
        "of docs/runbooks/emergency-stop.md). Dry run unless confirmed.",
    )
    _add_selection(d, "drain")
    d.add_argument(
        "--force",
        action="store_true",
        help="drain even if it leaves no other ready unit (--all needs no --force: stopping every unit is its purpose)",
    )
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
        help="bring drained units back to their node count",
        description="Scale drained units' ECS services back to their nodes_per_unit: one unit, every drained unit "
        "of a cell (--cell) or of the deployment (--all). Dry run unless confirmed.",
    )
    _add_selection(r, "restore")
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


def selected(fleet: Fleet, args: argparse.Namespace) -> list[Unit]:
    """The units args names: one (OpsError naming the known ones if unknown), a cell's, or all."""
    if args.unit:
        return [fleet.unit(args.unit)]
    if args.cell:
        if args.cell not in fleet.cells:
            raise OpsError(
                f"cell {args.cell!r} not found in deployment {fleet.deployment!r} "
                f"(cells: {', '.join(fleet.cells) or 'none'})"
            )
        return select(fleet, cell=args.cell)
    return list(fleet.units)


def what(args: argparse.Namespace, units: list[Unit]) -> str:
    if args.unit:
        return units[0].unit_id
    return f"{len(units)} unit(s) of {args.cell}" if args.cell else f"all {len(units)} unit(s)"


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
    chosen = selected(fleet, args)
    units = [u for u in chosen if u.desired > 0]
    if not units:
        console.print(f"{what(args, chosen)}: already drained (desired count 0)")
        return 0
    names = {u.unit_id for u in units}
    others = [u for u in fleet.units if u.unit_id not in names and u.ready]
    console.print(f"drain-unit {what(args, units)}:")
    for u in units:
        console.print(f"  {u.unit_id} ({u.cell_id}, service {u.service_name}): set desired count {u.desired} -> 0")
    console.print(f"  1. set those desired counts to 0 and tag each service {DRAINED_TAG}=<its desired count>")
    console.print(
        "  2. ECS deregisters the members from Cloud Map and sends SIGTERM; each node reports "
        "'draining', finishes in-flight requests and exits"
    )
    console.print(f"  3. the router routes around them: {len(others)} other ready unit(s) keep serving")
    listed = ", ".join(sorted(names)) if len(names) <= 5 else f"these {len(names)} units"
    console.print(
        "  note: a later `cdk deploy` that updates a unit's service sets its desired count back to "
        f"nodes_per_unit: to keep them drained, add {listed} to drained_units in the config and deploy"
    )
    if not others and not (args.force or args.all):
        lead = f"{args.unit} is the last ready unit: draining it" if args.unit else f"draining {what(args, units)}"
        raise Refused(f"{lead} stops all serving; pass --force if that is what you want")
    if not confirmed(args, console, f"drain {what(args, units)}"):
        return 0
    for u in units:
        aws.ecs.tag_resource(resourceArn=u.service_arn, tags=[{"key": DRAINED_TAG, "value": str(u.desired)}])
        aws.ecs.update_service(cluster=u.cluster_arn, service=u.service_name, desiredCount=0)
        console.print(f"{u.unit_id}: desired count 0; members are draining")
    if args.wait:
        deadline = time.monotonic() + args.wait  # one budget for all: they drain at the same time
        for u in units:
            left = max(0.0, deadline - time.monotonic())
            wait_for_stopped(aws, cluster=u.cluster_arn, service=u.service_name, timeout_s=left, console=console)
            console.print(f"{u.unit_id}: drained (every member finished its in-flight requests and stopped)")
    return 0


def run_restore(args: argparse.Namespace, console: Console) -> int:
    aws = clients_for(args)
    fleet = fleet_from_args(args, aws, health=False)
    chosen = selected(fleet, args)
    in_config = [u for u in chosen if DRAINED_IN_CONFIG_TAG in u.tags]
    if args.unit and in_config:
        raise Refused(
            f"{args.unit} is drained in the config (drained_units): remove it there and deploy; "
            "restoring it here would last only until the next deploy"
        )
    # The task definition's FLOTILLA_NODES_PER_UNIT, not the tag: a unit of any other size cannot form.
    units = [u for u in chosen if u not in in_config and (u.desired != u.nodes_per_unit or DRAINED_TAG in u.tags)]
    for u in in_config:
        console.print(f"{u.unit_id}: drained in the config (drained_units): left drained; remove it there and deploy")
    if not units:
        console.print(f"{what(args, chosen)}: not drained (desired count = nodes per unit)")
        return 0
    for u in units:
        console.print(
            f"restore-unit {u.unit_id}: set desired count {u.desired} -> {u.nodes_per_unit}, remove tag "
            f"{DRAINED_TAG}; the members rendezvous and the router adds the unit once it is ready"
        )
    if not confirmed(args, console, f"restore {what(args, units)}"):
        return 0
    for u in units:
        aws.ecs.update_service(cluster=u.cluster_arn, service=u.service_name, desiredCount=u.nodes_per_unit)
        aws.ecs.untag_resource(resourceArn=u.service_arn, tagKeys=[DRAINED_TAG])
        console.print(f"{u.unit_id}: desired count {u.nodes_per_unit}")
    if args.wait:
        deadline = time.monotonic() + args.wait
        for u in units:
            wait_for_running(
                aws,
                cluster=u.cluster_arn,
                service=u.service_name,
                want=u.nodes_per_unit,
                timeout_s=max(0.0, deadline - time.monotonic()),
                console=console,
            )
            console.print(
                f"{u.unit_id}: {u.nodes_per_unit} members running; `flotilla status --unit {u.unit_id}` shows "
                "when it is ready"
            )
    return 0
