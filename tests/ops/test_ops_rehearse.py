"""`flotilla rehearse` as an operator runs it: bad input is refused in one line, and a real rehearsal
of a `replace` fleet (2 units, one rolling at a time) reports through the CLI that the other unit
carried every request. tests/rehearsal/ covers surge and the circuit breaker in depth."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "stacks"))
from synth_helpers import LLAMA_70B, config_with, synthesize  # noqa: E402


def test_rehearse_without_a_synthesized_assembly_says_to_run_make_synth(run_cli, tmp_path):
    code, out = run_cli("rehearse", "--cdk-out", str(tmp_path / "nowhere"))
    assert code == 2
    assert "manifest.json does not exist" in out and "make synth" in out


@pytest.mark.parametrize(
    "flag,value,allowed",
    [
        ("--time-scale", "2", "a number above 0, at most 1"),
        ("--clients", "0", "an integer from 1 to 64"),
        ("--load-seconds", "-1", "a number from 0 to 600"),
        # the echo engine's context is 2048 tokens, prompt included
        ("--answer-tokens", "2001", "an integer from 1 to 2000"),
    ],
)
def test_rehearse_refuses_out_of_range_flags_naming_the_flag(run_cli, tmp_path, flag, value, allowed):
    code, out = run_cli("rehearse", "--cdk-out", str(tmp_path), flag, value)
    assert code == 2
    assert f"{flag}={value} is out of range: give {allowed}" in out


@pytest.mark.timeout(300)
def test_a_replace_rollout_takes_one_unit_out_at_a_time_and_the_other_serves_every_request(run_cli, tmp_path):
    out = tmp_path / "cdk.out"
    synthesize(config_with(units=2, nodes_per_unit=2, unit_rollout="replace", units_per_wave=1, model=LLAMA_70B), out)
    code, text = run_cli("rehearse", "--cdk-out", str(out), "--json", "--keep-logs", str(tmp_path / "run"))
    report = json.loads(text)
    assert code == 0, report["failures"][:5]
    assert report["rollout"] == {"Cell-0": "COMPLETE"}
    # replace (minimum healthy 0 %) takes a rolling unit out of rotation: never more than the wave of 1
    assert report["floor"] == 1
    assert report["min_in_rotation"] == 1, report["rotation"]
    assert report["failures"] == []
    assert report["served"] > 40


def test_rehearse_waves_prints_the_waves_of_the_templates_and_the_deploy_command(run_cli, tmp_path):
    out = tmp_path / "cdk.out"
    synthesize(config_with(units=6, units_per_cell=2, units_per_wave=4), out)
    code, text = run_cli("rehearse", "--cdk-out", str(out), "--waves")
    assert code == 0
    assert "6 units in 3 cell stack(s): 2 sequential waves, at most 4 units at once, 2 cell stack(s) at once" in text
    assert "wave 1: cell0-unit0, cell0-unit1, cell1-unit0, cell1-unit1" in text
    assert "wave 2: cell2-unit0, cell2-unit1" in text
    assert "cdk deploy --all --concurrency 3" in text
    assert "with --concurrency 1: 3 sequential waves" in text
