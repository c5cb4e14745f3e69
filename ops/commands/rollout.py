"""`flotilla rollout status`: where a unit rollout stands (rollback is ops/commands/rollback.py);
`flotilla rollout plan`: the wave size a simulated rollout recommends for an existing config.

A rollout moves cell by cell (CloudFormation deploys Cell-0, then Cell-1, ...). Within a unit the
ECS deployment replaces every member; a unit never mixes revisions, so members that report two
revisions mean the unit is mid-rollout. The router's own blue/green rollback is the front door's
(docs/runbooks/rollback.md); this module covers the units.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from contract.declare import Integer, Number
from ops.aws import clients_for
from ops.commands import Subparsers
from ops.commands.common import add_json_option, cell_id, fleet_from_args, prose_console, select, wait_until
from ops.commands.plan import render_rollout, rollout_dict
from ops.deploy_config import read_config
from ops.errors import check_arg
from ops.fleet import Fleet, Unit, arn_name, router_services
from ops.rollout_sim import FleetModel, Recommendation, Summary, recommend_wave

COMPLETED, IN_PROGRESS, FAILED = "COMPLETED", "IN_PROGRESS", "FAILED"


def add_parser(sub: Subparsers) -> list[argparse.ArgumentParser]:
    r = sub.add_parser("rollout", help="unit rollouts: `rollout status`, `rollout plan` (a wave size for a config)")
    rsub = r.add_subparsers(dest="rollout_command", required=True, metavar="SUBCOMMAND")
    s = rsub.add_parser(
        "status",
        help="per cell and unit: ECS deployments, revisions on the members",
        description="Show each unit's ECS deployments and the revisions its members report. "
        "Exit status 1 when a deployment failed (or --wait ran out).",
    )
    s.add_argument("--cell", type=cell_id, metavar="CELL", help="only this cell (cell0 or 0)")
    s.add_argument(
        "--wait", type=float, default=0, metavar="SECONDS", help="wait up to this long for every rollout to finish"
    )
    add_json_option(s, "each unit's rollout and the router's deployments")
    s.set_defaults(handler=run_status)

    # No AWS options: `rollout plan` reads a config file and simulates; it asks AWS nothing.
    p = rsub.add_parser(
        "plan",
        help="recommend units_per_wave for a flotilla config (simulated fleet rollout; no AWS)",
        description="Read a flotilla config as `cdk synth -c config=PATH` does (over the `flotilla` context "
        "of ./cdk.json when there is one), simulate its fleet rolling (ops/rollout_sim.py) with its units, "
        "nodes per unit, cells and unit_rollout at its current units_per_wave and at candidate wave sizes, "
        "and print the recommended units_per_wave and the config line to change.",
    )
    p.add_argument("--config", required=True, metavar="PATH", help="the flotilla config YAML")
    p.add_argument(
        "--load-minutes",
        type=float,
        default=10.0,
        metavar="MIN",
        help="how long a unit takes to load the model; default %(default)s",
    )
    p.add_argument(
        "--demand",
        type=float,
        default=0.8,
        metavar="SHARE",
        help="demand during the rollout as a share of the whole fleet's capacity (0-1]; default %(default)s",
    )
    p.add_argument(
        "--spare-nodes",
        type=int,
        metavar="N",
        help="surge: Trainium instances available beyond the fleet (a rolling unit needs nodes_per_unit more)",
    )
    p.add_argument(
        "--node-failures-per-day",
        type=float,
        default=0.0,
        metavar="RATE",
        help="failures per node per day to simulate during the rollout; default %(default)s",
    )
    p.add_argument("--json", action="store_true", help="print the recommendation as JSON")
    p.set_defaults(handler=run_plan)

    return [s]


# --- rollout status -------------------------------------------------------------------------------
def rollout_state(u: Unit) -> str:
    if any(d.get("rolloutState") == FAILED for d in u.deployments):
        return FAILED
    primary = [d for d in u.deployments if d.get("status") == "PRIMARY"]
    if len(u.deployments) > 1 or any(d.get("rolloutState") == IN_PROGRESS for d in primary):
        return IN_PROGRESS
    reported = {r.revision for n in u.nodes if (r := n.report) is not None}
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
            reported = sorted({r.revision for n in u.nodes if (r := n.report) is not None})
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

    say = prose_console(args, console)
    fleet, units = look()
    if not units:
        say.print(f"[red]no units found for deployment {args.deployment!r}[/]")
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

        wait_until(check, timeout_s=args.wait, description="rollout", console=say, poll_s=10.0)
    routers = router_services(aws, args.deployment)
    if args.json:
        doc = status_json(units, routers)
        console.print_json(json.dumps(doc, default=str))
        return 1 if doc["failed"] else 0
    counts = render_status(fleet, units, console)
    router_failed = render_router(routers, console)
    console.print(f"{counts[COMPLETED]} completed, {counts[IN_PROGRESS]} in progress, {counts[FAILED]} failed")
    return 1 if counts[FAILED] or router_failed else 0


def status_json(units: list[Unit], routers: list[dict[str, Any]]) -> dict[str, Any]:
    """What `rollout status` shows, for a script; `failed` names a unit or router deployment that FAILED."""
    unit_rows = [
        {
            "unit": u.unit_id,
            "cell": u.cell_id,
            "rollout": rollout_state(u),
            "task_definition": arn_name(u.task_definition_arn),
            "revision": u.revision,
            "members_report": sorted({r.revision for n in u.nodes if (r := n.report) is not None}),
            "deployments": [
                {k: d.get(k) for k in ("status", "taskDefinition", "rolloutState", "runningCount", "desiredCount")}
                for d in u.deployments
            ],
        }
        for u in units
    ]
    router_rows = [
        {"service": s["serviceName"], **{k: d.get(k) for k in ("id", "status", "taskDefinition", "rolloutState")}}
        for s in routers
        for d in s.get("deployments", [])
    ]
    failed = [r["unit"] for r in unit_rows if r["rollout"] == FAILED]
    failed += [r["service"] for r in router_rows if r["rolloutState"] == FAILED]
    return {"units": unit_rows, "router": router_rows, "failed": failed}


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


# --- rollout plan ---------------------------------------------------------------------------------
_WAVE_LINE = re.compile(r"^units_per_wave\s*:.*$", re.MULTILINE)  # the top-level key, not a nested one


def _check_plan_flags(args: argparse.Namespace) -> None:
    check_arg("--load-minutes", args.load_minutes, Number(0, 1440, "a day", above=True))
    check_arg("--demand", args.demand, Number(0, 1, "a share of the whole fleet's capacity, e.g. 0.8", above=True))
    if args.spare_nodes is not None:
        check_arg("--spare-nodes", args.spare_nodes, Integer(0))
    check_arg("--node-failures-per-day", args.node_failures_per_day, Number(0, 1, "per node per day"))


def config_change(path: str, current: int, recommended: int) -> tuple[int | None, str]:
    """(line number or None, what to do) to set units_per_wave to `recommended` in the YAML at path,
    where `current` is the wave size the config deploys today (its line, or the default)."""
    text = Path(path).read_text()
    m = _WAVE_LINE.search(text)
    new = f"units_per_wave: {recommended}"
    if m is None:
        if recommended == current:
            return None, f"no change: {path} leaves units_per_wave unset, which is {current} (about 10 % of units)"
        return None, f"add the line `{new}` at top level of {path}"
    line = text.count("\n", 0, m.start()) + 1
    old = m.group(0).split("#")[0].strip()
    if recommended == current:
        return line, f"no change: keep {path} line {line} `{old}`"
    return line, f"change {path} line {line}: `{old}` -> `{new}`"


def _row(s: Summary, units: int) -> dict[str, Any]:
    return {
        "units_per_wave": s.units_per_wave,
        "duration_s": s.duration_s,
        "min_in_rotation": s.min_in_rotation,
        "min_capacity_share": s.min_in_rotation / units,
        "floor": s.model.floor,
        "below_floor_s": s.below_floor_s,
        "shed_share": s.shed_share,
    }


def run_plan(args: argparse.Namespace, console: Console) -> int:
    _check_plan_flags(args)
    cfg = read_config(args.config)
    current = cfg.effective_units_per_wave
    model = FleetModel(
        units=cfg.units,
        nodes_per_unit=cfg.nodes_per_unit,
        units_per_cell=cfg.units_per_cell,
        rollout=cfg.unit_rollout,
        units_per_wave=current,
        load_s=args.load_minutes * 60.0,
        node_failures_per_node_day=args.node_failures_per_day,
        traffic=args.demand,
    )
    rec: Recommendation = recommend_wave(model, spare_nodes=args.spare_nodes, seeds=range(3), also=[current])
    by_wave = {s.units_per_wave: s for s in rec.table}
    now, best = by_wave[current], by_wave[rec.units_per_wave]
    line, change = config_change(args.config, current, rec.units_per_wave)
    lanes = best.model.waves.parallel_cells
    deploy = f"node_modules/.bin/cdk deploy --all --concurrency {lanes + 1} -c config={args.config}"
    if args.json:
        doc = {
            "config": args.config,
            "units": cfg.units,
            "nodes_per_unit": cfg.nodes_per_unit,
            "cells": cfg.cells,
            "unit_rollout": cfg.unit_rollout,
            "current": _row(now, cfg.units),
            "recommended": _row(best, cfg.units),
            "change": {"line": line, "to": f"units_per_wave: {rec.units_per_wave}", "what": change},
            "deploy": deploy,
            **rollout_dict(rec),
        }
        console.print_json(json.dumps(doc))
        return 0
    console.print(
        f"{args.config}: {cfg.units} units x {cfg.nodes_per_unit} nodes in {cfg.cells} cell(s) of up to "
        f"{cfg.units_per_cell}, unit_rollout {cfg.unit_rollout}, units_per_wave {current}"
        + ("" if cfg.units_per_wave is not None else " (unset: about 10 %)")
        + f"; simulated at {args.load_minutes:g} min of model load, demand {args.demand:.0%} of capacity",
        markup=False,
    )
    t = Table(title="Current vs recommended (simulated, ops/rollout_sim.py; worst of 3 seeds)")
    for col in ("", "units per wave", "rollout", "min units in rotation", "below floor", "requests shed"):
        t.add_column(col, justify="right")
    for label, s in (("current", now), ("recommended", best)):
        t.add_row(
            label,
            str(s.units_per_wave),
            f"{s.duration_s / 3600:.1f} h",
            f"{s.min_in_rotation} of {cfg.units} ({s.min_in_rotation / cfg.units:.0%}; floor {s.model.floor})",
            f"{s.below_floor_s / 60:.0f} min",
            f"{s.shed_share:.2%}",
        )
    console.print(t)
    render_rollout(rec, console)
    console.print(f"recommended: units_per_wave {rec.units_per_wave}", style="bold")
    console.print(change, markup=False)
    console.print(f"then deploy with: {deploy}", markup=False)
    return 0
