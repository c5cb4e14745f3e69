"""`flotilla rollout status` and `flotilla rollback`: where a unit rollout stands, and how to take
units back to their previous task definition, cell by cell.

A rollout moves cell by cell (CloudFormation deploys Cell-0, then Cell-1, ...). Within a unit the
ECS deployment replaces every member; a unit never mixes revisions, so members that report two
revisions mean the unit is mid-rollout. The router's own blue/green rollback is the front door's
(docs/runbooks/rollback.md); this module covers the units.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from rich.console import Console
from rich.table import Table

import contract
from ops.aws import Aws, clients_for
from ops.commands import Subparsers
from ops.commands.common import add_confirm_options, confirmed, fleet_from_args, select, wait_until
from ops.errors import OpsError
from ops.fleet import Fleet, Unit, arn_name, container_env, router_services

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

    b = sub.add_parser(
        "rollback",
        help="put units back on their previous task definition, cell by cell",
        description="Update each selected unit's ECS service to the previous revision of its task "
        "definition family, one cell at a time. Dry run unless confirmed.",
    )
    which = b.add_mutually_exclusive_group(required=True)
    which.add_argument("--unit", action="append", metavar="UNIT", help="a unit (repeatable)")
    which.add_argument("--cell", action="append", metavar="CELL", help="every unit of a cell (repeatable)")
    which.add_argument("--all", action="store_true", help="every unit of the deployment")
    b.add_argument(
        "--wait",
        type=float,
        default=0,
        metavar="SECONDS",
        help="after each cell, wait up to this long for its units to be ready before the next "
        "(default: don't wait; cells are then updated back to back)",
    )
    add_confirm_options(b)
    b.set_defaults(handler=run_rollback)
    return [s, b]


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


# --- rollback -------------------------------------------------------------------------------------
def previous_task_definition(aws: Aws, arn: str) -> str | None:
    """The highest ACTIVE revision of the same family below the current one."""
    family, _, rev = arn_name(arn).rpartition(":")
    current = int(rev)
    arns: list[str] = []
    for page in aws.ecs.get_paginator("list_task_definitions").paginate(familyPrefix=family, status="ACTIVE"):
        arns.extend(page.get("taskDefinitionArns", []))
    older = []
    for a in arns:
        fam, _, r = arn_name(a).rpartition(":")
        if fam == family and re.fullmatch(r"\d+", r) and int(r) < current:
            older.append((int(r), a))
    return max(older)[1] if older else None


def select_units(fleet: Fleet, args: argparse.Namespace) -> list[Unit]:
    if args.all:
        return list(fleet.units)
    if args.unit:
        return [fleet.unit(u) for u in args.unit]
    known = set(fleet.cells)
    for c in args.cell:
        if c not in known:
            raise OpsError(
                f"cell {c!r} not found in deployment {fleet.deployment!r} (cells: {', '.join(fleet.cells) or 'none'})"
            )
    return [u for u in fleet.units if u.cell_id in args.cell]


def run_rollback(args: argparse.Namespace, console: Console) -> int:
    aws = clients_for(args)
    fleet = fleet_from_args(args, aws, health=False)
    units = select_units(fleet, args)
    if not units:
        raise OpsError(f"no units selected in deployment {args.deployment!r}")
    steps: list[tuple[Unit, str, str]] = []
    missing = []
    for u in units:
        prev = previous_task_definition(aws, u.task_definition_arn)
        if prev is None:
            missing.append(u.unit_id)
        else:
            env = container_env(aws.ecs.describe_task_definition(taskDefinition=prev)["taskDefinition"])
            steps.append((u, prev, env.get(contract.ENV_REVISION, "?")))
    if missing:
        raise OpsError(
            f"no earlier ACTIVE task definition to roll back to for {', '.join(missing)}: "
            "deploy the previous revision with `cdk deploy` instead"
        )
    t = Table(title="rollback", title_justify="left")
    for col in ("cell", "unit", "from", "to"):
        t.add_column(col)
    for u, prev, prev_rev in steps:
        t.add_row(
            u.cell_id,
            u.unit_id,
            f"{arn_name(u.task_definition_arn)} (revision {u.revision})",
            f"{arn_name(prev)} (revision {prev_rev})",
        )
    console.print(t)
    cells = [c for c in fleet.cells if any(u.cell_id == c for u, _, _ in steps)]
    console.print(
        f"cell by cell ({' -> '.join(cells)}): each unit's members drain and the unit re-forms on "
        "the old revision; the router routes around units while they re-form. A later `cdk deploy` "
        "puts the template's revision back: revert the config or image in git too."
    )
    if not confirmed(args, console, f"roll back {len(steps)} unit(s)"):
        return 0
    for cell in cells:
        in_cell = [(u, prev) for u, prev, _ in steps if u.cell_id == cell]
        for u, prev in in_cell:
            aws.ecs.update_service(cluster=u.cluster_arn, service=u.service_name, taskDefinition=prev)
            console.print(f"{u.unit_id}: -> {arn_name(prev)}")
        if args.wait:
            ids = {u.unit_id for u, _ in in_cell}
            clusters = {u.cluster_arn for u, _ in in_cell}

            def check() -> tuple[bool, str]:
                now = [u for u in fleet_from_args(args, aws, clusters=clusters).units if u.unit_id in ids]
                states = [rollout_state(u) for u in now]
                if FAILED in states:
                    raise OpsError(f"{cell}: a rollback deployment FAILED; stopping before the next cell")
                ready = sum(1 for u in now if u.ready and rollout_state(u) == COMPLETED)
                return ready == len(ids), f"{ready}/{len(ids)} units ready"

            wait_until(check, timeout_s=args.wait, description=f"{cell}: rolling back", console=console, poll_s=10.0)
    console.print(f"rolled back {len(steps)} unit(s); follow with `flotilla rollout status`")
    return 0
