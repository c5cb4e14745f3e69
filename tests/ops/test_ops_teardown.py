"""`flotilla teardown` / `flotilla shrink` against moto plus a model of the ECS, Auto Scaling, Cloud Map
and CloudFormation rules moto lacks (ecs_rules.py): tasks drain before they stop, protected
instances and registered container instances block stack deletion, exports in use block it too,
and no instance may be terminated while a task still runs on it."""

from __future__ import annotations

import json
import sys
from typing import Any, ClassVar

import boto3
import pytest
from ecs_rules import REGION, EcsRules
from moto.cloudformation import parsing

import ops.commands.teardown as teardown
from contract.apikeys import KeySet, secret_name

DEPLOYMENT = "flotilla"
NETWORK = f"{DEPLOYMENT}-Network:Vpc"
UNITS = f"{DEPLOYMENT}-Discovery:Units"
RULE = f"{DEPLOYMENT}-Front:ProductionRule"
ALARM = f"{DEPLOYMENT}-Observability:FiveXxRate"


class _CloudMapService:
    """CloudFormation stand-in for the Discovery stack's `units` Cloud Map service: moto has no
    CloudFormation model for AWS::ServiceDiscovery::Service; this one answers with the service the
    fake deployment created (by name), so list_stack_resources shows it as the stack's."""

    created: ClassVar[dict[str, str]] = {}

    def __init__(self, service_id: str) -> None:
        self.physical_resource_id = service_id

    @staticmethod
    def cloudformation_type() -> str:
        return "AWS::ServiceDiscovery::Service"

    @staticmethod
    def cloudformation_name_type() -> str:
        return ""

    @classmethod
    def has_cfn_attr(cls, attr: str) -> bool:
        return False

    @classmethod
    def create_from_cloudformation_json(cls, resource_name, cloudformation_json, account_id, region_name, **kwargs):
        return cls(cls.created[cloudformation_json["Properties"]["Name"]])

    @classmethod
    def delete_from_cloudformation_json(cls, *args, **kwargs) -> None:
        return None

    def is_created(self) -> bool:
        return True

    def delete(self, account_id: str, region_name: str) -> None:
        """The Cloud Map service itself belongs to the fake fleet; the model checks it is empty."""


def _template(*, exports: tuple[str, ...] = (), imports: tuple[str, ...] = (), extra: dict | None = None) -> dict:
    """A stand-in for one flotilla stack: its exports and imports are what the real one has."""
    resources: dict[str, Any] = {"Marker": {"Type": "AWS::SNS::Topic", "Properties": {"DisplayName": "x"}}}
    for i, name in enumerate(imports):
        resources[f"Import{i}"] = {"Type": "AWS::SNS::Topic", "Properties": {"DisplayName": {"Fn::ImportValue": name}}}
    resources.update(extra or {})
    outputs = {f"Export{i}": {"Value": "v", "Export": {"Name": name}} for i, name in enumerate(exports)}
    return {"Resources": resources, "Outputs": outputs}


class TeardownDeployment:
    """The fake fleet (conftest's FakeDeployment) plus what teardown reads: unit ASGs tagged as
    stacks/unit.py and CloudFormation tag them, instances protected from scale-in as ECS managed
    termination protection leaves them, and one CloudFormation stack per flotilla stack with its
    real exports and imports."""

    def __init__(self, fleet) -> None:
        self.fleet, self.aws, self.deployment = fleet, fleet.aws, fleet.deployment
        self.units = fleet.units

    def add_unit(self, *, cell: int, index: int, nodes: int = 2):
        unit = self.fleet.add_unit(cell=cell, index=index, nodes=nodes)
        stack = f"{self.deployment}-Cell-{cell}"
        self.aws.autoscaling.create_or_update_tags(
            Tags=[
                {
                    "ResourceId": unit.asg_name,
                    "ResourceType": "auto-scaling-group",
                    "Key": k,
                    "Value": v,
                    "PropagateAtLaunch": True,
                }
                for k, v in (
                    ("flotilla:deployment", self.deployment),
                    ("flotilla:unit", unit.unit_id),
                    ("aws:cloudformation:stack-name", stack),
                )
            ]
        )
        self.aws.autoscaling.set_instance_protection(
            AutoScalingGroupName=unit.asg_name,
            InstanceIds=[n.instance_id for n in unit.nodes],
            ProtectedFromScaleIn=True,
        )
        return unit

    def create_stacks(self, cells: int) -> None:
        cfn = self.aws.cloudformation
        _CloudMapService.created["units"] = self.fleet.cloudmap_service
        stacks = [
            ("Network", _template(exports=(NETWORK,))),
            (
                "Discovery",
                _template(
                    exports=(UNITS,),
                    imports=(NETWORK,),
                    extra={"Units": {"Type": "AWS::ServiceDiscovery::Service", "Properties": {"Name": "units"}}},
                ),
            ),
            *((f"Cell-{c}", _template(imports=(NETWORK, UNITS))) for c in range(cells)),
            ("Front", _template(exports=(RULE,), imports=(NETWORK,))),
            ("Observability", _template(exports=(ALARM,))),
            ("Router", _template(imports=(RULE, ALARM, UNITS))),
        ]
        for stack_id, template in stacks:
            cfn.create_stack(StackName=f"{self.deployment}-{stack_id}", TemplateBody=json.dumps(template))

    def stack_status(self, stack_id: str) -> str:
        summaries = self.aws.cloudformation.list_stacks()["StackSummaries"]
        (status,) = [s["StackStatus"] for s in summaries if s["StackName"] == f"{self.deployment}-{stack_id}"]
        return status


@pytest.fixture
def deployment(aws, fleet, monkeypatch):
    aws.cloudformation = boto3.client("cloudformation", region_name=REGION)
    monkeypatch.setattr(teardown, "POLL_S", 0.0)
    original = parsing.get_model_map
    monkeypatch.setattr(
        parsing, "get_model_map", lambda: {**original(), "AWS::ServiceDiscovery::Service": _CloudMapService}
    )
    return TeardownDeployment(fleet)


@pytest.fixture
def rules(aws, deployment):
    return EcsRules(
        aws,
        cluster_of_stack={f"{DEPLOYMENT}-Cell-{c}": f"{DEPLOYMENT}-cell{c}" for c in range(4)},
        cloudmap_service_of_stack={f"{DEPLOYMENT}-Discovery": deployment.fleet.cloudmap_service},
    )


def _service(aws, unit) -> dict:
    return aws.ecs.describe_services(cluster=unit.cluster_arn, services=[unit.service_name])["services"][0]


def _instances(aws, unit) -> list[dict]:
    (group,) = aws.autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[unit.asg_name])["AutoScalingGroups"]
    return group["Instances"]


def _three_units_in_two_cells(deployment) -> list:
    units = [
        deployment.add_unit(cell=0, index=0),
        deployment.add_unit(cell=0, index=1),
        deployment.add_unit(cell=1, index=0),
    ]
    deployment.create_stacks(cells=2)
    return units


# --- the model has teeth --------------------------------------------------------------------------
def test_deleting_a_cell_stack_under_running_units_is_what_the_model_refuses(aws, deployment, rules):
    """`cdk destroy` of a cell deletes the stack directly: with instances still protected from scale-in
    it hangs (aws/aws-cdk#18179); the model stops it."""
    _three_units_in_two_cells(deployment)
    with pytest.raises(AssertionError, match="protected from scale-in"):
        aws.cloudformation.delete_stack(StackName=f"{DEPLOYMENT}-Cell-1")
    with pytest.raises(AssertionError, match="in use by"):
        aws.cloudformation.delete_stack(StackName=f"{DEPLOYMENT}-Network")


def test_scaling_the_instances_in_before_the_tasks_drained_is_what_the_model_refuses(aws, deployment, rules):
    (unit, *_) = _three_units_in_two_cells(deployment)
    aws.ecs.update_service(cluster=unit.cluster_arn, service=unit.service_name, desiredCount=0)
    # moto would say runningCount 0 at once; ECS still has both tasks draining.
    assert _service(aws, unit)["runningCount"] == 0
    assert len(teardown.live_tasks(aws, unit.cluster_arn, serviceName=unit.service_name)) >= 2
    aws.autoscaling.set_instance_protection(
        AutoScalingGroupName=unit.asg_name, InstanceIds=[n.instance_id for n in unit.nodes], ProtectedFromScaleIn=False
    )
    with pytest.raises(AssertionError, match="terminated while"):
        aws.autoscaling.update_auto_scaling_group(AutoScalingGroupName=unit.asg_name, MinSize=0, DesiredCapacity=0)


# --- teardown -------------------------------------------------------------------------------------
def test_teardown_dry_run_names_units_instances_and_stacks_in_deletion_order(aws, deployment, rules, run_cli):
    units = _three_units_in_two_cells(deployment)
    code, out = run_cli("teardown", "--dry-run")
    assert code == 0, out
    assert "drain 3 unit(s)" in out and "release 6 instance(s) of 3 Auto Scaling group(s)" in out
    order = ["Router", "Observability", "Front", "Cell-1", "Cell-0", "Discovery", "Network"]
    listed = out.split("delete these stacks, one at a time, in this order:\n")[1].split("\n")[: len(order)]
    assert [line.strip() for line in listed] == [f"{DEPLOYMENT}-{s}" for s in order]
    assert "dry run: nothing changed" in out
    assert all(_service(aws, u)["desiredCount"] == 2 and len(_instances(aws, u)) == 2 for u in units)
    assert rules.deleted == []


def test_teardown_without_yes_and_without_a_terminal_is_refused(aws, deployment, rules, run_cli):
    (unit, *_) = _three_units_in_two_cells(deployment)
    assert not sys.stdin.isatty()
    code, out = run_cli("teardown")
    assert code == 1 and "refusing to tear down deployment flotilla without confirmation" in out
    assert _service(aws, unit)["desiredCount"] == 2


def test_teardown_drains_then_releases_then_deletes_every_stack_in_order(aws, deployment, rules, run_cli):
    units = _three_units_in_two_cells(deployment)
    code, out = run_cli("teardown", "--yes", "--wait", "60")
    assert code == 0, out
    assert "deployment flotilla: torn down" in out
    # The model raised if an instance went while a task ran on it, or a stack went before its
    # importers, with protected instances, registered container instances or Cloud Map entries.
    assert rules.deleted == [
        f"{DEPLOYMENT}-{s}" for s in ("Router", "Observability", "Front", "Cell-1", "Cell-0", "Discovery", "Network")
    ]
    assert sorted(rules.terminated) == sorted(n.instance_id for u in units for n in u.nodes)
    for stack in ("Network", "Discovery", "Cell-0", "Cell-1", "Front", "Observability", "Router"):
        assert deployment.stack_status(stack) == "DELETE_COMPLETE"
    for u in units:
        assert _service(aws, u)["desiredCount"] == 0
        assert _instances(aws, u) == []
        assert teardown.live_tasks(aws, u.cluster_arn) == []


def test_teardown_releases_no_instance_while_tasks_still_drain(aws, deployment, run_cli):
    units = _three_units_in_two_cells(deployment)
    EcsRules(aws, drain_polls=10**6)  # the nodes never finish draining
    code, out = run_cli("teardown", "--yes", "--wait", "0")
    assert code == 1
    assert "unit tasks stopping: not done" in out
    for u in units:
        assert len(_instances(aws, u)) == 2
        assert all(i["ProtectedFromScaleIn"] for i in _instances(aws, u))
    assert deployment.stack_status("Router") == "CREATE_COMPLETE"


def test_teardown_of_nothing_says_so(aws, deployment, run_cli):
    code, out = run_cli("teardown", "--deployment", "other", "--yes")
    assert code == 0 and "no stacks, no units, no API keys" in out


def _issue_key(run_cli) -> str:
    code, out = run_cli("keys", "create", "--name", "shop", "--yes")
    assert code == 0
    return out.strip()


def _accepted(aws, key: str) -> bool:
    """Whether the deployment's secret, as every router reads it, accepts the key."""
    text = aws.secretsmanager.get_secret_value(SecretId=secret_name(DEPLOYMENT))["SecretString"]
    return KeySet.loads(text).lookup(key) is not None


def test_teardown_deletes_the_api_keys_last_and_a_redeploy_under_the_name_accepts_none_of_them(
    aws, deployment, rules, run_cli
):
    _three_units_in_two_cells(deployment)
    old = _issue_key(run_cli)
    code, out = run_cli("teardown", "--dry-run")
    assert code == 0 and f"delete the API-key secret {secret_name(DEPLOYMENT)} for good" in " ".join(out.split())
    assert _accepted(aws, old)
    code, out = run_cli("teardown", "--yes", "--wait", "60")
    assert code == 0, out
    assert out.index(f"{DEPLOYMENT}-Network: deleted") < out.index(f"{secret_name(DEPLOYMENT)}: deleted")
    # Redeployed under the same name: a key can be issued at once (no secret is scheduled for deletion
    # under the name), and the old key is not accepted.
    new = _issue_key(run_cli)
    assert _accepted(aws, new) and not _accepted(aws, old)


def test_teardown_keep_keys_leaves_the_secret_and_its_keys(aws, deployment, rules, run_cli):
    _three_units_in_two_cells(deployment)
    key = _issue_key(run_cli)
    code, out = run_cli("teardown", "--yes", "--wait", "60", "--keep-keys")
    assert code == 0 and "(--keep-keys)" in out and "api-keys: deleted" not in out
    assert _accepted(aws, key)
    code, out = run_cli("teardown", "--yes", "--wait", "60")  # run again without it: the keys go
    assert code == 0 and f"{secret_name(DEPLOYMENT)}: deleted" in out


# --- shrink ---------------------------------------------------------------------------------------
def test_shrink_across_a_cell_boundary_retires_the_highest_units_and_deletes_the_empty_cell(
    aws, deployment, rules, run_cli
):
    kept, second, third = _three_units_in_two_cells(deployment)
    code, out = run_cli("shrink", "--units", "1", "--units-per-cell", "2", "--yes", "--wait", "60")
    assert code == 0, out
    assert "cell0-unit1" in out and "cell1-unit0" in out
    assert rules.deleted == [f"{DEPLOYMENT}-Cell-1"]
    assert deployment.stack_status("Cell-0") == "CREATE_COMPLETE"
    for u in (second, third):
        assert _service(aws, u)["desiredCount"] == 0 and _instances(aws, u) == []
    assert _service(aws, kept)["desiredCount"] == 2 and len(_instances(aws, kept)) == 2
    assert sorted(rules.terminated) == sorted(n.instance_id for u in (second, third) for n in u.nodes)
    assert "now `cdk deploy --all` the config with units: 1" in out


def test_shrink_inside_a_cell_deletes_no_stack(aws, deployment, rules, run_cli):
    kept = deployment.add_unit(cell=0, index=0)
    gone = deployment.add_unit(cell=0, index=1)
    deployment.create_stacks(cells=1)
    code, out = run_cli("shrink", "--units", "1", "--units-per-cell", "2", "--yes", "--wait", "60")
    assert code == 0, out
    assert "drain 1 unit(s)" in out and "delete these stacks" not in out
    assert rules.deleted == []
    assert _service(aws, gone)["desiredCount"] == 0 and _instances(aws, gone) == []
    assert _service(aws, kept)["desiredCount"] == 2 and len(_instances(aws, kept)) == 2


def test_shrink_with_a_units_per_cell_that_does_not_match_the_fleet_is_refused(aws, deployment, run_cli):
    _three_units_in_two_cells(deployment)
    code, out = run_cli("shrink", "--units", "1", "--units-per-cell", "1", "--dry-run")
    assert code == 2 and "--units-per-cell=1 is too small: unit cell0-unit1 exists" in out


def test_shrink_to_what_is_deployed_does_nothing(aws, deployment, run_cli):
    _three_units_in_two_cells(deployment)
    code, out = run_cli("shrink", "--units", "3", "--units-per-cell", "2", "--yes")
    assert code == 0 and "nothing beyond --units 3 to remove" in out


@pytest.mark.parametrize("value", ["0", "-1"])
def test_shrink_to_no_units_points_at_teardown(aws, deployment, run_cli, value):
    code, out = run_cli("shrink", "--units", value, "--dry-run")
    assert code == 2 and "flotilla teardown" in out


def test_an_instance_still_running_another_task_is_not_released(aws, deployment, rules, run_cli):
    """The check right before unprotecting: a task of any other service (here a sidecar started on a
    unit's node) keeps the instance, and the command stops before touching any group."""
    units = _three_units_in_two_cells(deployment)
    node = units[0].nodes[0]
    aws.ecs.start_task(
        cluster=units[0].cluster_arn,
        taskDefinition=units[0].task_definition_arn,
        containerInstances=[node.container_instance_arn],
        startedBy="someone",
        group="service:sidecar",
    )
    code, out = run_cli("teardown", "--yes", "--wait", "60")
    assert code == 1
    assert f"refusing to release instances that still run tasks: {node.instance_id} runs" in out
    for u in units:
        assert len(_instances(aws, u)) == 2 and all(i["ProtectedFromScaleIn"] for i in _instances(aws, u))
    assert rules.deleted == []
