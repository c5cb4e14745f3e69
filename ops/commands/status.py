"""`flotilla status`: every cell, unit and node with rank, role, revision, readiness and load.

The exit status says how bad it is, so a script or an alarm runbook can branch on it: 0 every unit
ready (drained ones excepted), 1 degraded (ready units still at or above the FleetReadyUnits
alarm's threshold), 3 below that threshold, 4 cannot tell (no unit found, AWS refused, or the units'
health could not be read: then a unit ECS sees no fault in is UNKNOWN, never READY). For each unit
that is not ready it shows what ECS and Auto Scaling last said about it.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import botocore.exceptions
from rich.console import Console
from rich.table import Table

from ops.aws import Aws, clients_for
from ops.commands import Subparsers
from ops.commands.common import cell_id, fleet_from_args, select
from ops.commands.shed import admission_note
from ops.diagnose import Diagnosis, diagnose
from ops.errors import EXIT_CRITICAL, EXIT_FAILED, EXIT_OK, EXIT_UNKNOWN
from ops.fleet import DRAINED_IN_CONFIG_TAG, DRAINED_TAG, Node, Unit
from ops.health_logs import MAX_AGE_S, read_unit_states

# The Observability stack's FleetReadyUnits alarm: CloudFormation names an alarm
# <stack name>-<logical id>-<suffix>; its threshold is stacks/observability.py's min_ready_units.
READY_ALARM = "FleetReadyUnits"
DEFAULT_MIN_READY_UNITS = 1  # ObservabilityProps.min_ready_units, what the stacks deploy
MAX_DIAGNOSED = 10  # not-ready units whose ECS / Auto Scaling history is fetched (3-4 calls each)


def add_parser(sub: Subparsers) -> list[argparse.ArgumentParser]:
    p = sub.add_parser(
        "status",
        help="cells, units and nodes: rank, role, revision, readiness, load",
        description="Show every unit of the deployment from ECS, Cloud Map and the nodes' "
        "/health/ready. Exit status 1 when anything is not ready.",
    )
    p.add_argument("--cell", type=cell_id, metavar="CELL", help="only this cell: cell0 or 0")
    p.add_argument("--unit", help="only this unit, e.g. cell0-unit3")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument(
        "--no-health",
        action="store_true",
        help="do not call the nodes' /health/ready (from outside the VPC): judge by ECS and Cloud Map "
        "only; a unit ECS sees no fault in is then UNKNOWN (exit 4), never READY",
    )
    p.add_argument(
        "--health-via",
        choices=("nodes", "router-logs"),
        default="nodes",
        help="nodes (default): ask each node's /health/ready, which works only inside the VPC; "
        "router-logs: read the unit states the routers write to CloudWatch Logs every minute, from "
        "anywhere with logs:FilterLogEvents (per unit, not per node)",
    )
    p.add_argument(
        "--min-ready-units",
        type=int,
        metavar="N",
        help="the ready-unit count below which the fleet is critical (exit 3); default: the threshold of "
        f"the deployment's {READY_ALARM} alarm, or {DEFAULT_MIN_READY_UNITS} when it cannot be read",
    )
    p.set_defaults(handler=run)
    return [p]


def unit_state(u: Unit) -> str:
    if u.drained:
        return "DRAINED"
    if not u.ready:
        return "NOT READY"
    if u.probed:
        return "READY"
    # No fault ECS or Cloud Map can see, and nobody read the members' /health/ready: only a recent
    # router report can tell.
    if u.router_view is None:
        return "UNKNOWN"
    return "READY" if u.router_view.get("routable") else "NOT READY"


def _load(n: Node) -> tuple[str, str, str, str]:
    """Queue, expected wait / queue timeout, running / max and KV cache use as the node's ready body
    gives them; "-" for each figure it does not give (followers and older revisions leave some out)."""
    r = n.report
    if r is None or not r.load.model_fields_set:
        return "-", "-", "-", "-"
    ld = r.load

    def shown(name: str) -> str:
        return str(getattr(ld, name)) if ld.given(name) else "-"

    # The leader's expected wait for a batch slot; past its queue timeout it refuses with 429
    # (docs/runbooks/at-capacity.md).
    waits = ld.given("wait_s") and ld.given("queue_timeout_s") and ld.queue_timeout_s
    return (
        shown("queue_depth"),
        f"{ld.wait_s:g}/{ld.queue_timeout_s:g}" if waits else "-",
        f"{shown('running')}/{shown('max_running')}",
        f"{ld.kv_cache_used * 100:.0f}%" if ld.given("kv_cache_used") else "-",
    )


def render(units: list[Unit], console: Console) -> None:
    cells = list(dict.fromkeys(u.cell_id for u in units))  # units come sorted by cell, then unit
    for cell in cells:
        in_cell = [u for u in units if u.cell_id == cell]
        ready = sum(unit_state(u) == "READY" for u in in_cell)
        t = Table(title=f"{cell}: {ready}/{len(in_cell)} units ready", title_justify="left")
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
            "wait s",
            "running",
            "kv cache",
            "cloud map",
        ):
            t.add_column(col)
        for u in in_cell:
            state = unit_state(u)
            style = {"READY": "green", "NOT READY": "red", "DRAINED": "yellow", "UNKNOWN": "yellow"}[state]
            if not u.nodes:
                t.add_row(u.unit_id, f"[{style}]{state}[/]", u.revision, *["-"] * 11)
            for i, n in enumerate(u.nodes):
                rev = (r.revision if (r := n.report) is not None else "") or u.revision
                queue, wait, running, kv = _load(n)
                t.add_row(
                    u.unit_id if i == 0 else "",
                    f"[{style}]{state}[/]" if i == 0 else "",
                    rev,
                    str(n.rank) if n.rank is not None else "?",
                    n.role,
                    n.instance_id or "-",
                    n.availability_zone or "-",
                    n.state,
                    "yes" if n.ready else ("no" if u.probed else "?"),
                    queue,
                    wait,
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
    aws = clients_for(args)
    via_routers = args.health_via == "router-logs" and not args.no_health
    fleet = fleet_from_args(args, aws, health=not args.no_health and not via_routers)
    if via_routers:
        source = apply_router_view(aws, fleet.units, args.deployment)
        if not args.json:
            console.print(source, highlight=False)
    units = select(fleet, cell=args.cell, unit=args.unit)
    if not units:
        where = f" in cell {args.cell}" if args.cell else ""
        console.print(
            f"[red]no units found{where} for deployment {args.deployment!r}[/] (ECS clusters tagged "
            f"flotilla:deployment={args.deployment}, named {args.deployment}-cell<n>; is "
            "--deployment/--region right?)"
        )
        return EXIT_UNKNOWN
    unreadable = health_unreadable(fleet.units, requested=not args.no_health and not via_routers)
    if unreadable:
        for u in fleet.units:
            u.probed = False  # judge by ECS and Cloud Map only, as --no-health does
    threshold, source = ready_threshold(aws, args)
    diagnoses = diagnose_not_ready(aws, units, deployment=args.deployment)
    if args.json:
        doc = as_json(units)
        for entry in doc:
            d = diagnoses.get(entry["unit"])
            entry["diagnosis"] = d.lines() if d else []
        console.print_json(json.dumps(doc, default=str))
    else:
        render(units, console)
        for line in router_view_problems(units):
            console.print(f"[red]{line}[/]", highlight=False)
        render_diagnoses(diagnoses, console)
    for warning in drain_warnings(units):
        console.print(f"[yellow]warning:[/] {warning}", highlight=False)
    note = admission_note(aws, args.deployment)
    if note and not args.json:
        console.print(f"[yellow]{note}[/]", highlight=False)
    code, summary = verdict(units, fleet_units=fleet.units, threshold=threshold)
    if not args.json:
        if unreadable:
            console.print(
                f"[yellow]no node answered /health/ready ({unreadable}): readiness is UNKNOWN. The nodes "
                "admit their port only from inside the VPC: run status there, or read the routers' view "
                "with --health-via router-logs (docs/runbooks/README.md, 'Where to run flotilla').[/]",
                highlight=False,
            )
        console.print(f"{summary} (threshold {threshold} ready units: {source})", highlight=False)
    return code


def apply_router_view(aws: Aws, units: list[Unit], deployment: str) -> str:
    """Each unit's latest state as a router reported it (ops/health_logs.py); says where it read."""
    states, group = read_unit_states(aws, deployment)
    for u in units:
        u.router_view = states.get(u.unit_id)
    return f"health from the routers' reports in {group} (last {MAX_AGE_S}s): {len(states)} unit(s) reported"


def router_view_problems(units: list[Unit]) -> list[str]:
    out = []
    for u in units:
        v = u.router_view
        if v is not None and not v.get("routable") and u.ready and not u.probed:
            out.append(
                f"{u.unit_id}: the routers see it {v.get('state', '?')}, not routable ({v.get('age_s', '?')}s ago)"
            )
    return out


def health_unreadable(units: list[Unit], *, requested: bool) -> str | None:
    """Why nobody's health could be read, or None. Not one node of the selection answered although
    some were asked: the port is closed to us (outside the VPC, wrong security group), which says
    nothing about the units. A fleet whose members all fail to answer from inside the VPC looks the
    same from here, so the verdict is "cannot tell" (exit 4), never "ready"."""
    if not requested:
        return None
    asked = [n for u in units for n in u.nodes if n.last_status == "RUNNING" and n.address]
    if not asked or any(n.health is not None for n in asked):
        return None
    return asked[0].health_error or "no answer"


def ready_threshold(aws: Aws, args: argparse.Namespace) -> tuple[int, str]:
    """The FleetReadyUnits alarm's threshold (CloudWatch DescribeAlarms), the flag, or the stack default."""
    if args.min_ready_units is not None:
        return args.min_ready_units, "--min-ready-units"
    prefix = f"{args.deployment}-Observability-{READY_ALARM}"
    if aws.cloudwatch is None:
        return DEFAULT_MIN_READY_UNITS, "the stacks' default; no CloudWatch client"
    try:
        alarms = aws.cloudwatch.describe_alarms(AlarmNamePrefix=prefix, AlarmTypes=["MetricAlarm"])["MetricAlarms"]
    except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as err:
        return DEFAULT_MIN_READY_UNITS, f"the stacks' default; the {READY_ALARM} alarm could not be read: {err}"
    if not alarms:
        return DEFAULT_MIN_READY_UNITS, f"the stacks' default; no alarm named {prefix}*"
    return int(alarms[0]["Threshold"]), f"alarm {alarms[0]['AlarmName']}"


def verdict(units: list[Unit], *, fleet_units: list[Unit], threshold: int) -> tuple[int, str]:
    """The exit status and the summary line for the selected `units`. The threshold is fleet-wide
    (FleetReadyUnits counts every unit), so "critical" is judged on `fleet_units`; the rest on the
    selection. Drained units count as neither ready nor failing. UNKNOWN units decide the verdict
    only when they could: if even all of them being ready would leave the fleet below the
    threshold, it is critical; otherwise it cannot be told."""

    def count(us: list[Unit]) -> dict[str, int]:
        states = [unit_state(u) for u in us]
        return {k: states.count(k) for k in ("READY", "UNKNOWN", "NOT READY", "DRAINED")}

    c, f = count(units), count(fleet_units)
    parts = [f"{c['READY']}/{len(units)} units ready"]
    if c["DRAINED"]:
        in_config = sum(1 for u in units if unit_state(u) == "DRAINED" and DRAINED_IN_CONFIG_TAG in u.tags)
        parts.append(
            f"{c['DRAINED']} drained" + (f" ({in_config} by drained_units, kept across deploys)" if in_config else "")
        )
    if c["UNKNOWN"]:
        parts.append(f"{c['UNKNOWN']} UNKNOWN")
    if c["NOT READY"]:
        parts.append(f"[red]{c['NOT READY']} not ready[/]")
    if len(units) != len(fleet_units):
        parts.append(f"fleet: {f['READY']}/{len(fleet_units)} ready")
    text = ", ".join(parts)
    if f["READY"] + f["UNKNOWN"] < threshold:
        return (
            EXIT_CRITICAL,
            f"{text}: [red]CRITICAL[/], the fleet is below the ready-unit threshold (exit {EXIT_CRITICAL})",
        )
    if c["UNKNOWN"] or (f["UNKNOWN"] and f["READY"] < threshold):
        return EXIT_UNKNOWN, f"{text}: [yellow]UNKNOWN[/], readiness could not be read (exit {EXIT_UNKNOWN})"
    if c["NOT READY"]:
        return EXIT_FAILED, f"{text}: [yellow]DEGRADED[/], the fleet is at or above the threshold (exit {EXIT_FAILED})"
    return EXIT_OK, f"{text}: OK"


def diagnose_not_ready(aws: Aws, units: list[Unit], *, deployment: str) -> dict[str, Diagnosis]:
    """ECS events, stopped-task reasons and failed Auto Scaling activities of the first not-ready units."""
    sick = [u for u in units if unit_state(u) == "NOT READY"]
    return {u.unit_id: diagnose(aws, u, deployment=deployment) for u in sick[:MAX_DIAGNOSED]}


def render_diagnoses(diagnoses: dict[str, Diagnosis], console: Console) -> None:
    for unit_id, d in diagnoses.items():
        for line in d.lines():
            console.print(f"[red]{unit_id}[/]: {line}", highlight=False)


def drain_warnings(units: list[Unit]) -> list[str]:
    """Units drained with drain-unit whose desired count is back above 0: CloudFormation sets the
    service's DesiredCount from the template whenever it updates the service, so a deploy undoes a
    drain (docs/runbooks/unit-not-ready.md step 4)."""
    out = []
    for u in units:
        if DRAINED_TAG in u.tags and u.desired > 0:
            out.append(
                f"{u.unit_id} was drained (tag {DRAINED_TAG}) but its desired count is {u.desired} again: a "
                f"deploy (or someone) undid the drain. Drain it again (flotilla drain-unit {u.unit_id}) and add it "
                f"to drained_units in the config so deploys keep it drained, or, if it should serve, clear the "
                f"tag (flotilla restore-unit {u.unit_id})"
            )
    return out
