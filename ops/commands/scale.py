"""`flotilla scale show | floor`: what the scaler is doing and why, and the incident lever on it.

`show` reads the scaler's own decision lines from its log group (one a minute: the range it works in,
the units serving, starting and draining, what it wanted and the rule that decided) and the
temporary floor. `floor` sets (or, with --clear, removes) a temporary floor: at least N units until a
time, which the scaler reads on its next pass (within a minute) and which lapses by itself. An SSM
parameter, like `flotilla shed`'s limit (its history is the audit trail), never created by the
stacks, so a `cdk deploy` cannot reset an incident's floor.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from typing import Any

import botocore.exceptions
from rich.console import Console
from rich.table import Table

from contract.bad_input import NOT_GIVEN
from contract.declare import Integer
from contract.log_lines import json_lines
from contract.scaling import DECISION_EVENT, ScalingError, TemporaryFloor, format_utc, parameter_name
from ops.aws import Aws, clients_for
from ops.commands import Subparsers
from ops.commands.common import add_confirm_options, confirmed
from ops.errors import OpsError, bad_arg, check_arg

DECISION_FILTER = '{ $.event = "scaler_decision" }'  # CloudWatch Logs JSON filter pattern
MAX_FOR_S = 7 * 86400  # a temporary floor lasts at most a week: a forgotten one must lapse
_DURATION = re.compile(r"^(\d+)([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
assert DECISION_EVENT == "scaler_decision"  # the filter above names it


def _duration(text: str) -> int:
    m = _DURATION.match(text)
    if not m or not 0 < int(m.group(1)) * _UNIT_S[m.group(2)] <= MAX_FOR_S:
        raise argparse.ArgumentTypeError(f"{text!r}: a duration like 90m, 2h or 1d, at most 7d")
    return int(m.group(1)) * _UNIT_S[m.group(2)]


def add_parser(sub: Subparsers) -> list[argparse.ArgumentParser]:
    p = sub.add_parser(
        "scale",
        help="the scaler: `scale show` (range, units, last decisions and why), `scale floor` (a temporary floor)",
        description="The fleet's scaler (docs/scaling.md): what it works with and decided, and a temporary "
        "floor for an incident.",
    )
    psub = p.add_subparsers(dest="scale_command", required=True, metavar="SUBCOMMAND")
    s = psub.add_parser("show", help="range, units, booked peaks, temporary floor, last decisions and why")
    s.add_argument("--last", type=int, default=10, metavar="N", help="decisions that changed the fleet to list")
    s.add_argument("--since", type=_duration, default=6 * 3600, metavar="DURATION", help="look back (default 6h)")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(handler=run_show)
    f = psub.add_parser(
        "floor",
        help="set a temporary floor (at least N units for a while), or --clear it",
        description="At least --units units until --for from now; the scaler starts the missing ones on its "
        "next pass (a cold start each) and removes none below it. It lapses by itself. Dry run unless "
        "confirmed.",
    )
    f.add_argument("--units", type=int, metavar="N", help="units that must serve (at most the ceiling)")
    f.add_argument("--for", dest="for_s", type=_duration, metavar="DURATION", help="how long: 90m, 2h, 1d (<= 7d)")
    f.add_argument("--reason", help="who and why (an incident id): stored with the floor")
    f.add_argument("--clear", action="store_true", help="remove the temporary floor")
    f.add_argument("--json", action="store_true", help="print the floor as stored, as JSON")
    add_confirm_options(f)
    f.set_defaults(handler=run_floor)
    return [s, f]


def read_floor(aws: Aws, deployment: str) -> TemporaryFloor | None:
    try:
        text = aws.ssm.get_parameter(Name=parameter_name(deployment))["Parameter"]["Value"]
    except botocore.exceptions.ClientError as err:
        if err.response.get("Error", {}).get("Code") == "ParameterNotFound":
            return None
        raise
    try:
        return TemporaryFloor.loads(str(text))
    except ScalingError as err:
        raise OpsError(f"{parameter_name(deployment)} holds no temporary floor ({err}): set or clear it") from None


def scaler_log_group(aws: Aws, deployment: str) -> str:
    prefix = f"{deployment}-Scaler-Logs"
    groups = aws.logs.describe_log_groups(logGroupNamePrefix=prefix).get("logGroups", [])
    if not groups:
        raise OpsError(
            f"no log group named {prefix}*: is the Scaler stack of {deployment!r} deployed here (the config's "
            "scaling section)?"
        )
    return str(groups[0]["logGroupName"])


def decisions(aws: Aws, deployment: str, since_s: float, now: float) -> list[dict[str, Any]]:
    """The scaler's decision lines of the last since_s, oldest first."""
    group = scaler_log_group(aws, deployment)
    found = json_lines(
        aws.logs, group, pattern=DECISION_FILTER, event=DECISION_EVENT, start_s=now - since_s, end_s=now, max_pages=50
    )
    return sorted(({**line, "at": at} for at, line in found), key=lambda d: d["at"])


def summary(lines: list[dict[str, Any]], floor: TemporaryFloor | None, last: int, now: float) -> dict[str, Any]:
    latest = lines[-1] if lines else {}
    changes = [d for d in lines if d.get("add") or d.get("remove") or d.get("given_back")]
    keep = ("at", "rule", "reason", "add", "remove", "given_back", "ScalerTargetUnits", "ScalerUnmetUnits")
    return {
        "floor": latest.get("floor"),
        "ceiling": latest.get("ceiling"),
        "in_force_minimum": latest.get("minimum"),
        "serving": latest.get("ScalerActiveUnits"),
        "starting": latest.get("ScalerPendingUnits"),
        "draining": latest.get("ScalerDrainingUnits"),
        "target": latest.get("ScalerTargetUnits"),
        "unmet": latest.get("ScalerUnmetUnits"),
        "last_pass_age_s": round(now - latest["at"]) if latest else None,
        "last_reason": latest.get("reason"),
        "scheduled": latest.get("scheduled", []),
        "temporary_floor": json.loads(floor.dumps()) if floor and floor.in_force(now) else None,
        "changes": [{k: d.get(k) for k in keep} for d in changes[-last:]],
    }


def run_show(args: argparse.Namespace, console: Console) -> int:
    aws = clients_for(args)
    now = time.time()
    doc = summary(decisions(aws, args.deployment, args.since, now), read_floor(aws, args.deployment), args.last, now)
    if args.json:
        console.print_json(json.dumps(doc, default=str))
        return 0
    if doc["last_pass_age_s"] is None:
        raise OpsError(f"no scaler decision in the last {args.since // 3600} h: see docs/runbooks/scale-for-peak.md")
    console.print(
        f"{args.deployment}: {doc['floor']} to {doc['ceiling']} units; floor in force {doc['in_force_minimum']}; "
        f"{doc['serving']} serving, {doc['starting']} starting, {doc['draining']} draining; wants {doc['target']}"
        + (f", {doc['unmet']} more than capacity allows" if doc["unmet"] else "")
        + f" (last pass {doc['last_pass_age_s']} s ago)"
    )
    console.print(f"why: {doc['last_reason']}")
    for peak in doc["scheduled"]:
        console.print(
            f"booked: {peak['name']} {peak['start']} to {peak['end']}: {peak['units']} units"
            + (f" on {peak['reservation']}" if peak.get("reservation") else "")
        )
    if doc["temporary_floor"]:
        t = doc["temporary_floor"]
        console.print(f"temporary floor: {t['units']} units until {t['until']} ({t.get('reason', '')})")
    table = Table("when (UTC)", "rule", "change", "why", box=None)
    for c in doc["changes"]:
        change = f"+{c['add']}" if c.get("add") else f"-{len(c.get('remove') or [])}" if c.get("remove") else ""
        if c.get("given_back"):
            change += f" gave back {', '.join(c['given_back'])}"
        table.add_row(format_utc(c["at"]), str(c["rule"]), change, str(c["reason"]))
    console.print(table)
    return 0


def _check_floor_args(args: argparse.Namespace) -> None:
    if args.clear:
        if args.units is not None or args.for_s is not None:
            raise bad_arg("--clear", NOT_GIVEN, "comes alone", "drop --units and --for, or drop --clear")
        return
    if args.units is None or args.for_s is None or not args.reason:
        raise bad_arg("--units", NOT_GIVEN, "is required with --for and --reason", "give all three, or --clear")
    check_arg("--units", args.units, Integer(0))


def run_floor(args: argparse.Namespace, console: Console) -> int:
    _check_floor_args(args)
    aws = clients_for(args)
    name = parameter_name(args.deployment)
    current = read_floor(aws, args.deployment)
    if args.clear:
        if current is None:
            console.print(f"no temporary floor on {args.deployment} ({name} does not exist)")
            return 0
        console.print(f"scale floor --clear on {args.deployment}: remove {current.dumps()}")
        if confirmed(args, console, f"clear the temporary floor of {args.deployment}"):
            aws.ssm.delete_parameter(Name=name)
            console.print(f"{name}: deleted; the scaler may remove units above the floor again after its hold")
        return 0
    floor = TemporaryFloor(units=args.units, until_s=time.time() + args.for_s, reason=args.reason)
    console.print(f"scale floor on {args.deployment}: parameter {name}")
    console.print(f"  now:   {current.dumps() if current else 'none'}")
    console.print(f"  after: {floor.dumps()}")
    console.print(
        "  the scaler reads it on its next pass (within a minute), starts what is missing (each unit a cold "
        "start) and removes none below it until it lapses; above the ceiling it says `more than capacity allows`."
    )
    if not confirmed(args, console, f"set a temporary floor of {args.units} units on {args.deployment}"):
        return 0
    description = "flotilla temporary floor (flotilla scale)"
    aws.ssm.put_parameter(Name=name, Value=floor.dumps(), Type="String", Overwrite=True, Description=description)
    if args.json:
        console.print_json(floor.dumps())
    else:
        console.print(f"{name}: {floor.dumps()}")
    return 0
