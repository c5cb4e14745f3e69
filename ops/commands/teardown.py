"""`flotilla teardown` and `flotilla shrink`: remove a whole deployment, or the units and cells a
smaller `units` leaves behind, without terminating an instance while a unit task still runs on it.

Neither `cdk destroy` nor `cdk deploy` can do this safely. Each unit's capacity provider uses
managed termination protection, so ECS protects its instances from scale-in, and CloudFormation
does not force-delete an Auto Scaling group whose instances are protected: deleting a cell stack
hangs (aws/aws-cdk#18179, aws/aws-cdk#14732), and so does a `cdk deploy` that removes units from
a cell. And `cdk deploy --all` never deletes a stack that left the app (aws/aws-cdk#13676), so a
fleet shrunk past a cell boundary leaves its old Cell-<n> stacks running. Order per unit:
1. desired count 0: ECS sends SIGTERM, each node drains and exits, ECS deregisters it from Cloud Map;
2. wait until every task of the service is STOPPED (lastStatus: a draining task already has
   desiredStatus STOPPED, and ECS no longer counts it in a container instance's runningTasksCount);
3. check again that no task of any service runs on the unit's instances, then remove their
   scale-in protection and set the group's minimum and desired capacity to 0;
4. wait until the group has no instances; deregister container instances EC2 terminated but ECS
   still lists ("stopped container instances or instances with disconnected agents aren't
   automatically deregistered when terminated", ECS DeregisterContainerInstance), because ECS
   refuses to delete a cluster with registered container instances (ECS DeleteCluster).
Then stacks are deleted one at a time, never one whose exports another remaining stack imports
("you can't delete the stack that is exporting the output value", CloudFormation Fn::ImportValue),
and never a stack holding a Cloud Map service that still lists instances (Cloud Map DeleteService
fails while instances are registered).
"""

from __future__ import annotations

import argparse
import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import botocore.exceptions
from rich.console import Console

import contract
from contract import apikeys
from contract.declare import Integer
from ops.aws import Aws, chunks, clients_for
from ops.commands import Subparsers
from ops.commands.common import add_confirm_options, confirmed, fleet_from_args, wait_until
from ops.errors import OpsError, bad_arg, check_arg
from ops.fleet import DEPLOYMENT_TAG, DRAINED_TAG, STACK_NAME_TAG, UNIT_TAG, Unit, container_instances, live_tasks

# Seconds between polls while waiting (tests set it to 0).
POLL_S = 5.0
# Deploy order of the stacks stacks/deployment.py builds (cells between Discovery and Front);
# deletion runs it backwards, always subject to the import rule above.
DEPLOY_ORDER = ("Network", "Discovery", "Cell", "Front", "Observability", "Router")
_UNIT_ID_RE = re.compile(rf"^{contract.UNIT_ID_PATTERN}$")
_GONE = ("DELETE_COMPLETE",)


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--wait",
        type=float,
        default=3600,
        metavar="SECONDS",
        help="budget for each step that waits (tasks to stop, instances to go, a stack to delete); default %(default)s",
    )
    add_confirm_options(p)


def add_parser(sub: Subparsers) -> list[argparse.ArgumentParser]:
    t = sub.add_parser(
        "teardown",
        help="delete the whole deployment: drain every unit, release its instances, delete every stack",
        description="Drain every unit (its nodes finish in-flight requests), release the Trainium "
        "instances once no task runs on them, then delete every CloudFormation stack of the "
        "deployment in dependency order. Dry run unless confirmed.",
    )
    t.add_argument(
        "--keep-keys",
        action="store_true",
        help="keep the API-key secret (flotilla/<deployment>/api-keys): a redeploy under this name then accepts "
        "the same keys; by default it is deleted for good, last",
    )
    _add_common(t)
    t.set_defaults(handler=run_teardown)
    s = sub.add_parser(
        "shrink",
        help="before lowering `units`: drain and release the units that go, delete cells left empty",
        description="For a new, smaller `units`: drain the units it no longer has (the highest "
        "ones), release their instances once no task runs on them, and delete the Cell stacks "
        "left without units. Run it before `cdk deploy` of the smaller config. Dry run unless confirmed.",
    )
    s.add_argument("--units", type=int, required=True, metavar="N", help="the new value of `units` in the config")
    s.add_argument(
        "--units-per-cell",
        type=int,
        default=contract.MAX_UNITS_PER_CELL,
        metavar="N",
        help="`units_per_cell` of the config; default %(default)s",
    )
    _add_common(s)
    s.set_defaults(handler=run_shrink)
    return [t, s]


# --- what there is ------------------------------------------------------------------------------
@dataclass
class Stack:
    name: str
    stack_id: str
    status: str
    exports: set[str] = field(default_factory=set)
    imports: set[str] = field(default_factory=set)

    def kind(self, deployment: str) -> str:
        """Network, Discovery, Cell, Front, ... from <deployment>-<id>."""
        suffix = self.name[len(deployment) + 1 :]
        return "Cell" if re.fullmatch(r"Cell-\d+", suffix) else suffix


def _imports_of(template: Any) -> set[str]:
    """Export names a template imports (literal Fn::ImportValue names, as CDK writes them)."""
    if isinstance(template, str):
        template = json.loads(template)
    found: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, dict):
            name = node.get("Fn::ImportValue")
            if isinstance(name, str):
                found.add(name)
            for v in node.values():
                visit(v)
        elif isinstance(node, list):
            for v in node:
                visit(v)

    visit(template)
    return found


def deployment_stacks(aws: Aws, deployment: str) -> dict[str, Stack]:
    """The deployment's live CloudFormation stacks (<deployment>-<id>), with exports and imports."""
    ids = "|".join(r"Cell-\d+" if kind == "Cell" else kind for kind in DEPLOY_ORDER)
    pattern = re.compile(rf"^{re.escape(deployment)}-({ids})$")
    out: dict[str, Stack] = {}
    for page in aws.cloudformation.get_paginator("list_stacks").paginate():
        for summary in page.get("StackSummaries", []):
            if summary["StackStatus"] in _GONE or not pattern.match(summary["StackName"]):
                continue
            out[summary["StackName"]] = Stack(summary["StackName"], summary["StackId"], summary["StackStatus"])
    for stack in out.values():
        (described,) = aws.cloudformation.describe_stacks(StackName=stack.stack_id)["Stacks"]
        stack.exports = {o["ExportName"] for o in described.get("Outputs", []) if o.get("ExportName")}
        body = aws.cloudformation.get_template(StackName=stack.stack_id)["TemplateBody"]
        stack.imports = _imports_of(body)
    return out


def deletion_order(stacks: dict[str, Stack], deployment: str) -> list[Stack]:
    """Reverse deploy order (highest cell first), each stack only after every stack importing it."""

    def rank(s: Stack) -> tuple[int, int]:
        kind = s.kind(deployment)
        position = DEPLOY_ORDER.index(kind) if kind in DEPLOY_ORDER else len(DEPLOY_ORDER)
        cell = int(s.name.rsplit("-", 1)[1]) if kind == "Cell" else 0
        return (-position, -cell)

    remaining = sorted(stacks.values(), key=rank)
    ordered: list[Stack] = []
    while remaining:
        imported = {name for s in remaining for name in s.imports}
        free = next((s for s in remaining if not (s.exports & imported)), None)
        if free is None:
            names = ", ".join(s.name for s in remaining)
            raise OpsError(f"stacks {names} import each other's exports: delete them by hand")
        ordered.append(free)
        remaining.remove(free)
    return ordered


def unit_position(unit_id: str, units_per_cell: int) -> int:
    """0-based position of a unit in the fleet (stacks/config.py fills cells in order)."""
    m = _UNIT_ID_RE.match(unit_id)
    if not m:
        raise OpsError(f"unit id {unit_id!r} is not cell<c>-unit<i>: not a unit this command knows how to place")
    cell, index = int(m.group(1)), int(m.group(2))
    if index >= units_per_cell:
        raise bad_arg(
            "--units-per-cell",
            units_per_cell,
            f"is too small: unit {unit_id} exists, so the deployed units_per_cell is larger",
            "pass the config's units_per_cell",
        )
    return cell * units_per_cell + index


def unit_groups(aws: Aws, deployment: str, unit_id: str) -> list[dict[str, Any]]:
    """The unit's Auto Scaling groups: tagged with the deployment and the unit (stacks/unit.py)."""
    filters = [
        {"Name": f"tag:{DEPLOYMENT_TAG}", "Values": [deployment]},
        {"Name": f"tag:{UNIT_TAG}", "Values": [unit_id]},
    ]
    return _groups(aws, filters)


def stack_groups(aws: Aws, stack_name: str) -> list[dict[str, Any]]:
    """Every Auto Scaling group CloudFormation created in a stack (its stack-name tag)."""
    return _groups(aws, [{"Name": f"tag:{STACK_NAME_TAG}", "Values": [stack_name]}])


def _groups(aws: Aws, filters: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for page in aws.autoscaling.get_paginator("describe_auto_scaling_groups").paginate(Filters=filters):
        out.extend(page.get("AutoScalingGroups", []))
    return out


# --- the steps ------------------------------------------------------------------------------------
@dataclass
class Release:
    """What retiring some units (and cells) touches."""

    units: list[Unit]
    clusters: set[str]  # cluster ARNs whose instances may be released
    groups: dict[str, dict[str, Any]]  # ASG name -> description

    @property
    def instances(self) -> list[str]:
        return sorted(i["InstanceId"] for g in self.groups.values() for i in g.get("Instances", []))


def plan_release(aws: Aws, deployment: str, units: Sequence[Unit], stacks: Iterable[Stack]) -> Release:
    groups: dict[str, dict[str, Any]] = {}
    for u in units:
        groups.update({g["AutoScalingGroupName"]: g for g in unit_groups(aws, deployment, u.unit_id)})
    clusters = {u.cluster_arn for u in units}
    for stack in stacks:
        groups.update({g["AutoScalingGroupName"]: g for g in stack_groups(aws, stack.name)})
        if stack.kind(deployment) == "Cell":
            # stacks/cell.py names the cell's cluster <deployment>-cell<n>: its instances are
            # checked for tasks too, even those of units no longer listed as services.
            clusters.add(f"{deployment}-cell{stack.name.rsplit('-', 1)[1]}")
    return Release(units=list(units), clusters=clusters, groups=groups)


def drain_services(aws: Aws, units: Sequence[Unit], *, timeout_s: float, console: Console) -> None:
    """Steps 1 and 2: desired count 0, then wait until every task of the services has STOPPED."""
    for u in units:
        if u.desired:
            aws.ecs.tag_resource(resourceArn=u.service_arn, tags=[{"key": DRAINED_TAG, "value": str(u.desired)}])
            aws.ecs.update_service(cluster=u.cluster_arn, service=u.service_name, desiredCount=0)
    console.print(f"{len(units)} unit service(s) at desired count 0; their nodes drain and exit")

    def check() -> tuple[bool, str]:
        left = 0
        for u in units:
            group = f"service:{u.service_name}"
            left += sum(
                1 for t in live_tasks(aws, u.cluster_arn, serviceName=u.service_name) if t.get("group") == group
            )
        return left == 0, f"{left} task(s) still running or draining"

    wait_until(check, timeout_s=timeout_s, description="unit tasks stopping", console=console, poll_s=POLL_S)


def release_instances(aws: Aws, release: Release, *, timeout_s: float, console: Console) -> None:
    """Steps 3 and 4: unprotect and scale the groups to 0 once nothing runs on their instances."""
    if not release.groups:
        return
    wanted = set(release.instances)
    busy: list[str] = []
    for cluster in release.clusters:
        for ci in container_instances(aws, cluster):
            if ci.get("ec2InstanceId") not in wanted:
                continue
            for task in live_tasks(aws, cluster, containerInstance=ci["containerInstanceArn"]):
                busy.append(f"{ci['ec2InstanceId']} runs {task['taskArn']} ({task.get('group', '?')})")
    if busy:
        raise OpsError("refusing to release instances that still run tasks: " + "; ".join(busy))
    for name, group in sorted(release.groups.items()):
        protected = [i["InstanceId"] for i in group.get("Instances", []) if i.get("ProtectedFromScaleIn")]
        for batch in chunks(protected, 50):
            aws.autoscaling.set_instance_protection(
                AutoScalingGroupName=name, InstanceIds=list(batch), ProtectedFromScaleIn=False
            )
        aws.autoscaling.update_auto_scaling_group(AutoScalingGroupName=name, MinSize=0, DesiredCapacity=0)
    console.print(f"{len(release.groups)} Auto Scaling group(s) at 0, scale-in protection removed")

    def check() -> tuple[bool, str]:
        left = 0
        for batch in chunks(sorted(release.groups), 50):
            for g in aws.autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=list(batch))[
                "AutoScalingGroups"
            ]:
                left += len(g.get("Instances", []))
        return left == 0, f"{left} instance(s) terminating"

    wait_until(check, timeout_s=timeout_s, description="instances terminating", console=console, poll_s=POLL_S)
    for cluster in release.clusters:
        stale = [
            ci["containerInstanceArn"]
            for ci in container_instances(aws, cluster)
            if ci.get("ec2InstanceId") in wanted and ci.get("status") != "INACTIVE"
        ]
        for arn in stale:
            aws.ecs.deregister_container_instance(cluster=cluster, containerInstance=arn, force=True)


def _cloudmap_services(aws: Aws, stack: Stack) -> list[str]:
    ids: list[str] = []
    for page in aws.cloudformation.get_paginator("list_stack_resources").paginate(StackName=stack.stack_id):
        ids.extend(
            r["PhysicalResourceId"]
            for r in page.get("StackResourceSummaries", [])
            if r.get("ResourceType") == "AWS::ServiceDiscovery::Service" and r.get("PhysicalResourceId")
        )
    return ids


def delete_stacks(aws: Aws, ordered: Sequence[Stack], *, timeout_s: float, console: Console) -> None:
    for stack in ordered:
        services = _cloudmap_services(aws, stack)
        if services:

            def registered() -> tuple[bool, str]:
                n = sum(
                    len(page.get("Instances", []))
                    for sid in services
                    for page in aws.servicediscovery.get_paginator("list_instances").paginate(ServiceId=sid)
                )
                return n == 0, f"{n} instance(s) still registered in Cloud Map"

            wait_until(
                registered,
                timeout_s=timeout_s,
                description=f"{stack.name}: Cloud Map empty",
                console=console,
                poll_s=POLL_S,
            )
        aws.cloudformation.delete_stack(StackName=stack.stack_id)

        def deleted(stack: Stack = stack) -> tuple[bool, str]:
            (described,) = aws.cloudformation.describe_stacks(StackName=stack.stack_id)["Stacks"]
            status = described["StackStatus"]
            if status == "DELETE_FAILED":
                raise OpsError(f"{stack.name}: DELETE_FAILED ({described.get('StackStatusReason', 'see its events')})")
            return status == "DELETE_COMPLETE", status

        wait_until(deleted, timeout_s=timeout_s, description=f"deleting {stack.name}", console=console, poll_s=POLL_S)
        console.print(f"{stack.name}: deleted")


# --- the commands ---------------------------------------------------------------------------------
def _print_plan(console: Console, release: Release, stacks: Sequence[Stack]) -> None:
    tasks = sum(u.desired for u in release.units)
    console.print(
        f"  1. drain {len(release.units)} unit(s): desired count -> 0 ({tasks} task(s) finish in-flight work)"
    )
    for u in release.units:
        console.print(f"       {u.unit_id} ({u.cell_id}, service {u.service_name}, desired {u.desired})")
    console.print(
        f"  2. once no task runs on them: release {len(release.instances)} instance(s) of "
        f"{len(release.groups)} Auto Scaling group(s) (scale-in protection off, desired 0)"
    )
    if stacks:
        console.print("  3. delete these stacks, one at a time, in this order:")
        for s in stacks:
            console.print(f"       {s.name}")


def keys_secret(aws: Aws, deployment: str) -> dict[str, Any] | None:
    """The deployment's API-key secret (DescribeSecret), None when there is none."""
    try:
        return dict(aws.secretsmanager.describe_secret(SecretId=apikeys.secret_name(deployment)))
    except botocore.exceptions.ClientError as err:
        if err.response.get("Error", {}).get("Code") == "ResourceNotFoundException":
            return None
        raise


def delete_keys_secret(aws: Aws, name: str, console: Console) -> None:
    """Delete the keys' secret for good. Not with a recovery window: while a secret is scheduled for
    deletion, Secrets Manager refuses to create or write one of that name (InvalidRequestException, "The
    secret is scheduled for deletion", Secrets Manager API reference), so a redeploy under the same
    name could not issue keys for 7 to 30 days (DeleteSecret: "The minimum recovery window is 7 days"),
    and restoring it would bring back exactly the keys a new deployment must not accept.
    ForceDeleteWithoutRecovery deletes it without a recovery window ("you have no opportunity to recover
    the secret", DeleteSecret); --keep-keys is the way to keep the keys, and teardown asks first."""
    aws.secretsmanager.delete_secret(SecretId=name, ForceDeleteWithoutRecovery=True)
    console.print(f"{name}: deleted (its keys work nowhere any more)")


def run_teardown(args: argparse.Namespace, console: Console) -> int:
    aws = clients_for(args)
    fleet = fleet_from_args(args, aws, health=False)
    stacks = deletion_order(deployment_stacks(aws, args.deployment), args.deployment)
    secret = None if args.keep_keys else keys_secret(aws, args.deployment)
    if not stacks and not fleet.units and secret is None:
        console.print(f"deployment {args.deployment!r}: no stacks, no units, no API keys: nothing to tear down")
        return 0
    release = plan_release(aws, args.deployment, fleet.units, stacks)
    console.print(f"teardown {args.deployment}:")
    _print_plan(console, release, stacks)
    name = apikeys.secret_name(args.deployment)
    if secret is not None:
        console.print(
            f"  4. delete the API-key secret {name} for good, without a recovery window: a redeploy under this "
            "name starts with no keys (--keep-keys keeps it)"
        )
    kept = "the Front stack's access-log bucket (DeletionPolicy Retain) and the CDK bootstrap stack"
    console.print(f"  kept: {kept}" + (f", and {name} (--keep-keys)" if args.keep_keys else ""))
    if not confirmed(args, console, f"tear down deployment {args.deployment}"):
        return 0
    drain_services(aws, release.units, timeout_s=args.wait, console=console)
    release_instances(aws, release, timeout_s=args.wait, console=console)
    delete_stacks(aws, stacks, timeout_s=args.wait, console=console)
    if secret is not None:
        delete_keys_secret(aws, name, console)
    console.print(f"deployment {args.deployment}: torn down")
    return 0


def run_shrink(args: argparse.Namespace, console: Console) -> int:
    check_arg("--units", args.units, Integer(1, why="to remove everything use `flotilla teardown`"))
    check_arg("--units-per-cell", args.units_per_cell, Integer(1, contract.MAX_UNITS_PER_CELL))
    aws = clients_for(args)
    fleet = fleet_from_args(args, aws, health=False)
    leaving = [u for u in fleet.units if unit_position(u.unit_id, args.units_per_cell) >= args.units]
    keep_cells = math.ceil(args.units / args.units_per_cell)
    stacks = deployment_stacks(aws, args.deployment)
    empty_cells = [
        s
        for s in deletion_order(stacks, args.deployment)
        if s.kind(args.deployment) == "Cell" and int(s.name.rsplit("-", 1)[1]) >= keep_cells
    ]
    if not leaving and not empty_cells:
        console.print(f"{len(fleet.units)} unit(s) deployed: nothing beyond --units {args.units} to remove")
        return 0
    release = plan_release(aws, args.deployment, leaving, empty_cells)
    console.print(f"shrink {args.deployment} to {args.units} unit(s) ({keep_cells} cell(s)):")
    _print_plan(console, release, empty_cells)
    console.print(
        f"  then: deploy the config with units: {args.units} (cdk deploy --all); it removes the drained "
        "units' resources from the cells that stay and the alarms of the deleted cells"
    )
    if not confirmed(args, console, f"shrink deployment {args.deployment} to {args.units} unit(s)"):
        return 0
    drain_services(aws, release.units, timeout_s=args.wait, console=console)
    release_instances(aws, release, timeout_s=args.wait, console=console)
    delete_stacks(aws, empty_cells, timeout_s=args.wait, console=console)
    console.print(f"shrunk to {args.units} unit(s): now `cdk deploy --all` the config with units: {args.units}")
    return 0
