"""The cloud scaler's pass (runtime/scaler/aws.py) against moto's ECS, CloudWatch Logs, CloudWatch and
SSM: units started and drained by their services' desired count, never a fixed (floor or drained)
unit, no second start while units are starting, a unit that does not serve in time given back whole
and reported, a temporary floor obeyed, and every cell's counts mirrored for the next deploy."""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
import time
from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from contract import scaling
from contract.scaling import ScalingPolicy, TemporaryFloor
from runtime.scaler import aws
from runtime.scaler.aws import Clients, Settings, counts_parameter, run_pass

REGION = "us-east-1"
DEPLOYMENT = "flotilla"
GROUP = "flotilla-Router-LogsA1B2"
COLD = 600.0
# CloudWatch Logs takes events from the last 14 days and at most 2 hours ahead: the passes run in
# the recent past.
T0 = float(int(time.time()) // 60 * 60 - 4 * 3600)


@pytest.fixture
def cloud(monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    with mock_aws():
        clients = Clients(**{n: boto3.client(n, region_name=REGION) for n in ("ecs", "logs", "cloudwatch", "ssm")})
        clients.ecs.create_cluster(clusterName="flotilla-cell0")
        clients.ecs.register_task_definition(
            family="node", containerDefinitions=[{"name": "n", "image": "x", "memory": 64}]
        )
        for index, desired in enumerate((2, 2, 0, 0)):
            clients.ecs.create_service(
                cluster="flotilla-cell0",
                serviceName=f"unit{index}",
                taskDefinition="node",
                desiredCount=desired,
                tags=[{"key": "flotilla:unit", "value": f"cell0-unit{index}"}],
            )
        clients.logs.create_log_group(logGroupName=GROUP)
        clients.logs.create_log_stream(logGroupName=GROUP, logStreamName="router")
        clients.ssm.put_parameter(Name=counts_parameter(DEPLOYMENT, 0), Value="0,0,0,0", Type="StringList")
        yield clients


def settings() -> Settings:
    policy = ScalingPolicy(floor=1, ceiling=4, cold_start_s=COLD)
    return Settings(
        deployment=DEPLOYMENT,
        cells=1,
        units_per_cell=4,
        nodes_per_unit=2,
        fixed=frozenset({"cell0-unit0"}),
        policy=policy,
        start_timeout_s=3 * COLD,
    )


def report(clients, now: float, units: dict[str, dict]) -> None:
    """A router's unit_states line and its traffic metric, as the router writes them."""
    line = {"ts": now, "event": "unit_states", "cell": "cell0", "units": units}
    clients.logs.put_log_events(
        logGroupName=GROUP,
        logStreamName="router",
        logEvents=[{"timestamp": int(now * 1000), "message": json.dumps(line)}],
    )
    for minute in range(1, 4):
        clients.cloudwatch.put_metric_data(
            Namespace="Flotilla",
            MetricData=[
                {
                    "MetricName": scaling.METRIC_REQUESTS,
                    "Dimensions": [{"Name": "Service", "Value": "flotilla"}],
                    "Timestamp": datetime.datetime.fromtimestamp(now - 60 * minute, tz=datetime.timezone.utc),
                    "Value": 1200.0,
                    "Unit": "Count",
                }
            ],
        )


def busy(running: int = 16, queued: int = 8) -> dict:
    return {"routable": True, "state": "ready", "running": running, "queue_depth": queued, "max_running": 16}


def desired(clients) -> dict[str, int]:
    arns = clients.ecs.list_services(cluster="flotilla-cell0")["serviceArns"]
    described = clients.ecs.describe_services(cluster="flotilla-cell0", services=arns, include=["TAGS"])["services"]
    return {s["tags"][0]["value"]: s["desiredCount"] for s in described}


def state(clients) -> aws.State:
    return aws.State.loads(clients.ssm.get_parameter(Name=settings().state_parameter)["Parameter"]["Value"])


def test_demand_starts_whole_units_and_units_starting_are_not_started_again(cloud, capsys):
    report(cloud, T0, {"cell0-unit0": busy(), "cell0-unit1": busy()})
    d = run_pass(cloud, settings(), now=T0 + 1)
    # 2 units x (16 running + 8 queued) = 48 batch slots; 12 per unit at 75 % of 16: 4 units.
    assert d.add == 2
    assert desired(cloud) == {"cell0-unit0": 2, "cell0-unit1": 2, "cell0-unit2": 2, "cell0-unit3": 2}
    assert set(state(cloud).starting) == {"cell0-unit2", "cell0-unit3"}
    # The next deploy reads these counts: they are what the scaler set.
    assert cloud.ssm.get_parameter(Name=counts_parameter(DEPLOYMENT, 0))["Parameter"]["Value"] == "2,2,2,2"
    line = json.loads([x for x in capsys.readouterr().out.splitlines() if scaling.DECISION_EVENT in x][-1])
    assert line["changed"] == {"cell0-unit2": 2, "cell0-unit3": 2} and line[scaling.METRIC_TARGET_UNITS] == 4
    # Ten minutes on, the fleet still pressed and the new units still loading: nothing more starts.
    report(cloud, T0 + 600, {"cell0-unit0": busy(), "cell0-unit1": busy()})
    again = run_pass(cloud, settings(), now=T0 + 601)
    assert again.add == 0 and again.pending == 2, again.reason


def test_a_unit_that_does_not_serve_in_time_is_given_back_whole_and_reported(cloud, capsys):
    report(cloud, T0, {"cell0-unit0": busy(), "cell0-unit1": busy()})
    run_pass(cloud, settings(), now=T0 + 1)
    late = T0 + 3 * COLD + 60
    report(cloud, late, {"cell0-unit0": busy(), "cell0-unit1": busy(), "cell0-unit3": busy(2, 0)})
    d = run_pass(cloud, settings(), now=late + 1)
    assert desired(cloud)["cell0-unit2"] == 0 and desired(cloud)["cell0-unit3"] == 2
    assert "cell0-unit2" in state(cloud).given_back and "not serving" in state(cloud).given_back["cell0-unit2"]["why"]
    assert any('"unit_given_back"' in x and "cell0-unit2" in x for x in capsys.readouterr().out.splitlines())
    # It counts against what capacity allows, and is not started again at once.
    report(cloud, late + 60, {"cell0-unit0": busy(), "cell0-unit1": busy(), "cell0-unit3": busy()})
    after = run_pass(cloud, settings(), now=late + 61)
    assert desired(cloud)["cell0-unit2"] == 0 and after.unmet > 0, after.reason
    assert d.direction in ("hold", "up")


def test_a_quiet_fleet_drains_the_least_loaded_unit_it_may_and_never_a_fixed_one(cloud):
    for unit in ("unit2", "unit3"):
        cloud.ecs.update_service(cluster="flotilla-cell0", service=unit, desiredCount=2)
    quiet = {f"cell0-unit{i}": busy(running, 0) for i, running in enumerate((0, 2, 1, 3))}
    report(cloud, T0, quiet)
    d = run_pass(cloud, settings(), now=T0 + 1)
    assert len(d.remove) >= 1
    counts = desired(cloud)
    assert counts["cell0-unit0"] == 2, "a unit of the floor was drained"
    assert counts["cell0-unit2"] == 0  # the least loaded of those the scaler may drain


def test_an_operators_temporary_floor_starts_units_until_it_lapses(cloud):
    floor = TemporaryFloor(units=3, until_s=T0 + 3600, reason="incident")
    cloud.ssm.put_parameter(Name=scaling.parameter_name(DEPLOYMENT), Value=floor.dumps(), Type="String")
    report(cloud, T0, {"cell0-unit0": busy(0, 0), "cell0-unit1": busy(0, 0)})
    d = run_pass(cloud, settings(), now=T0 + 1)
    assert d.add == 1 and d.rule == "floor" and "temporary floor" in d.reason


def test_the_handler_imports_with_the_standard_library_and_boto3_alone():
    """The Lambda runtime brings no pydantic and the function's package holds only contract/ and the
    scaler (stacks/scaler.py CODE_EXCLUDE): the handler, and every contract module it imports, must
    load without it (a range's words come from contract/bad_input.py, not contract/declare.py)."""
    blocked = "import sys; sys.modules['pydantic'] = sys.modules['pydantic_core'] = None; import runtime.scaler.aws"
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", blocked], cwd=root, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
