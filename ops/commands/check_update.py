"""`flotilla check-update`: before a deploy, compare the synthesized cells (cdk.out) with the ones
deployed and refuse a change CloudFormation would apply without complaint but the fleet cannot
take: a unit whose Auto Scaling group moves to another subnet, so another AZ, and a new
units_per_cell, which moves units to other cells (layout_change).

A unit's instances sit in one cluster placement group, and "A cluster placement group can't span
multiple Availability Zones" (EC2 user guide, placement-groups.html, rules and limitations); its EFA
traffic cannot leave the AZ either. CloudFormation updates the group, not replaces it, and nothing
in AWS refuses the move: "When you update VPCZoneIdentifier, this retains the same Auto Scaling group
and replaces old instances with new ones, according to the specified subnets" (the property's
description in the AWS::AutoScaling::AutoScalingGroup resource schema, as cfn-lint 1.58 ships it),
so the unit's serving members are replaced by instances in the other AZ, outside its placement
group. Units go round-robin over capacity.availability_zones (or the VPC's AZs when that is []), so
changing either list moves units already running. A new list of the VPC's own AZs also changes
subnets other stacks import, which CloudFormation refuses by itself ("you can't ... modify the
exported output value", Fn::ImportValue, CloudFormation user guide).
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

import botocore.exceptions
from rich.console import Console

import contract
from ops.aws import clients_for
from ops.commands import Subparsers
from ops.commands.common import add_json_option
from ops.errors import EXIT_FAILED, EXIT_OK, UsageError
from ops.fleet import UNIT_TAG

_UNIT_ID_RE = re.compile(rf"^{contract.UNIT_ID_PATTERN}$")
_CELL_STACK_RE = re.compile(r"^Cell-(\d+)$")
ASG_TYPE = "AWS::AutoScaling::AutoScalingGroup"
# A CloudFormation template as JSON decodes it.
Template: TypeAlias = dict[str, Any]


@dataclass(frozen=True)
class UnitMove:
    stack: str  # the cell's stack id in the app (Cell-<n>)
    unit_id: str
    before: Any  # the group's VPCZoneIdentifier as deployed
    after: Any  # ... and as synthesized


def unit_subnets(template: Template) -> dict[str, Any]:
    """unit id -> the VPCZoneIdentifier of the unit's Auto Scaling group in one cell template (the
    group carries the unit's flotilla:unit tag, stacks/unit.py)."""
    out: dict[str, Any] = {}
    for resource in template.get("Resources", {}).values():
        if resource.get("Type") != ASG_TYPE:
            continue
        props = resource.get("Properties", {})
        unit = next((t["Value"] for t in props.get("Tags", []) if t.get("Key") == UNIT_TAG), None)
        if unit is not None:
            out[unit] = props.get("VPCZoneIdentifier")
    return out


def units_moving_az(deployed: dict[str, Template], synthesized: dict[str, Template]) -> list[UnitMove]:
    """Units in both templates of a cell (stack id -> template) whose group changes subnet."""
    moves = []
    for stack in sorted(deployed.keys() & synthesized.keys()):
        if not _CELL_STACK_RE.match(stack):
            continue
        old, new = unit_subnets(deployed[stack]), unit_subnets(synthesized[stack])
        for unit in sorted(old.keys() & new.keys(), key=_fleet_order):
            if json.dumps(old[unit], sort_keys=True) != json.dumps(new[unit], sort_keys=True):
                moves.append(UnitMove(stack, unit, old[unit], new[unit]))
    return moves


def _fleet_order(unit_id: str) -> tuple[int, int]:
    m = _UNIT_ID_RE.match(unit_id)
    if m is None:
        raise UsageError(f"a unit's group is tagged {UNIT_TAG}={unit_id!r}, not cell<c>-unit<i>: not a flotilla unit")
    return int(m.group(1)), int(m.group(2))


def units_that_stay(moves: list[UnitMove], deployed: dict[str, Template]) -> int:
    """How many units the fleet keeps in their AZs: those before the first one that moves, in fleet
    order (a unit's AZ follows from its position alone, stacks/config.py units_in_cell), counting the
    deployed cells' units."""
    first_cell, first_index = min(_fleet_order(m.unit_id) for m in moves)
    earlier = 0
    for stack, template in deployed.items():
        m = _CELL_STACK_RE.match(stack)
        if m and int(m.group(1)) < first_cell:
            earlier += len(unit_subnets(template))
    return earlier + first_index


def refusal(moves: list[UnitMove], deployed: dict[str, Template]) -> list[str]:
    """The lines check-update prints for units that would move: each unit, then the fix."""
    lines = [
        f"{m.unit_id} ({m.stack}): its Auto Scaling group would move to another subnet, so another AZ, "
        "away from its cluster placement group and running instances"
        for m in moves
    ]
    keep = units_that_stay(moves, deployed)
    fix = "A unit cannot change AZ in place. Keep availability_zones and capacity.availability_zones as deployed, or "
    if keep:
        fix += (
            f"retire the units from the first that moves (`flotilla shrink --units {keep}`), deploy the new "
            f"AZs with units: {keep}, then raise units again: the retired units come back in their new AZs "
            "(docs/runbooks/capacity-shortage.md, Move units to other AZs)."
        )
    else:
        fix += (
            "the first unit moves too: tear the deployment down (`flotilla teardown`) and deploy the new AZs, "
            "or deploy them beside it under another deployment_name "
            "(docs/runbooks/capacity-shortage.md, Move units to other AZs)."
        )
    return [*lines, fix]


@dataclass(frozen=True)
class LayoutChange:
    position: int  # 0-based place in the fleet (cells filled in order) of the first unit that changes id
    deployed: str  # the unit id there as deployed
    synthesized: str  # ... and in cdk.out
    units_per_cell: int | None  # as deployed, when the deployed cells show it (Cell-0 full beside Cell-1)


def fleet_units(templates: dict[str, Template]) -> list[str]:
    """Every unit id of the cell templates, in fleet order."""
    units = [u for stack, t in templates.items() if _CELL_STACK_RE.match(stack) for u in unit_subnets(t)]
    return sorted(units, key=_fleet_order)


def layout_change(deployed: dict[str, Template], synthesized: dict[str, Template]) -> LayoutChange | None:
    """A new units_per_cell gives the units from some fleet position on other ids in other cells:
    new resources (placement group, group, capacity provider, service) in another stack beside the
    old ones, which CloudFormation then deletes under their running, scale-in protected instances
    (aws/aws-cdk#18179). Fewer units (after `flotilla shrink`) keep every remaining unit's id."""
    old, new = fleet_units(deployed), fleet_units(synthesized)
    for position, (before, after) in enumerate(zip(old, new)):
        if before != after:
            per_cell = None
            if "Cell-0" in deployed and "Cell-1" in deployed:
                per_cell = len(unit_subnets(deployed["Cell-0"]))
            return LayoutChange(position, before, after, per_cell)
    return None


def layout_refusal(change: LayoutChange) -> list[str]:
    as_deployed = f" ({change.units_per_cell})" if change.units_per_cell is not None else ""
    return [
        f"units_per_cell: the unit at fleet position {change.position} is {change.deployed} as deployed and "
        f"{change.synthesized} in cdk.out: every unit from there would be created again in another cell while "
        "CloudFormation deletes the running one",
        f"units_per_cell is fixed for a deployment: keep it as deployed{as_deployed}; a new cell size is a new "
        "deployment (another deployment_name) beside this one.",
    ]


def synthesized_stacks(cdk_out: Path) -> dict[str, tuple[str, Template]]:
    """stack id -> (CloudFormation stack name, template) of every stack in a cloud assembly."""
    manifest_path = cdk_out / "manifest.json"
    if not manifest_path.is_file():
        raise UsageError(
            f"--cdk-out={cdk_out} has no manifest.json: not a cloud assembly: run `make synth CONFIG=...` "
            "with the config you mean to deploy first"
        )
    manifest = json.loads(manifest_path.read_text())
    out = {}
    for artifact_id, artifact in manifest.get("artifacts", {}).items():
        if artifact.get("type") != "aws:cloudformation:stack":
            continue
        props = artifact["properties"]
        template = json.loads((cdk_out / props["templateFile"]).read_text())
        out[artifact_id] = (props.get("stackName", artifact_id), template)
    return out


def deployed_template(cloudformation: Any, stack_name: str) -> Template | None:
    """The template CloudFormation holds for a stack, or None when there is no such stack yet."""
    try:
        body = cloudformation.get_template(StackName=stack_name)["TemplateBody"]
    except botocore.exceptions.ClientError as err:
        # GetTemplate of a stack that was never created: ValidationError "Stack with id X does not exist".
        error = err.response.get("Error", {})
        if error.get("Code") == "ValidationError" and "does not exist" in error.get("Message", ""):
            return None
        raise
    # botocore decodes a JSON template body into a dict (its GetTemplate after-call handler); a
    # YAML or undecoded body stays text.
    return body if isinstance(body, dict) else json.loads(body)


def add_parser(sub: Subparsers) -> list[argparse.ArgumentParser]:
    p = sub.add_parser(
        "check-update",
        help="before a deploy: refuse a config change that would move running units to another AZ or cell",
        description="Compare the cells synthesized in --cdk-out with the deployed cell stacks "
        "(CloudFormation GetTemplate) and refuse, with exit status 1, a change that moves a running unit "
        "to another AZ, which CloudFormation would apply in place, or to another cell (a new "
        "units_per_cell). Run it after `make synth CONFIG=...` and before `make deploy`. Stacks not "
        "deployed yet are new: nothing to compare.",
    )
    p.add_argument(
        "--cdk-out",
        type=Path,
        default=Path("cdk.out"),
        metavar="DIR",
        help="the cloud assembly `make synth` wrote; default %(default)s",
    )
    # Only GetTemplate is called: the region and credentials, none of the fleet options.
    p.add_argument("--region", help="AWS region of the deployment (default: the AWS_REGION / profile setting)")
    p.add_argument("--profile", help="AWS named profile")
    add_json_option(p, "the verdict and each refusal")
    p.set_defaults(handler=run)
    return [p]


def run(args: argparse.Namespace, console: Console) -> int:
    synthesized = synthesized_stacks(args.cdk_out)
    cloudformation = clients_for(args).cloudformation
    deployed: dict[str, Template] = {}
    for stack_id, (stack_name, _) in sorted(synthesized.items()):
        if _CELL_STACK_RE.match(stack_id):
            template = deployed_template(cloudformation, stack_name)
            if template is not None:
                deployed[stack_id] = template
    templates = {k: t for k, (_, t) in synthesized.items()}
    layout, moves = layout_change(deployed, templates), units_moving_az(deployed, templates)
    refusals = ([layout_refusal(layout)] if layout is not None else []) + ([refusal(moves, deployed)] if moves else [])
    if args.json:
        doc = {
            "compared": sorted(deployed),
            "refused": [{"problems": problems, "fix": fix} for *problems, fix in refusals],
        }
        console.print_json(json.dumps(doc))
        return EXIT_FAILED if refusals else EXIT_OK
    if not refusals:
        console.print(
            f"check-update: {len(deployed)} deployed cell stack(s) compared; no unit changes cell or AZ",
            highlight=False,
        )
        return EXIT_OK
    for *problems, fix in refusals:
        for line in problems:
            console.print(f"refused: {line}", highlight=False, markup=False)
        console.print(f"fix: {fix}", highlight=False, markup=False)
    return EXIT_FAILED
