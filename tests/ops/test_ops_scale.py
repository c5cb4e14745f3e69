"""`flotilla scale show | floor`: the scaler's range, units and last decisions read from its own
decision lines (moto's CloudWatch Logs), and the temporary floor in the SSM parameter the cloud
scaler reads (moto's SSM), confirmed or refused like every command that changes something."""

from __future__ import annotations

import json
import time

import pytest

from contract.scaling import DECISION_EVENT, ScalingPolicy, TemporaryFloor, parameter_name
from runtime.scaler import aws as runner

NAME = parameter_name("flotilla")
GROUP = "flotilla-Scaler-LogsF00D"


def write_decisions(aws, lines: list[dict]) -> None:
    aws.logs.create_log_group(logGroupName=GROUP)
    aws.logs.create_log_stream(logGroupName=GROUP, logStreamName="pass")
    now = time.time()
    events = [
        {
            "timestamp": int((now - 60 * (len(lines) - i)) * 1000),
            "message": json.dumps({"event": DECISION_EVENT, **line}),
        }
        for i, line in enumerate(lines)
    ]
    aws.logs.put_log_events(logGroupName=GROUP, logStreamName="pass", logEvents=events)


def decision(**kw) -> dict:
    base = {
        "rule": "steady",
        "reason": "12 batch slots demanded",
        "add": 0,
        "remove": [],
        "given_back": {},
        "floor": 2,
        "ceiling": 40,
        "minimum": 2,
        "ScalerTargetUnits": 6,
        "ScalerActiveUnits": 5,
        "ScalerPendingUnits": 1,
        "ScalerDrainingUnits": 0,
        "ScalerUnmetUnits": 0,
        "scheduled": [
            {"name": "prime-day", "start": "2026-07-08T06:00:00Z", "end": "2026-07-08T10:00:00Z", "units": 30}
        ],
    }
    return {**base, **kw}


def test_show_prints_the_range_the_units_and_the_changes_with_their_reasons(aws, run_cli):
    write_decisions(
        aws,
        [
            decision(rule="ahead", add=1, reason="rate rising: 6 units a cold start ahead"),
            decision(),
            decision(rule="absorb", remove=["cell0-unit5"], reason="the other 5 fill 40% of their slots"),
            decision(),
        ],
    )
    code, out = run_cli("scale", "show")
    assert code == 0, out
    text = " ".join(out.split())
    assert "2 to 40 units" in text and "5 serving, 1 starting, 0 draining; wants 6" in text
    assert "booked: prime-day 2026-07-08T06:00:00Z to 2026-07-08T10:00:00Z: 30 units" in text
    assert "rate rising" in text and "the other 5 fill 40%" in text
    code, out = run_cli("scale", "show", "--json")
    doc = json.loads(out)
    assert [c["rule"] for c in doc["changes"]] == ["ahead", "absorb"]
    assert (doc["floor"], doc["ceiling"], doc["serving"]) == (2, 40, 5)


def test_floor_writes_what_the_cloud_scaler_reads_and_clear_removes_it(aws, run_cli):
    code, out = run_cli("scale", "floor", "--units", "12", "--for", "2h", "--reason", "INC-7 cell2 lost", "--yes")
    assert code == 0, out
    stored = TemporaryFloor.loads(aws.ssm.get_parameter(Name=NAME)["Parameter"]["Value"])
    assert stored.units == 12 and stored.reason == "INC-7 cell2 lost"
    assert 2 * 3600 - 60 < stored.until_s - time.time() <= 2 * 3600
    # The cloud scaler's own reader (runtime/scaler/aws.py) over the same SSM: its next pass obeys it.
    read = runner.temporary_floor(aws.ssm, "flotilla")
    policy = ScalingPolicy(floor=2, ceiling=40, cold_start_s=600).with_temporary_floor(read)
    assert policy.minimum(time.time()) == (12, "the temporary floor")
    code, out = run_cli("scale", "floor", "--clear", "--yes")
    assert code == 0 and f"{NAME}: deleted" in out
    assert runner.temporary_floor(aws.ssm, "flotilla") is None


def test_floor_is_a_dry_run_or_refused_without_confirmation_and_needs_all_its_arguments(aws, run_cli, capsys):
    code, out = run_cli("scale", "floor", "--units", "3", "--for", "1h", "--reason", "drill", "--dry-run")
    assert code == 0 and "dry run: nothing changed" in out
    code, out = run_cli("scale", "floor", "--units", "3", "--for", "1h", "--reason", "drill")
    assert code == 1 and "refusing to set a temporary floor" in out
    assert not aws.ssm.describe_parameters()["Parameters"]
    code, out = run_cli("scale", "floor", "--units", "3")
    assert code == 2 and "--units is required with --for and --reason" in out
    with pytest.raises(SystemExit) as exc:  # argparse refuses the value itself
        run_cli("scale", "floor", "--units", "3", "--for", "30d", "--reason", "x", "--yes")
    assert exc.value.code == 2 and "at most 7d" in capsys.readouterr().err


def test_show_without_a_scaler_says_what_to_deploy(aws, run_cli):
    code, out = run_cli("scale", "show")
    assert code == 1 and "Scaler stack" in out
