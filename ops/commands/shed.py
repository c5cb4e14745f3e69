"""`flotilla shed set | clear | show`: the incident lever. Writes the fleet-wide admission limit
(contract/admission.py) to the deployment's SSM parameter; every router reads it every few seconds
(runtime/router/admission.py), so load is shed without a redeploy and stops being shed when cleared.

An SSM parameter rather than a Cloud Map attribute: the units' Cloud Map service belongs to ECS
(it registers and deregisters every task there), Parameter Store keeps every version with who
changed it (GetParameterHistory, an audit trail for the incident review), and IAM can give the
router read access to exactly this one parameter.
"""

from __future__ import annotations

import argparse
import json

import botocore.exceptions
from rich.console import Console

from contract.admission import MAX_LIMIT, AdmissionError, AdmissionLimit, parameter_name
from contract.declare import Integer
from ops.aws import Aws, clients_for
from ops.commands import Subparsers
from ops.commands.common import add_confirm_options, add_json_option, confirmed
from ops.errors import FlagType, OpsError, UsageError

ROUTER_READ_INTERVAL_S = 10  # runtime/router/settings.py admission_interval_s default


CAP = Integer(1, MAX_LIMIT)  # what contract.admission takes for either per-unit cap


def add_parser(sub: Subparsers) -> list[argparse.ArgumentParser]:
    p = sub.add_parser(
        "shed",
        help="shed load fleet-wide during an incident: `shed set`, `shed clear`, `shed show`",
        description="The fleet-wide admission limit every router reads at run time (SSM parameter "
        "/flotilla/<deployment>/admission). Routers apply a change within about "
        f"{ROUTER_READ_INTERVAL_S} s; no redeploy.",
    )
    psub = p.add_subparsers(dest="shed_command", required=True, metavar="SUBCOMMAND")
    s = psub.add_parser(
        "set",
        help="set (or replace) the limit",
        description="Each option lowers what the routers allow; options left out are not limited. "
        "Shed requests get 429 with Retry-After. Dry run unless confirmed.",
    )
    s.add_argument(
        "--admit-percent",
        type=FlagType("--admit-percent", Integer(0, 100)),
        metavar="P",
        help="admit only P%% of new requests (0-100); the rest are refused before any unit is chosen",
    )
    s.add_argument(
        "--max-queue-depth",
        type=FlagType("--max-queue-depth", CAP),
        metavar="N",
        help="a unit reporting a queue this deep takes no new request (the same for every router)",
    )
    s.add_argument(
        "--max-outstanding-per-unit",
        type=FlagType("--max-outstanding-per-unit", CAP),
        metavar="N",
        help="requests one router keeps in flight to one unit",
    )
    s.add_argument("--reason", required=True, help="who and why (e.g. an incident id): stored with the limit")
    add_confirm_options(s)
    s.set_defaults(handler=run_set)
    c = psub.add_parser("clear", help="remove the limit", description="Delete the parameter. Dry run unless confirmed.")
    add_confirm_options(c)
    c.set_defaults(handler=run_clear)
    w = psub.add_parser("show", help="the limit in force", description="Print the limit in force, if any.")
    add_json_option(w, "the limit (null when none)")
    w.set_defaults(handler=run_show)
    return [s, c, w]


def read_limit(aws: Aws, name: str) -> tuple[AdmissionLimit | None, str]:
    """The limit in the parameter (None: no parameter) and when it was last changed."""
    try:
        param = aws.ssm.get_parameter(Name=name)["Parameter"]
    except botocore.exceptions.ClientError as err:
        if err.response.get("Error", {}).get("Code") == "ParameterNotFound":
            return None, ""
        raise
    try:
        limit = AdmissionLimit.loads(str(param["Value"]))
    except AdmissionError as err:
        raise OpsError(
            f"parameter {name} holds no admission limit ({err}): `flotilla shed set` or `clear` it"
        ) from None
    return limit, str(param.get("LastModifiedDate", ""))


def describe(limit: AdmissionLimit) -> str:
    parts = []
    if limit.admit_percent < 100:
        parts.append(f"admit {limit.admit_percent}% of new requests")
    if limit.max_queue_depth is not None:
        parts.append(f"units take nothing new at queue depth {limit.max_queue_depth}")
    if limit.max_outstanding_per_unit is not None:
        parts.append(f"at most {limit.max_outstanding_per_unit} in flight per unit per router")
    text = "; ".join(parts) or "no limit"
    return f"{text} (reason: {limit.reason})" if limit.reason else text


def run_set(args: argparse.Namespace, console: Console) -> int:
    if args.admit_percent is None and args.max_queue_depth is None and args.max_outstanding_per_unit is None:
        raise UsageError(
            "shed set: give at least one of --admit-percent, --max-queue-depth, --max-outstanding-per-unit"
        )
    try:
        limit = AdmissionLimit(
            admit_percent=100 if args.admit_percent is None else args.admit_percent,
            max_queue_depth=args.max_queue_depth,
            max_outstanding_per_unit=args.max_outstanding_per_unit,
            reason=args.reason,
        )
    except AdmissionError as err:
        raise UsageError(f"shed set: {err}") from None
    aws = clients_for(args)
    name = parameter_name(args.deployment)
    current, _ = read_limit(aws, name)
    console.print(f"shed set on {args.deployment}: parameter {name}")
    console.print(f"  now:   {describe(current) if current else 'no limit'}")
    console.print(f"  after: {describe(limit)}")
    console.print(
        f"  every router applies it within about {ROUTER_READ_INTERVAL_S} s; refused requests get 429 with "
        "Retry-After. Undo with `flotilla shed clear`."
    )
    if not confirmed(args, console, f"set the admission limit of {args.deployment}"):
        return 0
    aws.ssm.put_parameter(
        Name=name,
        Value=limit.dumps(),
        Type="String",
        Overwrite=True,
        Description="flotilla fleet-wide admission limit (flotilla shed)",
    )
    console.print(f"{name}: {limit.dumps()}")
    return 0


def run_clear(args: argparse.Namespace, console: Console) -> int:
    aws = clients_for(args)
    name = parameter_name(args.deployment)
    current, _ = read_limit(aws, name)
    if current is None:
        console.print(f"no admission limit set on {args.deployment} ({name} does not exist)")
        return 0
    console.print(
        f"shed clear on {args.deployment}: remove {name} ({describe(current)}); routers stop shedding "
        f"within about {ROUTER_READ_INTERVAL_S} s"
    )
    if not confirmed(args, console, f"clear the admission limit of {args.deployment}"):
        return 0
    aws.ssm.delete_parameter(Name=name)
    console.print(f"{name}: deleted")
    return 0


def run_show(args: argparse.Namespace, console: Console) -> int:
    aws = clients_for(args)
    name = parameter_name(args.deployment)
    limit, when = read_limit(aws, name)
    if args.json:
        doc = {"parameter": name, "limit": json.loads(limit.dumps()) if limit else None, "since": when or None}
        console.print_json(json.dumps(doc))
    elif limit is None:
        console.print(f"no admission limit on {args.deployment} ({name} does not exist)")
    else:
        console.print(f"admission limit on {args.deployment} since {when}: {describe(limit)}")
    return 0


def admission_note(aws: Aws, deployment: str) -> str | None:
    """One line for `status` when a limit is in force (None when not, or when it cannot be read)."""
    if aws.ssm is None:
        return None
    try:
        limit, when = read_limit(aws, parameter_name(deployment))
    except (OpsError, botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError):
        return None
    return f"admission limit in force since {when}: {describe(limit)} (flotilla shed show)" if limit else None
