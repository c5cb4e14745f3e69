"""`flotilla status`: every cell, unit and node with rank, role, revision, readiness and load.

Exit status 1 when any unit is not ready (drained units excepted) or no unit is found, so a
script or an alarm runbook can branch on it.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.console import Console
from rich.table import Table

from ops.commands import Subparsers
from ops.commands.common import fleet_from_args, select
from ops.fleet import Node, Unit


def add_parser(sub: Subparsers) -> list[argparse.ArgumentParser]:
    p = sub.add_parser(
        "status",
        help="cells, units and nodes: rank, role, revision, readiness, load",
        description="Show every unit of the deployment from ECS, Cloud Map and the nodes' "
        "/health/ready. Exit status 1 when anything is not ready.",
    )
    p.add_argument("--cell", help="only this cell, e.g. cell0")
    p.add_argument("--unit", help="only this unit, e.g. cell0-unit3")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument(
        "--no-health",
        action="store_true",
        help="do not call the nodes' /health/ready (from outside the VPC): judge by ECS and Cloud Map "
        "only; rank, role, readiness and load are then unknown",
    )
    p.set_defaults(handler=run)
    return [p]


def unit_state(u: Unit) -> str:
    if u.drained:
        return "DRAINED"
    return "READY" if u.ready else "NOT READY"


def _load(n: Node) -> tuple[str, str, str]:
    ld = (n.health or {}).get("load") or {}
    if not ld:
        return "-", "-", "-"
    kv = ld.get("kv_cache_used")
    return (
        str(ld.get("queue_depth", "-")),
        f"{ld.get('running', '-')}/{ld.get('max_running', '-')}",
        f"{kv * 100:.0f}%" if isinstance(kv, (int, float)) else "-",
    )


def render(units: list[Unit], console: Console) -> None:
    cells = list(dict.fromkeys(u.cell_id for u in units))  # units come sorted by cell, then unit
    for cell in cells:
        in_cell = [u for u in units if u.cell_id == cell]
        t = Table(title=f"{cell}: {sum(u.ready for u in in_cell)}/{len(in_cell)} units ready", title_justify="left")
        for col in (
            "unit",
            "state",
            "revision",
            "rank",
            "role",
            "instance",
            "AZ",
            "node",
            "ready",
            "queue",
            "running",
            "kv cache",
            "cloud map",
        ):
            t.add_column(col)
        for u in in_cell:
            state = unit_state(u)
            style = {"READY": "green", "NOT READY": "red", "DRAINED": "yellow"}[state]
            if not u.nodes:
                t.add_row(u.unit_id, f"[{style}]{state}[/]", u.revision, *["-"] * 10)
            for i, n in enumerate(u.nodes):
                rev = str((n.health or {}).get("revision", u.revision))
                queue, running, kv = _load(n)
                t.add_row(
                    u.unit_id if i == 0 else "",
                    f"[{style}]{state}[/]" if i == 0 else "",
                    rev,
                    str(n.rank) if n.rank is not None else "?",
                    n.role,
                    n.instance_id or "-",
                    n.availability_zone or "-",
                    n.state,
                    "yes" if n.ready else "no",
                    queue,
                    running,
                    kv,
                    "yes" if n.registered else "no",
                )
        console.print(t)
    for u in units:
        for p in u.problems():
            console.print(f"[red]{u.unit_id}[/]: {p}", highlight=False)


def as_json(units: list[Unit]) -> list[dict[str, Any]]:
    return [
        {
            "cell": u.cell_id,
            "unit": u.unit_id,
            "state": unit_state(u),
            "revision": u.revision,
            "service": u.service_name,
            "desired": u.desired,
            "problems": u.problems(),
            "nodes": [
                {
                    "rank": n.rank,
                    "role": n.role,
                    "instance_id": n.instance_id,
                    "task": n.task_id,
                    "availability_zone": n.availability_zone,
                    "address": n.address,
                    "registered": n.registered,
                    "state": n.state,
                    "ready": n.ready,
                    "health": n.health,
                    "error": n.health_error,
                    "reported_by": n.reported_by,
                }
                for n in u.nodes
            ],
        }
        for u in units
    ]


def run(args: argparse.Namespace, console: Console) -> int:
    fleet = fleet_from_args(args, health=not args.no_health)
    units = select(fleet, cell=args.cell, unit=args.unit)
    if args.json:
        console.print_json(json.dumps(as_json(units)))
    elif units:
        render(units, console)
    if not units:
        where = f" in cell {args.cell}" if args.cell else ""
        console.print(
            f"[red]no units found{where} for deployment {args.deployment!r}[/] (ECS clusters tagged "
            f"flotilla:deployment={args.deployment}, named {args.deployment}-cell<n>; is "
            "--deployment/--region right?)"
        )
        return 1
    bad = [u for u in units if u.problems()]
    ready = sum(1 for u in units if u.ready)
    drained = sum(1 for u in units if u.drained)
    if not args.json:
        console.print(
            f"{ready}/{len(units)} units ready"
            + (f", {drained} drained" if drained else "")
            + (f", [red]{len(bad)} not ready[/]" if bad else "")
        )
    return 1 if bad else 0
