"""Observability stack: alarms, their wiring to SNS and to the router, and the dashboard's content."""

from __future__ import annotations

import json

import aws_cdk as cdk
import pytest
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_elasticloadbalancingv2 as elbv2
from aws_cdk.assertions import Match, Template
from front_app import UNITS_PER_CELL, template
from synth_helpers import config_with, synthesize

import contract
from stacks.observability import ObservabilityStack


def alarms() -> dict[str, dict]:
    return {
        k[:-8]: v["Properties"]  # logical id = construct id + 8-hex hash
        for k, v in template("Observability")["Resources"].items()
        if v["Type"] == "AWS::CloudWatch::Alarm"
    }


def topic_ref() -> dict:
    (logical,) = [k for k, v in template("Observability")["Resources"].items() if v["Type"] == "AWS::SNS::Topic"]
    return {"Ref": logical}


def test_every_alarm_pages_the_topic_on_alarm_and_on_recovery():
    assert set(alarms()) == {
        "FiveXxRate",
        "P99Latency",
        "UnhealthyRouterTargets",
        "FleetReadyUnits",
        *(f"ReadyUnits{c.capitalize()}" for c in UNITS_PER_CELL),
    }
    for name, alarm in alarms().items():
        assert alarm["AlarmActions"] == [topic_ref()], name
        assert alarm["OKActions"] == [topic_ref()], name
        # A first deploy has no traffic and no routers yet: that must not look like a failure.
        assert alarm["TreatMissingData"] == "notBreaching", name


def test_five_xx_alarm_fires_above_five_percent_of_requests_for_three_minutes():
    alarm = alarms()["FiveXxRate"]
    assert (alarm["ComparisonOperator"], alarm["Threshold"]) == ("GreaterThanThreshold", 5)
    assert (alarm["EvaluationPeriods"], alarm["DatapointsToAlarm"]) == (3, 3)
    queries = {q["Id"]: q for q in alarm["Metrics"]}
    assert (
        "100 * (FILL(e5, 0) + FILL(t5, 0)) / req"
        in queries[next(i for i in queries if "Expression" in queries[i])]["Expression"]
    )
    names = {q["MetricStat"]["Metric"]["MetricName"] for q in queries.values() if "MetricStat" in q}
    assert names == {"RequestCount", "HTTPCode_ELB_5XX_Count", "HTTPCode_Target_5XX_Count"}


def test_latency_alarm_watches_p99_target_response_time():
    alarm = alarms()["P99Latency"]
    assert (alarm["MetricName"], alarm["ExtendedStatistic"], alarm["Threshold"]) == ("TargetResponseTime", "p99", 10)
    assert alarm["Namespace"] == "AWS/ApplicationELB"


def test_unhealthy_target_alarm_sums_both_router_target_groups():
    alarm = alarms()["UnhealthyRouterTargets"]
    assert alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold" and alarm["Threshold"] == 1
    stats = [q["MetricStat"] for q in alarm["Metrics"] if "MetricStat" in q]
    assert [s["Metric"]["MetricName"] for s in stats] == ["UnHealthyHostCount"] * 2
    groups = sorted(json.dumps(s["Metric"]["Dimensions"]) for s in stats)
    assert "BlueTargetGroup" in groups[0] and "GreenTargetGroup" in groups[1]


def test_ready_unit_alarms_read_the_runtime_emf_metric_fleet_wide_and_per_cell():
    fleet = alarms()["FleetReadyUnits"]
    assert (fleet["Namespace"], fleet["MetricName"], fleet["Statistic"]) == (
        contract.METRICS_NAMESPACE,
        contract.METRIC_READY_UNITS,
        "Minimum",
    )
    assert fleet["Dimensions"] == [{"Name": contract.METRIC_DIM_SERVICE, "Value": contract.METRIC_SERVICE_VALUE}]
    assert (fleet["ComparisonOperator"], fleet["Threshold"]) == ("LessThanThreshold", 1)
    for cell, units in UNITS_PER_CELL.items():
        alarm = alarms()[f"ReadyUnits{cell.capitalize()}"]
        assert {"Name": contract.METRIC_DIM_CELL, "Value": cell} in alarm["Dimensions"]
        # surge takes no unit out; one may be re-forming after a node failure; never below 1
        assert alarm["Threshold"] == max(1, units - 1) and alarm["EvaluationPeriods"] == 10


# The rule, as the operator reads it: a cell pages below its units, minus the in-cell wave a
# `replace` rollout takes out at once, minus one unit re-forming after a node failure; at least 1.
# 10 units in 2 cells of 5; 4 units per wave lay out as 2 units in each of the 2 cells
# (contract/rollout.py: 3 sequential waves, fewer than 1 x 2 lanes' 5 or 3/4 x 1 lane's 4).
WAVE_FLEET = {"units": 10, "units_per_cell": 5, "units_per_wave": 4}


@pytest.fixture(scope="module")
def rollout_synths(tmp_path_factory):
    return {
        mode: synthesize(config_with(**WAVE_FLEET, unit_rollout=mode), tmp_path_factory.mktemp(f"obs-{mode}"))
        for mode in ("surge", "replace")
    }


def cell_alarms(synth) -> dict[str, dict]:
    return {
        k[:-8]: v["Properties"]
        for k, v in synth.resources("Observability", "AWS::CloudWatch::Alarm").items()
        if k.startswith("ReadyUnitsCell")
    }


def test_surge_cells_page_below_all_their_units_but_one(rollout_synths):
    synth = rollout_synths["surge"]
    alarms_ = cell_alarms(synth)
    assert set(alarms_) == {"ReadyUnitsCell0", "ReadyUnitsCell1"}
    for alarm in alarms_.values():
        assert (alarm["ComparisonOperator"], alarm["Threshold"]) == ("LessThanThreshold", 5 - 0 - 1)
        assert "(5 units): fewer than 4 units ready for 10 minutes" in alarm["AlarmDescription"]
        assert "surge rollout keeps every unit in rotation" in alarm["AlarmDescription"]


def test_replace_cells_page_below_their_units_less_one_in_cell_wave_and_one_failure(rollout_synths):
    synth = rollout_synths["replace"]
    assert synth.deployment.config.wave_plan.wave_in_cell == 2  # the layout the rule reads
    for alarm in cell_alarms(synth).values():
        assert alarm["Threshold"] == 5 - 2 - 1
        assert "(5 units): fewer than 2 units ready for 10 minutes" in alarm["AlarmDescription"]
        assert "replace rollout takes up to 2 of its units out at once" in alarm["AlarmDescription"]
        assert "docs/runbooks/unit-not-ready.md" in alarm["AlarmDescription"]


def test_a_cell_whose_rollout_may_take_every_unit_out_still_pages_with_no_unit_ready():
    # A replace wave as large as the cell, or a one-unit cell: the threshold stays 1.
    from stacks.observability import cell_ready_threshold

    assert cell_ready_threshold(3, unit_rollout="replace", wave_in_cell=4) == 1
    assert cell_ready_threshold(1, unit_rollout="surge", wave_in_cell=1) == 1
    with pytest.raises(ValueError, match="unit_rollout='blue'"):
        cell_ready_threshold(3, unit_rollout="blue", wave_in_cell=1)


def test_alarm_topic_is_kms_encrypted_ssl_only_and_mails_the_configured_address():
    t = Template.from_json(template("Observability"))
    t.has_resource_properties(
        "AWS::SNS::Topic", {"KmsMasterKeyId": {"Fn::GetAtt": [Match.string_like_regexp("AlarmTopicKey"), "Arn"]}}
    )
    t.has_resource_properties("AWS::KMS::Key", {"EnableKeyRotation": True})
    t.has_resource_properties("AWS::SNS::Subscription", {"Protocol": "email", "Endpoint": "oncall@example.com"})
    t.has_resource_properties(
        "AWS::SNS::TopicPolicy",
        {
            "PolicyDocument": {
                "Statement": Match.array_with(
                    [Match.object_like({"Effect": "Deny", "Condition": {"Bool": {"aws:SecureTransport": "false"}}})]
                )
            }
        },
    )
    t.has_resource_properties(
        "AWS::KMS::Key",
        {
            "KeyPolicy": {
                "Statement": Match.array_with(
                    [
                        Match.object_like(
                            {
                                "Principal": {"Service": "cloudwatch.amazonaws.com"},
                                "Action": ["kms:Decrypt", "kms:GenerateDataKey*"],
                            }
                        )
                    ]
                )
            }
        },
    )


def _dashboard_body() -> str:
    (dash,) = [v for v in template("Observability")["Resources"].values() if v["Type"] == "AWS::CloudWatch::Dashboard"]
    return json.dumps(dash["Properties"]["DashboardBody"])


@pytest.mark.parametrize(
    "needle",
    [
        "RequestCount",
        "HTTPCode_ELB_4XX_Count",
        "HTTPCode_Target_4XX_Count",
        "HTTPCode_ELB_5XX_Count",
        "HTTPCode_Target_5XX_Count",
        "TargetResponseTime",
        "p50",
        "p99",
        contract.METRIC_TIME_TO_FIRST_TOKEN,
        contract.METRIC_OUTPUT_TOKENS,
        "PERIOD(tok)",
        contract.METRIC_READY_UNITS,
        contract.METRIC_ROUTED_TO_PREFERRED,
        contract.METRIC_BUSIEST_UNIT_LOAD,
        "HealthyHostCount",
        "UnHealthyHostCount",
        *UNITS_PER_CELL,
    ],
)
def test_dashboard_shows(needle):
    assert needle in _dashboard_body()


def test_without_alarm_email_there_is_no_subscription():
    app = cdk.App(builtin_cloud_formation_validation=False)
    stack = cdk.Stack(app, "Lb")
    vpc = ec2.Vpc(stack, "Vpc", max_azs=2)
    alb = elbv2.ApplicationLoadBalancer(stack, "Alb", vpc=vpc)
    tg = elbv2.ApplicationTargetGroup(stack, "Tg", vpc=vpc, port=80)
    alb.add_listener("L", port=80).add_target_groups("T", target_groups=[tg])
    obs = ObservabilityStack(
        app,
        "O",
        load_balancer=alb,
        target_groups=[tg],
        units_per_cell={"cell0": 1},
        unit_rollout="surge",
        wave_in_cell=1,
        alarm_email=None,
    )
    Template.from_stack(obs).resource_count_is("AWS::SNS::Subscription", 0)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_5xx_percent": 0}, "max_5xx_percent=0"),
        ({"min_ready_units": 0}, "min_ready_units=0"),
        ({"units_per_cell": {}}, "units_per_cell"),
        ({"units_per_cell": {"cell0": 0}}, "units_per_cell"),
        ({"unit_rollout": "rolling"}, "unit_rollout='rolling'"),
        ({"wave_in_cell": 0}, "wave_in_cell=0"),
    ],
)
def test_bad_thresholds_are_rejected_naming_the_setting(kwargs, message):
    app = cdk.App(builtin_cloud_formation_validation=False)
    stack = cdk.Stack(app, "Lb")
    vpc = ec2.Vpc(stack, "Vpc", max_azs=2)
    alb = elbv2.ApplicationLoadBalancer(stack, "Alb", vpc=vpc)
    settings = {"units_per_cell": {"cell0": 1}, "unit_rollout": "surge", "wave_in_cell": 1, **kwargs}
    with pytest.raises(ValueError, match=message):
        ObservabilityStack(app, "O", load_balancer=alb, target_groups=[], **settings)
