"""The fleet with the config's `scaling` section: the Scaler stack (the scheduled function, its
least-privilege role, one desired-counts parameter per cell), cells whose units above the floor
take their desired count from that parameter (so a deploy writes back what the scaler set, never a
number of its own), and the scaler's alarms. Held to cfn-lint, cdk-nag and moto like every stack."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import pytest
from cdk_nag import AwsSolutionsChecks
from moto_cfn import MotoCloudFormation
from synth_helpers import LLAMA_70B, config_with, synthesize
from test_cfn_lint import assert_lints_clean

from contract import scaling
from contract.scaling import ScalingPolicy
from runtime.scaler import aws as runner
from stacks.scaler import CODE_EXCLUDE, counts_parameter

PEAK = {"name": "prime-day", "start": "2026-07-08T06:00:00Z", "end": "2026-07-08T10:00:00Z", "units": 5}


@pytest.fixture(scope="module")
def scaled(tmp_path_factory):
    """Six two-node units (70B) in two cells of four, two of them the floor; cdk-nag runs (a finding
    fails synth)."""
    config = config_with(
        units=6,
        units_per_cell=4,
        nodes_per_unit=2,
        model=LLAMA_70B,
        scaling={"floor": 2, "cold_start_s": 900, "scheduled": [PEAK]},
    )
    return synthesize(config, tmp_path_factory.mktemp("scaled"), plugins=[AwsSolutionsChecks()])


def services(synth, stack_id: str) -> dict[str, dict]:
    return {
        k: v["Properties"]
        for k, v in synth.templates[stack_id]["Resources"].items()
        if v["Type"] == "AWS::ECS::Service"
    }


def unit_of(props: dict) -> str:
    return next(t["Value"] for t in props["Tags"] if t["Key"] == "flotilla:unit")


def test_units_above_the_floor_take_their_desired_count_from_the_scalers_parameter(scaled):
    counts = {}
    for cell in ("Cell-0", "Cell-1"):
        for props in services(scaled, cell).values():
            counts[unit_of(props)] = props["DesiredCount"]
    # The floor (the first two units) states its count: those units always serve.
    assert counts["cell0-unit0"] == counts["cell0-unit1"] == 2
    # Every other unit's count is its slot of the cell's parameter: a deploy writes back what the
    # scaler set (CloudFormation fetches the parameter's latest value at every stack update).
    assert counts["cell0-unit2"] == {"Fn::Select": [2, {"Ref": "DesiredCounts"}]}
    assert counts["cell1-unit1"] == {"Fn::Select": [1, {"Ref": "DesiredCounts"}]}
    for cell, index in (("Cell-0", 0), ("Cell-1", 1)):
        parameter = scaled.templates[cell]["Parameters"]["DesiredCounts"]
        assert parameter["Type"] == "AWS::SSM::Parameter::Value<List<String>>"
        assert parameter["Default"] == counts_parameter("flotilla", index) == runner.counts_parameter("flotilla", index)


def test_a_revision_rollout_states_no_count_for_a_scaled_unit(tmp_path):
    """The update every deploy makes (a new revision re-creates every task definition) keeps the
    scaled units on the parameter: no number that would reset what the scaler set."""
    config = config_with(units=3, units_per_cell=4, revision="2", scaling={"floor": 1})
    synth = synthesize(config, tmp_path)
    for props in services(synth, "Cell-0").values():
        if unit_of(props) != "cell0-unit0":
            assert "Fn::Select" in props["DesiredCount"], props["DesiredCount"]


def test_the_scaler_function_runs_once_a_minute_one_pass_at_a_time_with_the_configs_policy(scaled):
    resources = scaled.templates["Scaler"]["Resources"]
    (function,) = [r["Properties"] for r in resources.values() if r["Type"] == "AWS::Lambda::Function"]
    assert function["ReservedConcurrentExecutions"] == 1
    assert function["Handler"] == "runtime.scaler.aws.handler"
    env = function["Environment"]["Variables"]
    policy = ScalingPolicy.loads(env[scaling.ENV_SCALING_POLICY])
    assert (policy.floor, policy.ceiling, policy.cold_start_s) == (2, 6, 900)
    assert [s.name for s in policy.schedule] == ["prime-day"]
    # What runtime/scaler/aws.py reads from its environment, built from the same config.
    settings = runner.Settings.from_env(env)
    assert settings.fixed == {"cell0-unit0", "cell0-unit1"} and settings.cells == 2
    (rule,) = [r["Properties"] for r in resources.values() if r["Type"] == "AWS::Events::Rule"]
    assert rule["ScheduleExpression"] == "rate(1 minute)"
    parameters = [r["Properties"] for r in resources.values() if r["Type"] == "AWS::SSM::Parameter"]
    assert sorted(p["Name"] for p in parameters) == [counts_parameter("flotilla", c) for c in (0, 1)]
    assert all(p["Value"] == "0,0,0,0" and p["Type"] == "StringList" for p in parameters)


def test_the_scalers_role_may_make_exactly_the_calls_of_its_pass_on_this_deployments_resources(scaled):
    resources = scaled.templates["Scaler"]["Resources"]
    (policy,) = [r["Properties"] for r in resources.values() if r["Type"] == "AWS::IAM::Policy"]
    actions = {}
    for s in policy["PolicyDocument"]["Statement"]:
        for action in [s["Action"]] if isinstance(s["Action"], str) else s["Action"]:
            actions[action] = json.dumps(s["Resource"]) + json.dumps(s.get("Condition", {}))
    assert set(actions) == {
        "ecs:ListServices",
        "ecs:DescribeServices",
        "ecs:UpdateService",
        "logs:DescribeLogGroups",
        "logs:FilterLogEvents",
        "logs:CreateLogStream",
        "logs:PutLogEvents",
        "cloudwatch:GetMetricData",
        "ssm:GetParameter",
        "ssm:PutParameter",
    }
    assert "service/flotilla-cell*/*" in actions["ecs:UpdateService"]
    assert "cluster/flotilla-cell*" in actions["ecs:ListServices"]
    assert "log-group:flotilla-Router-Logs*" in actions["logs:FilterLogEvents"]
    # It may write its memory and the cells' counts, and read the operator's floor: not the
    # admission limit or any other parameter.
    assert "flotilla/flotilla/scaler-state" in actions["ssm:PutParameter"]
    assert "flotilla/flotilla/cell*/desired-counts" in actions["ssm:PutParameter"]
    assert "scaling-floor" not in actions["ssm:PutParameter"]
    assert "admission" not in json.dumps(policy)


def test_the_functions_code_is_the_scaler_and_the_contract_alone(scaled):
    """No torch, no router, no local launcher in the function's package; its handler's modules in it."""
    resources = scaled.templates["Scaler"]["Resources"]
    (function,) = [r for r in resources.values() if r["Type"] == "AWS::Lambda::Function"]
    asset = scaled.outdir / f"asset.{function['Properties']['Code']['S3Key'].removesuffix('.zip')}"
    files = {str(p.relative_to(asset)) for p in Path(asset).rglob("*.py")}
    assert {"runtime/scaler/aws.py", "runtime/scaler/decide.py", "contract/scaling.py", "runtime/emf.py"} <= files
    assert not any(
        f.startswith(("runtime/engines", "runtime/router", "runtime/node", "stacks", "tests")) for f in files
    )
    assert "runtime/scaler/local.py" not in files and "runtime/scaler/local_units.py" not in files
    assert CODE_EXCLUDE[0] == "*"


def test_the_scalers_alarms_page_when_it_wants_more_than_capacity_or_stops_deciding(scaled):
    alarms = {
        r["Properties"]["MetricName"]: r["Properties"]
        for r in scaled.templates["Observability"]["Resources"].values()
        if r["Type"] == "AWS::CloudWatch::Alarm" and r["Properties"].get("MetricName", "").startswith("Scaler")
    }
    unmet = alarms[scaling.METRIC_UNMET_UNITS]
    assert (unmet["Threshold"], unmet["ComparisonOperator"]) == (1, "GreaterThanOrEqualToThreshold")
    deciding = alarms[scaling.METRIC_TARGET_UNITS]
    assert (deciding["Statistic"], deciding["TreatMissingData"]) == ("SampleCount", "breaching")
    # Ready-units alarms: only a cell holding part of the floor has one (the others' units come and go).
    ready = [
        r["Properties"]
        for r in scaled.templates["Observability"]["Resources"].values()
        if r["Type"] == "AWS::CloudWatch::Alarm"
        and r["Properties"].get("AlarmName", "").startswith("ReadyUnits")
        or (
            r["Type"] == "AWS::CloudWatch::Alarm"
            and any(d.get("Value") == "cell1" for d in r["Properties"].get("Dimensions", []))
        )
    ]
    assert not any(any(d.get("Value") == "cell1" for d in p.get("Dimensions", [])) for p in ready)


@pytest.mark.parametrize("stack_id", ["Scaler", "Cell-0", "Observability"])
def test_the_scaled_templates_lint_clean(scaled, stack_id):
    assert_lints_clean(stack_id, scaled.templates[stack_id])


def test_every_stack_of_the_scaled_fleet_is_created_in_moto(scaled):
    """In deploy order: the Scaler stack's parameters exist before the cells read them, and the
    cells' services are created at the counts the parameters hold."""
    with MotoCloudFormation() as cfn:
        resources = scaled.templates["Scaler"]["Resources"]
        (function,) = [r["Properties"] for r in resources.values() if r["Type"] == "AWS::Lambda::Function"]
        code = function["Code"]
        bucket = (
            code["S3Bucket"]["Fn::Sub"]
            .replace("${AWS::AccountId}", "123456789012")
            .replace("${AWS::Region}", "us-east-1")
        )
        s3 = cfn.client("s3")
        s3.create_bucket(Bucket=bucket)
        blob = io.BytesIO()
        with zipfile.ZipFile(blob, "w") as z:
            z.writestr("runtime/__init__.py", "")
        s3.put_object(Bucket=bucket, Key=code["S3Key"], Body=blob.getvalue())
        cfn.deploy(scaled)
        cfn.assert_every_resource_created(scaled)
        ecs = cfn.client("ecs")
        desired = {}
        for cell in (0, 1):
            arns = ecs.list_services(cluster=f"flotilla-cell{cell}")["serviceArns"]
            for svc in ecs.describe_services(cluster=f"flotilla-cell{cell}", services=arns, include=["TAGS"])[
                "services"
            ]:
                desired[svc["tags"][0]["value"] if svc.get("tags") else svc["serviceName"]] = int(svc["desiredCount"])
        assert sorted(desired.values()) == [0, 0, 0, 0, 2, 2], desired
