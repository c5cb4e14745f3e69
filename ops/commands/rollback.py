"""`flotilla rollback`: put units back on an earlier task definition revision, a wave of units at a
time, each wave ready again before the next starts.

It works after a real `cdk deploy`: the stacks keep replaced task definitions registered
(UpdateReplacePolicy Retain, stacks/unit.py), and a revision CloudFormation deregistered anyway (a
fleet deployed before that, or a revision deleted by hand) is registered again from its own
description, because ECS will not point a service at an INACTIVE one.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

import botocore.exceptions
from rich.console import Console
from rich.table import Table

import contract
from contract.declare import Integer
from contract.rollout import default_units_per_wave
from ops.aws import Aws, clients_for
from ops.commands import Subparsers
from ops.commands.common import (
    add_confirm_options,
    add_deprecated_alias,
    cell_id,
    confirmed,
    fleet_from_args,
    wait_until,
)
from ops.commands.rollout import COMPLETED, FAILED, rollout_state
from ops.commands.status import health_unreadable
from ops.errors import CannotTell, FlagType, OpsError, bad_arg
from ops.fleet import Fleet, Unit, arn_name, container_env

# How far below the current revision to look for the one to go back to (each look is one
# DescribeTaskDefinition call). Retained revisions accumulate one per deploy.
LOOKBACK_REVISIONS = 50
# RegisterTaskDefinition's parameters (botocore ecs RegisterTaskDefinitionRequest). A description
# holds more (taskDefinitionArn, revision, status, requiresAttributes, compatibilities,
# registeredAt/By, deregisteredAt): RegisterTaskDefinition rejects those.
REGISTER_KEYS = (
    "family",
    "taskRoleArn",
    "executionRoleArn",
    "networkMode",
    "containerDefinitions",
    "volumes",
    "placementConstraints",
    "requiresCompatibilities",
    "cpu",
    "memory",
    "pidMode",
    "ipcMode",
    "proxyConfiguration",
    "inferenceAccelerators",
    "ephemeralStorage",
    "runtimePlatform",
    "enableFaultInjection",
    "trustedExecutionConfiguration",
)


def add_parser(sub: Subparsers) -> list[argparse.ArgumentParser]:
    b = sub.add_parser(
        "rollback",
        help="put units back on an earlier task definition, in waves",
        description="Update the selected units' ECS services to an earlier revision of their task "
        "definition family (the newest one that differs from the current one, or --to-revision), a "
        "wave of units at a time; each wave must be ready again before the next starts. Dry run "
        "unless confirmed. Exit status 1 when a wave fails or runs out of time (the rest is left as "
        "it was).",
    )
    which = b.add_mutually_exclusive_group(required=True)
    which.add_argument("--unit", action="append", metavar="UNIT", help="a unit (repeatable)")
    which.add_argument(
        "--cell", action="append", type=cell_id, metavar="CELL", help="every unit of a cell, cell0 or 0 (repeatable)"
    )
    which.add_argument("--all", action="store_true", help="every unit of the deployment")
    b.add_argument(
        "--to-revision",
        metavar="REVISION",
        help="go back to the newest task definition whose FLOTILLA_REVISION is this (units already on it "
        "are left alone, so a rollback that stopped half-way can be run again)",
    )
    b.add_argument(
        "--units-per-wave",
        type=FlagType("--units-per-wave", Integer(1)),
        metavar="N",
        help="units updated at once, as the config's units_per_wave (default: 10%% of the selected units, at "
        "least 1; never every unit of the deployment)",
    )
    add_deprecated_alias(
        b, "--wave-size", "--units-per-wave", dest="units_per_wave", type=FlagType("--wave-size", Integer(1))
    )
    b.add_argument(
        "--wait",
        type=float,
        default=3600.0,
        metavar="SECONDS",
        help="how long each wave may take to be ready on the old revision before the rollback stops "
        "(default %(default)s: model load plus the health-check grace period)",
    )
    add_confirm_options(b)
    b.set_defaults(handler=run_rollback)
    return [b]


@dataclass
class Step:
    unit: Unit
    current: dict[str, Any]  # DescribeTaskDefinition of the service's task definition
    target: dict[str, Any] | None  # the revision to go back to; None = already there
    tags: list[dict[str, str]]

    @property
    def target_revision(self) -> str:
        doc = self.target or self.current
        return revision_of(doc)

    @property
    def reregister(self) -> bool:
        return self.target is not None and self.target.get("status") != "ACTIVE"


def revision_of(task_definition: dict[str, Any]) -> str:
    return container_env(task_definition).get(contract.ENV_REVISION, "?")


def _registerable(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: doc[k] for k in REGISTER_KEYS if k in doc}


def _describe(aws: Aws, ref: str) -> tuple[dict[str, Any], list[dict[str, str]]] | None:
    """The task definition and its tags; None when ECS no longer knows it (deleted)."""
    try:
        out = aws.ecs.describe_task_definition(taskDefinition=ref, include=["TAGS"])
    except botocore.exceptions.ClientError as err:
        if err.response.get("Error", {}).get("Code") == "ClientException":
            return None
        raise
    return out["taskDefinition"], out.get("tags", [])


def plan_step(aws: Aws, unit: Unit, *, to_revision: str | None) -> Step | None:
    """The revision `unit` goes back to, looking down from its current one: the newest whose
    FLOTILLA_REVISION is `to_revision`, or else the newest whose content differs from the current
    one (a retained revision identical to the current one, e.g. a deploy that changed nothing in
    the task, is no rollback). DescribeTaskDefinition returns INACTIVE revisions too (ECS task
    definition states: "You can retrieve an INACTIVE task definition by calling
    DescribeTaskDefinition"), which ListTaskDefinitions does not list once nothing references them.
    None when nothing below qualifies."""
    found = _describe(aws, unit.task_definition_arn)
    if found is None:
        raise OpsError(f"{unit.unit_id}: its task definition {arn_name(unit.task_definition_arn)} cannot be described")
    current, _ = found
    if to_revision is not None and container_env(current).get(contract.ENV_REVISION) == to_revision:
        return Step(unit=unit, current=current, target=None, tags=[])
    family, revision = current["family"], int(current["revision"])
    for rev in range(revision - 1, max(0, revision - 1 - LOOKBACK_REVISIONS), -1):
        found = _describe(aws, f"{family}:{rev}")
        if found is None:
            continue
        doc, tags = found
        if to_revision is not None:
            if container_env(doc).get(contract.ENV_REVISION) == to_revision:
                return Step(unit=unit, current=current, target=doc, tags=tags)
        elif _registerable(doc) != _registerable(current):
            return Step(unit=unit, current=current, target=doc, tags=tags)
    return None


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


def waves(fleet: Fleet, steps: list[Step], size: int) -> list[list[Step]]:
    """Waves of at most `size` units, cell by cell in deployment order (a wave never spans two
    cells: a cell is the deployment's blast radius)."""
    out: list[list[Step]] = []
    for cell in fleet.cells:
        in_cell = [s for s in steps if s.unit.cell_id == cell]
        out.extend(in_cell[i : i + size] for i in range(0, len(in_cell), size))
    return out


def wave_size(args: argparse.Namespace, fleet: Fleet, selected: int) -> int:
    size = args.units_per_wave or default_units_per_wave(selected)
    total = len(fleet.units)
    if total > 1 and size >= total:
        raise bad_arg(
            "--units-per-wave",
            size,
            f"would roll back all {total} units of deployment {fleet.deployment!r} at once "
            "(no unit left serving while they re-form)",
            f"give 1 to {total - 1}",
        )
    return size


def describe_target(step: Step) -> str:
    if step.target is None:
        return f"already on revision {step.target_revision}: left alone"
    how = " (INACTIVE: registered again as a new revision)" if step.reregister else ""
    return f"{arn_name(step.target['taskDefinitionArn'])} (revision {step.target_revision}){how}"


def run_rollback(args: argparse.Namespace, console: Console) -> int:
    aws = clients_for(args)
    fleet = fleet_from_args(args, aws, health=False)
    units = select_units(fleet, args)
    if not units:
        raise OpsError(f"no units selected in deployment {args.deployment!r}")
    size = wave_size(args, fleet, len(units))
    steps: list[Step] = []
    missing = []
    for u in units:
        step = plan_step(aws, u, to_revision=args.to_revision)
        if step is None:
            missing.append(u.unit_id)
        else:
            steps.append(step)
    if missing:
        what = (
            f"with FLOTILLA_REVISION {args.to_revision!r}" if args.to_revision else "that differs from the current one"
        )
        raise OpsError(
            f"no earlier task definition {what} for {', '.join(missing)} (looked {LOOKBACK_REVISIONS} "
            "revisions back): deploy the previous config with `cdk deploy` instead"
        )
    todo = [s for s in steps if s.target is not None]
    plan = waves(fleet, todo, size)
    t = Table(title="rollback", title_justify="left")
    for col in ("wave", "cell", "unit", "from", "to"):
        t.add_column(col)
    wave_of = {id(s): i + 1 for i, w in enumerate(plan) for s in w}
    for s in steps:
        t.add_row(
            str(wave_of.get(id(s), "-")),
            s.unit.cell_id,
            s.unit.unit_id,
            f"{arn_name(s.current['taskDefinitionArn'])} (revision {revision_of(s.current)})",
            describe_target(s),
        )
    console.print(t)
    if not todo:
        console.print("nothing to roll back: every selected unit is already on that revision")
        return 0
    console.print(
        f"{len(todo)} unit(s) in {len(plan)} wave(s) of at most {size}, cell by cell; each wave must be "
        f"ready on the old revision within {args.wait:.0f}s before the next starts. A unit's members "
        "drain and it re-forms; the router routes around it meanwhile."
    )
    console.print(
        "Afterwards the services differ from the templates (drift). The next `cdk deploy` of a cell whose "
        "task definitions changed puts the template's revision back; one that did not change leaves the "
        "rollback in place. Make them agree: revert the change in git and deploy the cells again "
        "(docs/runbooks/rollback-units.md)."
    )
    if not confirmed(args, console, f"roll back {len(todo)} unit(s)"):
        return 0
    # Each wave waits for readiness, which only the nodes' /health/ready can show: from where none
    # answers (outside the VPC) every wave would only run out of time after changing its units.
    unreadable = health_unreadable(fleet_from_args(args, aws).units, requested=True)
    if unreadable:
        raise CannotTell(
            f"no node answers /health/ready from here ({unreadable}), so no wave could be seen ready: "
            "nothing was changed; run the rollback inside the VPC (docs/runbooks/README.md, 'Where to run')"
        )
    done: list[str] = []
    for number, wave in enumerate(plan, start=1):
        targets = {s.unit.unit_id: apply_step(aws, s, console) for s in wave}
        try:
            wait_for_wave(args, aws, wave, targets, number=number, console=console)
        except OpsError as err:
            rest = [s for w in plan[number - 1 :] for s in w]
            raise OpsError(f"{err}; {resume_hint(done, rest)}") from None
        done.extend(targets)
    console.print(f"rolled back {len(done)} unit(s); follow with `flotilla rollout status` and `flotilla status`")
    return 0


def apply_step(aws: Aws, step: Step, console: Console) -> str:
    """Point the unit's service at the target, registering an INACTIVE target again first."""
    assert step.target is not None
    arn = str(step.target["taskDefinitionArn"])
    if step.reregister:
        params: dict[str, Any] = _registerable(step.target)
        if step.tags:
            params["tags"] = step.tags
        arn = aws.ecs.register_task_definition(**params)["taskDefinition"]["taskDefinitionArn"]
        console.print(
            f"{step.unit.unit_id}: registered {arn_name(arn)} from INACTIVE "
            f"{arn_name(step.target['taskDefinitionArn'])}"
        )
    aws.ecs.update_service(cluster=step.unit.cluster_arn, service=step.unit.service_name, taskDefinition=arn)
    console.print(f"{step.unit.unit_id}: -> {arn_name(arn)} (revision {step.target_revision})")
    return arn


def wait_for_wave(
    args: argparse.Namespace, aws: Aws, wave: list[Step], targets: dict[str, str], *, number: int, console: Console
) -> None:
    """Until every unit of the wave runs its target, its ECS deployment COMPLETED and the unit is
    ready (members answer /health/ready on the old revision). A FAILED deployment stops at once:
    the circuit breaker may be putting the unit back on the revision being rolled away from."""
    clusters = {s.unit.cluster_arn for s in wave}

    def check() -> tuple[bool, str]:
        now = {u.unit_id: u for u in fleet_from_args(args, aws, clusters=clusters).units if u.unit_id in targets}
        failed = sorted(uid for uid, u in now.items() if rollout_state(u) == FAILED)
        if failed:
            raise OpsError(f"wave {number}: the rollback deployment of {', '.join(failed)} FAILED")
        ready = [
            uid
            for uid, u in now.items()
            if u.task_definition_arn == targets[uid] and rollout_state(u) == COMPLETED and u.ready
        ]
        return len(ready) == len(targets), f"{len(ready)}/{len(targets)} units ready"

    wait_until(check, timeout_s=args.wait, description=f"wave {number}", console=console, poll_s=10.0)
    console.print(f"wave {number}: {', '.join(targets)} ready")


def resume_hint(done: list[str], rest: list[Step]) -> str:
    revisions = {s.target_revision for s in rest}
    units = " ".join(f"--unit {s.unit.unit_id}" for s in rest)
    done_text = f"rolled back: {', '.join(done)}; " if done else "no wave completed; "
    if len(revisions) == 1:
        (rev,) = revisions
        return f"{done_text}to go on once the cause is understood: flotilla rollback {units} --to-revision {rev}"
    return f"{done_text}left as they were or mid-way: {', '.join(s.unit.unit_id for s in rest)}"
