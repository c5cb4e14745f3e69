"""`flotilla shed set | clear | show`: the admission limit in the deployment's SSM parameter (moto),
in the format the routers read, dry run and refusal by default."""

from __future__ import annotations

import asyncio
import json

import pytest

from contract.admission import AdmissionLimit, parameter_name
from runtime.router.admission import AdmissionControl, ParameterSource

NAME = parameter_name("flotilla")


def _value(aws):
    return aws.ssm.get_parameter(Name=NAME)["Parameter"]["Value"]


def test_set_writes_the_limit_a_router_then_applies(aws, run_cli):
    code, out = run_cli(
        "shed", "set", "--admit-percent", "60", "--max-queue-depth", "8", "--reason", "INC-42 cell1 down", "--yes"
    )
    assert code == 0, out
    assert "admit 60% of new requests" in out and "units take nothing new at queue depth 8" in out
    assert AdmissionLimit.loads(_value(aws)) == AdmissionLimit(
        admit_percent=60, max_queue_depth=8, reason="INC-42 cell1 down"
    )
    # What the router's reader makes of it (runtime/router/admission.py over the same moto SSM).
    control = AdmissionControl(ParameterSource(NAME, client=aws.ssm).read, interval_s=10, name=NAME)
    asyncio.run(control.refresh())
    assert control.limit.admit_percent == 60 and control.caps(64, 32) == (64, 8)
    code, out = run_cli("shed", "show")
    assert code == 0 and "admit 60% of new requests" in out and "INC-42 cell1 down" in " ".join(out.split())
    code, out = run_cli("shed", "clear", "--yes")
    assert code == 0 and f"{NAME}: deleted" in out
    asyncio.run(control.refresh())
    assert control.limit is None
    code, out = run_cli("shed", "show")
    assert code == 0 and "no admission limit" in out


def test_set_and_clear_are_dry_runs_or_refused_without_confirmation(aws, run_cli):
    code, out = run_cli("shed", "set", "--admit-percent", "50", "--reason", "drill", "--dry-run")
    assert code == 0 and "dry run: nothing changed" in out
    code, out = run_cli("shed", "set", "--admit-percent", "50", "--reason", "drill")
    assert code == 1 and "refusing to set the admission limit of flotilla" in out
    assert not aws.ssm.describe_parameters()["Parameters"]
    assert run_cli("shed", "set", "--admit-percent", "50", "--reason", "drill", "--yes")[0] == 0
    code, out = run_cli("shed", "clear")
    assert code == 1 and "refusing to clear" in out
    assert _value(aws)


def test_set_without_any_limit_is_a_usage_error(aws, run_cli):
    code, out = run_cli("shed", "set", "--reason", "x", "--yes")
    assert code == 2 and "--admit-percent, --max-queue-depth, --max-outstanding-per-unit" in out


@pytest.mark.parametrize("argv", [["--admit-percent", "150"], ["--max-queue-depth", "0"], ["--admit-percent", "half"]])
def test_out_of_range_values_are_refused_by_the_parser(aws, run_cli, capsys, argv):
    with pytest.raises(SystemExit) as exc:
        run_cli("shed", "set", *argv, "--reason", "x", "--yes")
    assert exc.value.code == 2
    assert argv[0] in capsys.readouterr().err


def test_status_says_when_a_limit_is_in_force(aws, fleet, run_cli):
    fleet.add_unit(cell=0, index=0)
    assert "admission limit" not in run_cli("status")[1]
    assert run_cli("shed", "set", "--max-outstanding-per-unit", "4", "--reason", "INC-7", "--yes")[0] == 0
    code, out = run_cli("status")
    assert code == 0 and "admission limit in force" in out and "INC-7" in out


def test_show_json_gives_the_limit_or_null(aws, run_cli):
    code, out = run_cli("shed", "show", "--json")
    assert code == 0 and json.loads(out) == {"parameter": NAME, "limit": None, "since": None}
    assert run_cli("shed", "set", "--admit-percent", "0", "--reason", "INC-1 stop", "--yes")[0] == 0
    code, out = run_cli("shed", "show", "--json")
    doc = json.loads(out)
    assert code == 0 and AdmissionLimit.loads(json.dumps(doc["limit"])) == AdmissionLimit(
        admit_percent=0, reason="INC-1 stop"
    )
