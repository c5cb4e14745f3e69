"""Updates, not just creates: every change operators make to a deployed config, diffed the way
CloudFormation will apply it.

For each change in CHANGES both configs are synthesized once, and the pinned CDK CLI compares
each stack that changed, offline: `cdk diff --app <after assembly> --exclusively --template
<before.json> <stack>` (CLI 2.1148.1: `--template` "The path to the CloudFormation template to
compare with"; `--exclusively` "Only diff requested stacks, don't include dependencies"; comparing
to a fixed template needs one stack and makes no AWS call, lib/cli/cdk-toolkit.js:276-290). Every
replacement or deletion it reports must be on ALLOWED with its reason; the ALB, its listeners,
target groups, clusters and the Cloud Map namespace are never replaced; and no export another stack
imports may disappear or change, which CloudFormation refuses ("After another stack imports an
output value, you can't delete the stack that is exporting the output value or modify the exported
output value", Fn::ImportValue, CloudFormation user guide).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from synth_helpers import CERTIFICATE_ARN, REPO_ROOT, config_with, synthesize

from ops.commands import check_update

IMAGE_A = "123456789012.dkr.ecr.us-east-1.amazonaws.com/flotilla:1.0"
IMAGE_B = "123456789012.dkr.ecr.us-east-1.amazonaws.com/flotilla:1.1"
# Three units in two cells (2 + 1) with a prebuilt image: every change below has a cell to act on.
BASE = {"units": 3, "units_per_cell": 2, "image": IMAGE_A}
STAGING = yaml.safe_load((REPO_ROOT / "examples" / "staging.yaml").read_text())
VARIANTS: dict[str, dict] = {
    "base": BASE,
    "revision": {**BASE, "revision": "2"},
    "image": {**BASE, "image": IMAGE_B},
    "units-4": {**BASE, "units": 4},  # Cell-1 gains its second unit
    "units-5": {**BASE, "units": 5},  # a third cell
    "https": {**BASE, "certificate_arn": CERTIFICATE_ARN},
    "alarm-email": {**BASE, "alarm_email": "oncall@example.com"},
    "router": {**BASE, "router": {"desired_count": 3, "max_count": 12}},
    "drain": {**BASE, "node": {"drain_timeout_s": 60}},
    "replace": {**BASE, "unit_rollout": "replace"},
    # One cell of 4 with `replace`: the wave size moves the cell's ready-units alarm threshold
    # (4 - 1 - 1 = 2 with waves of 1, 4 - 2 - 1 = 1 with waves of 2) and the DependsOn chain.
    "replace-cell-4": {**BASE, "units": 4, "units_per_cell": 4, "unit_rollout": "replace"},
    "replace-cell-4-waves-2": {**BASE, "units": 4, "units_per_cell": 4, "unit_rollout": "replace", "units_per_wave": 2},
    "trn1n": {**BASE, "instance_type": "trn1n.32xlarge"},
    "trn1n-replace": {**BASE, "instance_type": "trn1n.32xlarge", "unit_rollout": "replace"},
    "azs": {**BASE, "availability_zones": ["us-east-1a", "us-east-1b", "us-east-1c"]},
    "drained": {**BASE, "drained_units": ["cell0-unit1"]},
    "drained-revision": {**BASE, "drained_units": ["cell0-unit1"], "revision": "2"},
    "azs-abd": {**BASE, "availability_zones": ["us-east-1a", "us-east-1b", "us-east-1d"]},
    "azs-units-2": {
        **BASE,
        "availability_zones": ["us-east-1a", "us-east-1b", "us-east-1c"],
        "capacity": {"availability_zones": ["us-east-1b", "us-east-1c"]},
    },
    # A third unit AZ after the two: cell0-unit0 and cell0-unit1 stay in b and c, cell1-unit0 moves b -> a.
    "azs-units-3": {
        **BASE,
        "availability_zones": ["us-east-1a", "us-east-1b", "us-east-1c"],
        "capacity": {"availability_zones": ["us-east-1b", "us-east-1c", "us-east-1a"]},
    },
    "cells-of-1": {**BASE, "units_per_cell": 1},
    "internet-facing": {
        **BASE,
        "certificate_arn": CERTIFICATE_ARN,
        "front": {"scheme": "internet-facing", "client_cidrs": ["203.0.113.0/24"]},
    },
    # The staging fleet as shipped (x86 units, reference engine, SmolLM2 baked into a built image).
    "staging": STAGING,
    "staging-revision": {**STAGING, "revision": "2"},
    "staging-m6i-xlarge": {**STAGING, "instance_type": "m6i.xlarge"},
    # With the scaler (docs/scaling.md): a floor of one, the other units read their counts from it.
    "scaled": {**BASE, "scaling": {"floor": 1}},
    "scaled-revision": {**BASE, "scaling": {"floor": 1}, "revision": "2"},
    "scaled-units-4": {**BASE, "units": 4, "scaling": {"floor": 1}},
    "scaled-floor-3": {**BASE, "scaling": {"floor": 3}},
}
# change -> (before variant, after variant)
CHANGES: dict[str, tuple[str, str]] = {
    "bump revision": ("base", "revision"),
    "change image": ("base", "image"),
    "units +1 inside a cell": ("base", "units-4"),
    "units -1 inside a cell": ("units-4", "base"),
    "units +1 across a cell boundary": ("units-4", "units-5"),
    "units -1 across a cell boundary": ("units-5", "units-4"),
    "add certificate_arn": ("base", "https"),
    "remove certificate_arn": ("https", "base"),
    "add alarm_email": ("base", "alarm-email"),
    "change router counts": ("base", "router"),
    "change node.drain_timeout_s": ("base", "drain"),
    "switch unit_rollout": ("base", "replace"),
    "change units_per_wave": ("replace-cell-4", "replace-cell-4-waves-2"),
    "change instance_type (surge)": ("base", "trn1n"),
    "change instance_type (replace)": ("replace", "trn1n-replace"),
    "bump revision (staging)": ("staging", "staging-revision"),
    "change instance_type (staging)": ("staging", "staging-m6i-xlarge"),
    "turn scaling on": ("base", "scaled"),
    "bump revision (scaled)": ("scaled", "scaled-revision"),
    "raise the ceiling (scaled)": ("scaled", "scaled-units-4"),
    "lower the floor (scaled)": ("scaled-floor-3", "scaled"),
}
# Changes the review must refuse: what they break and how the operator does them instead.
REFUSED_CHANGES: dict[str, tuple[str, str]] = {
    "narrow capacity.availability_zones": ("azs", "azs-units-2"),
    "swap an AZ of availability_zones": ("azs", "azs-abd"),
}

TASK_DEFINITION_REASON = (
    "every property of an ECS task definition is create-only (cfn-lint 1.58 schema of "
    "AWS::ECS::TaskDefinition), so a changed container (image, environment) is a new revision: that "
    "is how ECS rolls the service, and the service itself is only updated"
)
UNIT_GONE_REASON = (
    "the unit left the config: `flotilla shrink` drained its tasks and released its instances "
    "before this deploy (docs/runbooks/scale-for-peak.md), so deleting its resources neither hangs "
    "on scale-in protection nor stops a task"
)
# (change, stack, resource type, logical id prefix, impact) -> reason
ALLOWED: dict[tuple[str, str, str, str, str], str] = {
    ("bump revision", "Cell-0", "AWS::ECS::TaskDefinition", "Unit", "replace"): TASK_DEFINITION_REASON,
    ("bump revision", "Cell-1", "AWS::ECS::TaskDefinition", "Unit", "replace"): TASK_DEFINITION_REASON,
    ("change image", "Cell-0", "AWS::ECS::TaskDefinition", "Unit", "replace"): TASK_DEFINITION_REASON,
    ("change image", "Cell-1", "AWS::ECS::TaskDefinition", "Unit", "replace"): TASK_DEFINITION_REASON,
    ("change image", "Router", "AWS::ECS::TaskDefinition", "TaskDefinition", "replace"): TASK_DEFINITION_REASON,
    ("change router counts", "Router", "AWS::ECS::TaskDefinition", "TaskDefinition", "replace"): (
        TASK_DEFINITION_REASON + "; each router enforces 1/n of every API key's limits, with n the configured "
        "router count in its environment (FLOTILLA_LIMIT_ROUTERS), so a new count is a new router revision, "
        "rolled out blue/green"
    ),
    **{
        (change, cell, "AWS::ECS::TaskDefinition", "Unit", "replace"): TASK_DEFINITION_REASON
        for change in ("bump revision (staging)", "change instance_type (staging)")
        for cell in ("Cell-0", "Cell-1")
    },
    **{
        ("bump revision (scaled)", cell, "AWS::ECS::TaskDefinition", "Unit", "replace"): TASK_DEFINITION_REASON
        for cell in ("Cell-0", "Cell-1")
    },
    **{
        (change, "Observability", "AWS::CloudWatch::Alarm", "ReadyUnitsCell1", "destroy"): (
            "with the scaler a cell keeps ready only its share of the floor: Cell-1 then holds none, its units "
            "come and go, and a ready-units alarm there would page for the scaler's own scale-in"
        )
        for change in ("turn scaling on", "lower the floor (scaled)")
    },
    ("change node.drain_timeout_s", "Cell-0", "AWS::ECS::TaskDefinition", "Unit", "replace"): TASK_DEFINITION_REASON,
    ("change node.drain_timeout_s", "Cell-1", "AWS::ECS::TaskDefinition", "Unit", "replace"): TASK_DEFINITION_REASON,
    **{
        (change, cell, "AWS::ECS::TaskDefinition", "Unit", "replace"): (
            TASK_DEFINITION_REASON + "; the new revision maps the new instance type's devices and may run only "
            "on that type (its memberOf ecs.instance-type constraint), so ECS places it on new instances"
        )
        for change in ("change instance_type (surge)", "change instance_type (replace)")
        for cell in ("Cell-0", "Cell-1")
    },
    **{
        ("units -1 inside a cell", "Cell-1", type_, "Unit1", "destroy"): UNIT_GONE_REASON
        for type_ in (
            "AWS::EC2::PlacementGroup",
            "AWS::EC2::SecurityGroup",
            "AWS::EC2::SecurityGroupIngress",
            "AWS::EC2::SecurityGroupEgress",
            "AWS::EC2::LaunchTemplate",
            "AWS::AutoScaling::AutoScalingGroup",
            "AWS::ECS::CapacityProvider",
            "AWS::ECS::Service",
        )
    },
    ("units -1 inside a cell", "Cell-1", "AWS::ECS::TaskDefinition", "Unit1", "orphan"): (
        "unit task definitions carry DeletionPolicy/UpdateReplacePolicy Retain so `flotilla rollback` "
        "finds earlier revisions (CloudFormation would deregister them, aws/aws-cdk#24372); a retained "
        "revision costs nothing and docs/runbooks/teardown.md deregisters it"
    ),
    **{
        (change, "Router", "AWS::ECS::TaskDefinition", "TaskDefinition", "replace"): (
            "the router's environment names every cell's Cloud Map service, so a cell that comes or goes "
            "is a new router task definition, which the Router service rolls out blue/green"
        )
        for change in ("units +1 across a cell boundary", "units -1 across a cell boundary")
    },
    (
        "units -1 across a cell boundary",
        "Discovery",
        "AWS::ServiceDiscovery::Service",
        "NamespaceUnitsCell2",
        "destroy",
    ): (
        "the Cloud Map service of Cell-2, which left the config: `flotilla shrink` deleted Cell-2 (its only "
        "importer, whose tasks registered there) before this deploy, so the service is empty"
    ),
    ("units -1 across a cell boundary", "Observability", "AWS::CloudWatch::Alarm", "ReadyUnitsCell2", "destroy"): (
        "the ready-units alarm of Cell-2, which left the config (its stack is deleted by `flotilla shrink`)"
    ),
}
# Stacks that leave the app: CloudFormation never deletes them on `cdk deploy` (aws/aws-cdk#13676).
STACKS_LEAVING: dict[tuple[str, str], str] = {
    ("units -1 across a cell boundary", "Cell-2"): "`flotilla shrink` drains and deletes it before the deploy",
}
NEVER_REPLACED = (
    "AWS::ElasticLoadBalancingV2::LoadBalancer",
    "AWS::ElasticLoadBalancingV2::Listener",
    "AWS::ElasticLoadBalancingV2::TargetGroup",
    "AWS::ECS::Cluster",
    "AWS::ServiceDiscovery::HttpNamespace",
)

# `cdk diff` resource lines: "[~] AWS::Type path LogicalId replace". Impact words from CLI
# 2.1148.1 lib/index.js:98598-98613 (formatImpact): "may be replaced", "replace", "destroy", "orphan".
_RESOURCE_LINE = re.compile(r"^\[([-+~])\] (AWS::\S+|Custom::\S+) (.*?)(?: (replace|may be replaced|destroy|orphan))?$")


@dataclass(frozen=True)
class Finding:
    stack: str
    type_: str
    logical_id: str
    impact: str  # replace | may be replaced | destroy | orphan


def parse_diff(stack: str, output: str) -> list[Finding]:
    findings = []
    for line in output.splitlines():
        m = _RESOURCE_LINE.match(line.strip())
        if m and m.group(4):
            logical_id = m.group(3).split()[-1]
            findings.append(Finding(stack, m.group(2), logical_id, m.group(4)))
    return findings


def cli_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        {
            "PATH": f"{REPO_ROOT / 'node_modules' / 'node' / 'bin'}{os.pathsep}{env['PATH']}",
            "CDK_HOME": str(home),
            "CDK_DISABLE_CLI_TELEMETRY": "true",
            "npm_config_update_notifier": "false",
            "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20",
            "FORCE_COLOR": "0",
            # Offline: anything reaching for the network hits a dead proxy.
            "HTTPS_PROXY": "http://127.0.0.1:9",
            "HTTP_PROXY": "http://127.0.0.1:9",
            "AWS_EC2_METADATA_DISABLED": "true",
        }
    )
    return env


def cdk_diff(after_outdir: Path, stack: str, before_template: dict, workdir: Path) -> str:
    before = workdir / f"{stack}.before.json"
    before.write_text(json.dumps(before_template))
    proc = subprocess.run(
        [
            str(REPO_ROOT / "node_modules" / ".bin" / "cdk"),
            "diff",
            "--app",
            str(after_outdir),
            "--exclusively",
            "--template",
            str(before),
            stack,
            "-o",
            str(workdir / "cdk.out"),
        ],
        cwd=REPO_ROOT,
        env=cli_env(workdir / "cdk-home"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    output = proc.stdout + proc.stderr
    assert f"Stack {stack}" in output, output[-2000:]
    return output


def diff_stacks(after_outdir: Path, before_templates: dict, stacks: list[str], workdir: Path) -> list[str]:
    """`cdk diff` of each stack in `stacks`, in that order. Each call is a separate CLI process, nearly
    all of it node's start-up, so two run at a time (the CI machine has two cores), each in its own
    work directory (its before template, CDK_HOME and -o)."""

    def one(stack: str) -> str:
        own = workdir / f"diff-{stack}"
        own.mkdir(exist_ok=True)
        return cdk_diff(after_outdir, stack, before_templates[stack], own)

    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(one, stacks))


@pytest.fixture(scope="module")
def synths(tmp_path_factory):
    """Each variant synthesized once for the whole module."""
    cache: dict = {}

    def get(name: str):
        if name not in cache:
            cache[name] = synthesize(config_with(**VARIANTS[name]), tmp_path_factory.mktemp(f"update-{name}"))
        return cache[name]

    return get


def imported_exports(synth, gone: frozenset[str] = frozenset()) -> set[str]:
    """Export names the stacks import, leaving out the stacks in `gone` (deleted before the deploy)."""
    names: set[str] = set()
    for stack_id, template in synth.templates.items():
        if stack_id in gone:
            continue
        names |= set(re.findall(r'"Fn::ImportValue": "([^"]+)"', json.dumps(template)))
    return names


def export_problems(before, after, replaced: set[tuple[str, str]], gone: frozenset[str] = frozenset()) -> list[str]:
    """Exports another stack imports (before the deploy) that the update removes or changes. A stack
    in `gone` (STACKS_LEAVING: `flotilla shrink` deletes it first) no longer imports anything."""
    problems = []
    in_use = imported_exports(before, gone)
    for stack_id, template in before.templates.items():
        after_outputs = {
            o["Export"]["Name"]: o["Value"]
            for o in after.templates.get(stack_id, {}).get("Outputs", {}).values()
            if "Export" in o
        }
        for output in template.get("Outputs", {}).values():
            name = output.get("Export", {}).get("Name")
            if name not in in_use:
                continue
            if name not in after_outputs:
                problems.append(f"{stack_id}: export {name} removed while imported")
            elif after_outputs[name] != output["Value"]:
                problems.append(f"{stack_id}: export {name} changes value while imported")
            else:
                refs = set(re.findall(r'"(?:Ref|Fn::GetAtt)": \[?"([A-Za-z0-9]+)"', json.dumps(output["Value"])))
                for logical in refs:
                    if (stack_id, logical) in replaced:
                        problems.append(f"{stack_id}: export {name} points at {logical}, which is replaced")
    return problems


def review(change: str, before, after, workdir: Path) -> tuple[list[str], set]:
    """(problems, allow-list keys used) of one change."""
    problems: list[str] = []
    used: set = set()
    findings: list[Finding] = []
    changed: list[str] = []
    for stack_id, template in before.templates.items():
        if stack_id not in after.templates:
            if (change, stack_id) in STACKS_LEAVING:
                used.add((change, stack_id))
            else:
                problems.append(f"stack {stack_id} leaves the app (cdk deploy would leave it running)")
            continue
        if template != after.templates[stack_id]:
            changed.append(stack_id)
    for stack_id, output in zip(changed, diff_stacks(after.outdir, before.templates, changed, workdir)):
        findings += parse_diff(stack_id, output)
    for f in findings:
        if f.type_ in NEVER_REPLACED:
            problems.append(f"{f.stack}: {f.type_} {f.logical_id}: {f.impact} (never allowed)")
            continue
        key = next(
            (
                k
                for k in ALLOWED
                if k[0] == change
                and k[1:3] == (f.stack, f.type_)
                and f.logical_id.startswith(k[3])
                and k[4] == f.impact
            ),
            None,
        )
        if key is None:
            problems.append(f"{f.stack}: {f.type_} {f.logical_id}: {f.impact} (not on the allow-list)")
        else:
            used.add(key)
    replaced = {(f.stack, f.logical_id) for f in findings if f.impact in ("replace", "may be replaced")}
    gone = frozenset(stack for (c, stack) in STACKS_LEAVING if c == change)
    problems += export_problems(before, after, replaced, gone)
    problems += units_moving_az(before, after)
    return problems, used


def units_moving_az(before, after) -> list[str]:
    """A unit's group that changes subnet moves to another AZ, away from its cluster placement group
    and running instances; CloudFormation updates the group in place, so `cdk diff` shows no
    replacement. The check is the one `flotilla check-update` runs before a deploy."""
    return [
        f"{m.stack}: {m.unit_id} moves to another subnet (AZ)"
        for m in check_update.units_moving_az(before.templates, after.templates)
    ]


@pytest.mark.parametrize("change", list(CHANGES))
def test_operator_change_updates_in_place_except_what_the_allow_list_explains(change, synths, tmp_path):
    before, after = (synths(v) for v in CHANGES[change])
    problems, used = review(change, before, after, tmp_path)
    assert problems == []
    # Every allow-list entry for this change is still needed (a stale entry would hide a new one).
    expected = {k for k in ALLOWED if k[0] == change} | {k for k in STACKS_LEAVING if k[0] == change}
    assert used == expected


def test_the_review_catches_a_replaced_listener_rule_and_a_removed_export_in_use(synths, tmp_path):
    """Teeth: the Front template as an earlier design emitted it (production listener named after
    its protocol, so adding a certificate replaced it with another listener) fails the review."""
    before, after = synths("base"), synths("https")
    old_front = json.loads(json.dumps(before.templates["Front"]).replace("AlbProduction", "AlbHttp"))
    before.templates["Front"], saved = old_front, before.templates["Front"]
    try:
        # Keep the importers consistent with the old export names.
        router, before.templates["Router"] = (
            before.templates["Router"],
            json.loads(json.dumps(before.templates["Router"]).replace("AlbProduction", "AlbHttp")),
        )
        problems, _ = review("add certificate_arn", before, after, tmp_path)
    finally:
        before.templates["Front"], before.templates["Router"] = saved, router
    assert any("ListenerRule ProductionRule" in p and "replace" in p for p in problems), problems
    assert any("Listener AlbHttp" in p and "destroy" in p for p in problems), problems
    assert any("export" in p and "AlbHttp" in p and "removed while imported" in p for p in problems), problems


def test_every_allow_list_entry_names_a_change_of_the_table_and_gives_a_reason():
    for key, reason in {**ALLOWED, **STACKS_LEAVING}.items():
        assert key[0] in CHANGES, key
        assert len(reason) > 40, key


def service_count_after_update(service: dict, running: int) -> int:
    """The desired count an ECS service has after CloudFormation applies an update to it: the
    template's DesiredCount when it states one (written back on every update, autoscaled or not:
    aws/containers-roadmap#493), else the count it had ("when updating a service ... the same desired
    count as it had prior to the deployment", CloudFormation's behaviour quoted in aws/aws-cdk#13130)."""
    return int(service["Properties"].get("DesiredCount", running))


def router_service(synth) -> dict:
    (service,) = synth.resources("Router", "AWS::ECS::Service").values()
    return service


@pytest.mark.parametrize("change", ["units +1 across a cell boundary", "change image", "change router counts"])
def test_router_update_keeps_the_fleet_size_autoscaling_reached(change, synths):
    before, after = (synths(v) for v in CHANGES[change])
    # The change does update the router service (a new task definition or new scaling bounds), so
    # CloudFormation does call UpdateService on it.
    assert before.templates["Router"] != after.templates["Router"]
    scaled_to = 9  # autoscaling grew the fleet at peak, inside every variant's [min, max]
    (target,) = after.resources("Router", "AWS::ApplicationAutoScaling::ScalableTarget").values()
    assert target["Properties"]["MinCapacity"] <= scaled_to <= target["Properties"]["MaxCapacity"]
    assert service_count_after_update(router_service(after), scaled_to) == scaled_to


def test_router_fleet_is_brought_to_the_configured_minimum_by_its_scalable_target(synths):
    """Without a DesiredCount a create starts one task; RegisterScalableTarget moves the count into
    [MinCapacity, MaxCapacity] (Application Auto Scaling API reference), so MinCapacity must be the
    configured router.desired_count."""
    synth = synths("router")
    assert "DesiredCount" not in router_service(synth)["Properties"]
    (target,) = synth.resources("Router", "AWS::ApplicationAutoScaling::ScalableTarget").values()
    expected = VARIANTS["router"]["router"]
    assert (target["Properties"]["MinCapacity"], target["Properties"]["MaxCapacity"]) == (
        expected["desired_count"],
        expected["max_count"],
    )


def test_narrowing_the_unit_azs_moves_running_units_and_the_review_refuses_it(synths, tmp_path):
    """Units are placed round-robin over capacity.availability_zones, so narrowing the list moves
    units already running to another AZ, away from their placement group: shrink those units first
    (docs/capacity.md), then deploy the narrower list, which creates them again."""
    before, after = (synths(v) for v in REFUSED_CHANGES["narrow capacity.availability_zones"])
    problems, _ = review("narrow capacity.availability_zones", before, after, tmp_path)
    assert problems == [
        "Cell-0: cell0-unit0 moves to another subnet (AZ)",
        "Cell-0: cell0-unit1 moves to another subnet (AZ)",
        "Cell-1: cell1-unit0 moves to another subnet (AZ)",
    ]


def test_swapping_a_vpc_az_replaces_imported_subnets_and_the_review_refuses_it(synths, tmp_path):
    """availability_zones shapes the VPC's subnets; CloudFormation refuses to change an export another
    stack imports, so a new AZ needs a new deployment (docs/configuration.md)."""
    before, after = (synths(v) for v in REFUSED_CHANGES["swap an AZ of availability_zones"])
    problems, _ = review("swap an AZ of availability_zones", before, after, tmp_path)
    assert any("export" in p and "Subnet" in p for p in problems), problems


class DeployedStacks:
    """A CloudFormation client whose GetTemplate answers with the templates of `before` for the stacks
    in `deployed_ids` and refuses other stacks as CloudFormation does, through botocore's Stubber on a
    real client, so the response shapes and botocore's own decoding of a JSON TemplateBody are real.
    check-update asks for each cell of the assembly it checks (`after`), in stack-id order."""

    def __init__(self, before, deployed_ids: list[str], after) -> None:
        import boto3
        from botocore.stub import Stubber

        self.client = boto3.client(
            "cloudformation", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x"
        )
        self.stubber = Stubber(self.client)
        for stack_id in sorted(sid for sid in after.templates if sid.startswith("Cell-")):
            name = f"flotilla-{stack_id}"
            if stack_id in deployed_ids:
                body = json.dumps(before.templates[stack_id])
                self.stubber.add_response("get_template", {"TemplateBody": body}, {"StackName": name})
            else:
                # CloudFormation's answer for a stack never created (GetTemplate, ValidationError).
                self.stubber.add_client_error(
                    "get_template", "ValidationError", f"Stack with id {name} does not exist", 400, {"StackName": name}
                )
        self.stubber.activate()


def check_update_cli(after, deployed: DeployedStacks, monkeypatch, capsys, *extra: str) -> tuple[int, str]:
    import ops.aws
    from ops.cli import main

    clients = ops.aws.Aws(ecs=None, ec2=None, autoscaling=None, servicediscovery=None, topology=None)
    clients.cloudformation = deployed.client
    monkeypatch.setattr(ops.aws, "make_clients", lambda **_: clients)
    code = main(["check-update", "--cdk-out", str(after.outdir), "--region", "us-east-1", *extra])
    deployed.stubber.assert_no_pending_responses()
    return code, " ".join(capsys.readouterr().out.split())


def test_check_update_json_lists_the_compared_cells_and_each_refusal_with_its_fix(synths, monkeypatch, capsys):
    before, after = synths("azs-units-2"), synths("azs-units-3")
    deployed = DeployedStacks(before, ["Cell-0", "Cell-1"], after)
    code, out = check_update_cli(after, deployed, monkeypatch, capsys, "--json")
    doc = json.loads(out)
    assert code == 1 and doc["compared"] == ["Cell-0", "Cell-1"]
    (refusal,) = doc["refused"]
    assert [p.split(" ")[0] for p in refusal["problems"]] == ["cell1-unit0"]
    assert "`flotilla shrink --units 2`" in refusal["fix"]


def test_check_update_refuses_a_deploy_that_moves_running_units_and_names_the_units_that_can_stay(
    synths, monkeypatch, capsys
):
    """Widening the unit AZs keeps cell0-unit0 and cell0-unit1 where they are and moves cell1-unit0:
    the fix retires the fleet from the first unit that moves, as `flotilla shrink --units 2` does."""
    before, after = synths("azs-units-2"), synths("azs-units-3")
    code, out = check_update_cli(after, DeployedStacks(before, ["Cell-0", "Cell-1"], after), monkeypatch, capsys)
    assert code == 1
    assert "refused: cell1-unit0 (Cell-1): its Auto Scaling group would move to another subnet, so another AZ" in out
    assert "cell0-unit0" not in out and "cell0-unit1" not in out
    assert "(`flotilla shrink --units 2`), deploy the new AZs with units: 2, then raise units again" in out


def test_check_update_refuses_narrowing_that_moves_the_first_unit_and_points_at_a_new_deployment(
    synths, monkeypatch, capsys
):
    before, after = (synths(v) for v in REFUSED_CHANGES["narrow capacity.availability_zones"])
    code, out = check_update_cli(after, DeployedStacks(before, ["Cell-0", "Cell-1"], after), monkeypatch, capsys)
    assert code == 1
    for unit, stack in (("cell0-unit0", "Cell-0"), ("cell0-unit1", "Cell-0"), ("cell1-unit0", "Cell-1")):
        assert f"refused: {unit} ({stack}): its Auto Scaling group would move" in out
    assert "the first unit moves too: tear the deployment down (`flotilla teardown`)" in out


def test_check_update_passes_a_deploy_that_moves_no_unit_and_skips_cells_not_deployed_yet(synths, monkeypatch, capsys):
    """A revision bump moves nothing; Cell-1 not created yet (a first deploy stopped after Cell-0) is new."""
    before, after = synths("base"), synths("revision")
    code, out = check_update_cli(after, DeployedStacks(before, ["Cell-0"], after), monkeypatch, capsys)
    assert (code, out) == (0, "check-update: 1 deployed cell stack(s) compared; no unit changes cell or AZ")


def test_check_update_refuses_a_new_units_per_cell_that_moves_running_units_to_other_cells(synths, monkeypatch, capsys):
    """units_per_cell 2 -> 1: cell0-unit1 would become cell1-unit0, created again in Cell-1 while
    CloudFormation deletes the running one from Cell-0."""
    before, after = synths("base"), synths("cells-of-1")
    code, out = check_update_cli(after, DeployedStacks(before, ["Cell-0", "Cell-1"], after), monkeypatch, capsys)
    assert code == 1
    assert (
        "refused: units_per_cell: the unit at fleet position 1 is cell0-unit1 as deployed and cell1-unit0 in cdk.out"
        in out
    )
    assert "fix: units_per_cell is fixed for a deployment: keep it as deployed (2)" in out


def test_check_update_passes_fewer_units_after_a_shrink(synths, monkeypatch, capsys):
    before, after = synths("units-5"), synths("units-4")
    code, out = check_update_cli(
        after, DeployedStacks(before, ["Cell-0", "Cell-1", "Cell-2"], after), monkeypatch, capsys
    )
    assert (code, out) == (0, "check-update: 2 deployed cell stack(s) compared; no unit changes cell or AZ")


@pytest.mark.parametrize("change", ["change instance_type (surge)", "change instance_type (replace)"])
def test_an_instance_type_change_ties_each_revision_to_its_own_instances(change, synths):
    """With `replace` the new tasks would otherwise start on the old instances, which lack the new
    type's EFA devices, fail, and roll the deployment back."""
    for synth, instance_type in zip((synths(v) for v in CHANGES[change]), ("trn1.32xlarge", "trn1n.32xlarge")):
        for stack_id in ("Cell-0", "Cell-1"):
            for task in synth.resources(stack_id, "AWS::ECS::TaskDefinition").values():
                assert task["Properties"]["PlacementConstraints"] == [
                    {"Type": "memberOf", "Expression": f"attribute:ecs.instance-type == {instance_type}"}
                ]


def unit_service(synth, stack_id: str, unit_id: str) -> dict:
    for service in synth.resources(stack_id, "AWS::ECS::Service").values():
        if any(t["Key"] == "flotilla:unit" and t["Value"] == unit_id for t in service["Properties"].get("Tags", [])):
            return service
    raise AssertionError(f"no service of {unit_id} in {stack_id}")


def test_a_unit_drained_in_the_config_stays_drained_across_a_deploy_that_updates_it(synths):
    """drain-unit alone sets the count out of band, and the next update of the service writes the
    template's DesiredCount back; drained_units puts the drain in the template."""
    before, after = synths("drained"), synths("drained-revision")
    drained_before, drained_after = (unit_service(s, "Cell-0", "cell0-unit1") for s in (before, after))
    # The revision bump replaces the unit's task definition, so the service's TaskDefinition (a Ref to
    # it) resolves to a new ARN and CloudFormation updates the drained unit's service.
    task_ref = drained_after["Properties"]["TaskDefinition"]["Ref"]
    assert drained_before["Properties"]["TaskDefinition"]["Ref"] == task_ref
    assert before.resources("Cell-0")[task_ref] != after.resources("Cell-0")[task_ref]
    assert service_count_after_update(drained_after, running=0) == 0
    tags = {t["Key"]: t["Value"] for t in drained_after["Properties"]["Tags"]}
    # The desired count it returns to is the unit's node count: 1 in the default unit.
    assert tags["flotilla:drained-desired-count"] == "1" and tags["flotilla:drained-in-config"] == "true"
    serving = unit_service(after, "Cell-0", "cell0-unit0")
    assert service_count_after_update(serving, running=1) == 1
    assert "flotilla:drained-in-config" not in {t["Key"] for t in serving["Properties"].get("Tags", [])}


def test_a_drain_made_only_out_of_band_is_undone_by_the_next_deploy(synths):
    """Why drained_units exists: the same revision bump brings a unit drained with drain-unit back."""
    after = synths("revision")
    assert service_count_after_update(unit_service(after, "Cell-0", "cell0-unit1"), running=0) == 1


@pytest.mark.parametrize("before, after", [("base", "internet-facing"), ("internet-facing", "base")])
def test_switching_the_front_door_scheme_replaces_the_alb_so_it_is_not_an_in_place_update(
    before, after, synths, tmp_path
):
    """An ALB's Scheme is create-only (cfn-lint 1.58 schema of AWS::ElasticLoadBalancingV2::LoadBalancer),
    so the switch replaces the load balancer, its listeners and their rules, and the listener-rule
    exports the Router stack imports change: CloudFormation refuses that update. The switch is
    docs/runbooks/front-door.md (remove Router, Observability and Front, deploy again), and this
    review must keep saying so."""
    problems, _ = review("switch front.scheme", synths(before), synths(after), tmp_path)
    assert any("LoadBalancer Alb" in p and "replace" in p and "never allowed" in p for p in problems), problems
    assert any("export" in p and "ProductionRule" in p for p in problems), problems


def test_adding_host_efa_to_deployed_units_updates_their_launch_templates_in_place(synths, tmp_path):
    """A unit deployed before its user data installed host EFA (from the deployment's bucket), updated
    to this revision: the pinned CLI's diff reports each unit's launch template as modified and nothing
    replaced. EC2 keeps a launch template immutable and adds a version ("Launch templates are immutable
    ... create a new version", EC2 API reference, CreateLaunchTemplateVersion); the group follows it (its
    Version is the template's LatestVersionNumber) while running instances keep the version they booted
    (no AutoScalingRollingUpdate policy). The operator replaces them (docs/runbooks/node-replacement.md)
    so each node boots with EFA; docs/runbooks/node-boot-artifacts.md rolls the change back the same way."""
    from stacks.node_boot import efa_setup, fetch_helper_setup

    after = synths("base")
    before_templates = json.loads(json.dumps(after.templates))
    # trn1.32xlarge: 8 EFA interfaces; the boot writes its fetch helper just before the EFA step.
    setup = fetch_helper_setup() + efa_setup(8, bucket=after.deployment.config.model.bucket)
    stripped = 0
    for stack_id, template in before_templates.items():
        for resource in template["Resources"].values():
            if resource["Type"] != "AWS::EC2::LaunchTemplate":
                continue
            data = resource["Properties"]["LaunchTemplateData"]["UserData"]
            text = json.dumps(data)
            assert json.dumps(setup)[1:-1] in text, stack_id
            data_before = json.loads(text.replace(json.dumps(setup)[1:-1], "", 1))
            resource["Properties"]["LaunchTemplateData"]["UserData"] = data_before
            stripped += 1
    assert stripped == 3  # base: three units
    cells = ["Cell-0", "Cell-1"]
    for stack_id, output in zip(cells, diff_stacks(after.outdir, before_templates, cells, tmp_path)):
        assert parse_diff(stack_id, output) == []  # no replace, destroy or orphan
        modified = [line for line in output.splitlines() if line.strip().startswith("[~] AWS::EC2::LaunchTemplate")]
        assert len(modified) == (2 if stack_id == "Cell-0" else 1), output[-3000:]
        assert "UserData" in output


def scaled_counts(synth) -> dict[str, object]:
    """unit id -> DesiredCount of every unit service of the deployment."""
    out = {}
    for stack_id, template in synth.templates.items():
        for resource in template["Resources"].values():
            if resource["Type"] == "AWS::ECS::Service" and stack_id.startswith("Cell-"):
                props = resource["Properties"]
                unit = next(t["Value"] for t in props["Tags"] if t["Key"] == "flotilla:unit")
                out[unit] = props["DesiredCount"]
    return out


@pytest.mark.parametrize("change", ["bump revision (scaled)", "raise the ceiling (scaled)", "lower the floor (scaled)"])
def test_no_update_with_the_scaler_states_a_count_for_a_unit_above_the_floor(change, synths):
    """CloudFormation writes a service's DesiredCount on every update (aws/containers-roadmap#493): above
    the floor it must be the scaler's parameter, before and after, or a deploy would undo the scaler."""
    _, after = (synths(v) for v in CHANGES[change])
    counts = scaled_counts(after)
    floor = after.deployment.config.scaling.floor
    for unit, count in counts.items():
        cell, index = (int(x) for x in unit.replace("cell", "").split("-unit"))
        if cell * 2 + index >= floor:  # BASE has two units per cell
            assert isinstance(count, dict) and "Fn::Select" in count, (unit, count)
        else:
            assert count == after.deployment.config.nodes_per_unit, (unit, count)
