"""`flotilla rollout status`: where a unit rollout stands (rollback is ops/commands/rollback.py).

A rollout moves cell by cell (CloudFormation deploys Cell-0, then Cell-1, ...). Within a unit the
ECS deployment replaces every member; a unit never mixes revisions, so members that report two
revisions mean the unit is mid-rollout. The router's own blue/green rollback is the front door's
(docs/runbooks/rollback.md); this module covers the units.
"""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console
from rich.table import Table

import contract
from ops.aws import clients_for
from ops.commands import Subparsers
from ops.commands.common import fleet_from_args, select, wait_until
from ops.fleet import Fleet, Unit, arn_name, router_services

COMPLETED, IN_PROGRESS, FAILED = "COMPLETED", "IN_PROGRESS", "FAILED"


def add_parser(sub: Subparsers) -> list[argparse.ArgumentParser]:
    r = sub.add_parser("rollout", help="unit rollouts: `rollout status`")
    rsub = r.add_subparsers(dest="rollout_command", required=True, metavar="SUBCOMMAND")
    s = rsub.add_parser(
        "status",
        help="per cell and unit: ECS deployments, revisions on the members",
        description="Show each unit's ECS deployments and the revisions its members report. "
        "Exit status 1 when a deployment failed (or --wait ran out).",
    )
    s.add_argument("--cell", help="only this cell")
    s.add_argument(
        "--wait", type=float, default=0, metavar="SECONDS", help="wait up to this long for every rollout to finish"
    )
    s.set_defaults(handler=run_status)

    return [s]


# --- rollout status -------------------------------------------------------------------------------
def rollout_state(u: Unit) -> str:
    if any(d.get("rolloutState") == FAILED for d in u.deployments):
        return FAILED
    primary = [d for d in u.deployments if d.get("status") == "PRIMARY"]
    if len(u.deployments) > 1 or any(d.get("rolloutState") == IN_PROGRESS for d in primary):
        return IN_PROGRESS
    reported = {str(n.health.get(contract.ATTR_REVISION)) for n in u.nodes if n.health}
    if reported and reported != {u.revision}:
        return IN_PROGRESS
    return COMPLETED


def render_status(fleet: Fleet, units: list[Unit], console: Console) -> dict[str, int]:
    counts = {COMPLETED: 0, IN_PROGRESS: 0, FAILED: 0}
    for cell in fleet.cells:
        cell_units = [u for u in units if u.cell_id == cell]
        if not cell_units:
            continue
        revisions = sorted({u.revision for u in cell_units})
        t = Table(title=f"{cell}: revision {', '.join(revisions)}", title_justify="left")
        for col in ("unit", "rollout", "task definition", "revision", "members report", "deployments"):
            t.add_column(col)
        for u in cell_units:
            state = rollout_state(u)
            counts[state] += 1
            style = {COMPLETED: "green", IN_PROGRESS: "yellow", FAILED: "red"}[state]
            reported = sorted({str(n.health.get(contract.ATTR_REVISION)) for n in u.nodes if n.health})
            deps = (
                "; ".join(
                    f"{d.get('status', '?')} {arn_name(d.get('taskDefinition', '?'))} {d.get('rolloutState', '?')} "
                    f"{d.get('runningCount', '?')}/{d.get('desiredCount', '?')}"
                    for d in u.deployments
                )
                or "-"
            )
            t.add_row(
                u.unit_id,
                f"[{style}]{state}[/]",
                arn_name(u.task_definition_arn),
                u.revision,
                ", ".join(reported) or "-",
                deps,
            )
        console.print(t)
    return counts


def run_status(args: argparse.Namespace, console: Console) -> int:
    aws = clients_for(args)

    def look() -> tuple[Fleet, list[Unit]]:
        fleet = fleet_from_args(args, aws)
        units = select(fleet, cell=args.cell)
        return fleet, units

    fleet, units = look()
    if not units:
        console.print(f"[red]no units found for deployment {args.deployment!r}[/]")
        return 1
    if args.wait:

        def check() -> tuple[bool, str]:
            nonlocal fleet, units  # the last look is what gets rendered once the wait is over
            fleet, units = look()
            states = [rollout_state(u) for u in units]
            if FAILED in states:
                return True, "a deployment FAILED"
            busy = states.count(IN_PROGRESS)
            return busy == 0, f"{busy} unit(s) in progress"

        wait_until(check, timeout_s=args.wait, description="rollout", console=console, poll_s=10.0)
    counts = render_status(fleet, units, console)
    router_failed = render_router(router_services(aws, args.deployment), console)
    console.print(f"{counts[COMPLETED]} completed, {counts[IN_PROGRESS]} in progress, {counts[FAILED]} failed")
    return 1 if counts[FAILED] or router_failed else 0


def render_router(services: list[dict[str, Any]], console: Console) -> bool:
    """The router's deployments (ECS native blue/green); True when one FAILED."""
    if not services:
        return False
    t = Table(title="router (blue/green: docs/runbooks/rollback.md)", title_justify="left")
    for col in ("service", "deployment", "status", "task definition", "rollout", "running"):
        t.add_column(col)
    failed = False
    for s in services:
        for d in s.get("deployments", []):
            state = d.get("rolloutState", "?")
            failed |= state == FAILED
            style = {COMPLETED: "green", IN_PROGRESS: "yellow", FAILED: "red"}.get(state, "")
            t.add_row(
                s["serviceName"],
                d.get("id", "?"),
                d.get("status", "?"),
                arn_name(d.get("taskDefinition", "?")),
                f"[{style}]{state}[/]" if style else state,
                f"{d.get('runningCount', '?')}/{d.get('desiredCount', '?')}",
            )
    console.print(t)
    return failed
