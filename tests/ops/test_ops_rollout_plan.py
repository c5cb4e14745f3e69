"""`flotilla rollout plan --config PATH`: the simulated rollout recommends units_per_wave for an
existing config, read with the CDK app's own loader, and names the config line to change."""

from __future__ import annotations

import json

import pytest

# Units of 4 nodes need a model whose heads split over them (synth's layout check, which the config loader
# runs): Llama-3.1-405B's 128 over 128 NeuronCores. The simulated rollout depends on the unit count, not
# the model.
UNITS_OF_4 = "nodes_per_unit: 4\nmodel: {name: llama-3.1-405b-instruct}\n"
UNITS_OF_2 = "nodes_per_unit: 2\nmodel: {name: llama-3.1-70b-instruct}\n"


def write(tmp_path, text: str, name: str = "flotilla.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def plan_json(run_cli, *argv: str) -> dict:
    code, out = run_cli("rollout", "plan", *argv, "--json")
    assert code == 0, out
    return json.loads(out)


def test_the_recommendation_follows_the_configs_fleet_size(run_cli, tmp_path):
    big = write(tmp_path, "units: 160\n" + UNITS_OF_4 + "unit_rollout: surge\n", "big.yaml")
    small = write(tmp_path, "units: 40\n" + UNITS_OF_4 + "unit_rollout: surge\n", "small.yaml")
    doc = plan_json(run_cli, "--config", big, "--load-minutes", "10")
    # surge keeps every unit in rotation: the largest wave up to ~10 % of 160 units, so at most 10
    # sequential waves of 16 instead of 160 one at a time
    assert doc["units"] == 160 and doc["cells"] == 8 and doc["unit_rollout"] == "surge"
    assert doc["units_per_wave"] == doc["recommended"]["units_per_wave"] == 16
    simulated = {s["units_per_wave"]: s for s in doc["simulated"]}
    assert simulated[1]["duration_s"] > 10 * simulated[16]["duration_s"]
    assert plan_json(run_cli, "--config", small)["units_per_wave"] == 4


def test_replace_with_a_tight_floor_recommends_a_smaller_wave_than_surge(run_cli, tmp_path):
    fleet = "units: 160\n" + UNITS_OF_4 + "units_per_cell: 20\n"
    surge = write(tmp_path, fleet + "unit_rollout: surge\n", "surge.yaml")
    replace = write(tmp_path, fleet + "unit_rollout: replace\n", "replace.yaml")
    busy = ("--demand", "0.95")  # 152 units' worth of demand: a wave of 16 out leaves 144
    s, r = plan_json(run_cli, "--config", surge, *busy), plan_json(run_cli, "--config", replace, *busy)
    assert s["units_per_wave"] == 16
    assert r["units_per_wave"] < s["units_per_wave"]
    assert r["recommended"]["shed_share"] == 0 and r["recommended"]["min_in_rotation"] >= 152
    assert r["current"]["units_per_wave"] == 16 and r["current"]["shed_share"] > 0


def test_surge_waves_fit_the_spare_nodes_at_the_configs_nodes_per_unit(run_cli, tmp_path):
    four = write(tmp_path, "units: 160\n" + UNITS_OF_4, "four.yaml")
    two = write(tmp_path, "units: 160\n" + UNITS_OF_2, "two.yaml")
    spare = ("--spare-nodes", "32")
    assert plan_json(run_cli, "--config", four, *spare)["units_per_wave"] == 8  # 8 x 4 nodes
    assert plan_json(run_cli, "--config", two, *spare)["units_per_wave"] == 16  # 16 x 2 nodes


def test_current_and_recommended_are_printed_with_the_config_line_to_change(run_cli, tmp_path):
    path = write(tmp_path, "units: 160\nunits_per_wave: 32   # fast\nunit_rollout: replace\n" + UNITS_OF_4)
    code, out = run_cli("rollout", "plan", "--config", path, "--demand", "0.95")
    assert code == 0, out
    text = " ".join(out.split())
    assert "unit_rollout replace, units_per_wave 32" in text
    assert "current │ 32 │" in text and "128 of 160 (80%; floor 128)" in text
    assert "recommended │ 8 │" in text and "152 of 160 (95%; floor 152) │ 0 min │ 0.00%" in text
    assert f"change {path} line 2: `units_per_wave: 32` -> `units_per_wave: 8`" in text
    assert f"cdk deploy --all --concurrency 3 -c config={path}" in text


def test_a_config_that_leaves_the_wave_unset_and_fits_needs_no_change(run_cli, tmp_path):
    path = write(tmp_path, "units: 160\n" + UNITS_OF_4 + "unit_rollout: replace\n")
    code, out = run_cli("rollout", "plan", "--config", path)
    assert code == 0, out
    assert f"no change: {path} leaves units_per_wave unset, which is 16" in " ".join(out.split())
    code, out = run_cli("rollout", "plan", "--config", path, "--demand", "0.95")
    assert f"add the line `units_per_wave: 8` at top level of {path}" in " ".join(out.split())


def test_the_example_fleet_config_is_read(run_cli):
    doc = plan_json(run_cli, "--config", "examples/fleet-20k-chips.yaml")
    assert (doc["units"], doc["nodes_per_unit"], doc["unit_rollout"]) == (320, 4, "replace")


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--config", "{tmp}/missing.yaml"], "missing.yaml: config="),
        (["--config", "{tmp}/bad.yaml"], "units_per_wave=9 is not allowed: at most units (3)"),
        (["--config", "{tmp}/typo.yaml"], "unit_rolout"),
        (
            ["--config", "{tmp}/ok.yaml", "--demand", "1.5"],
            "--demand=1.5 is out of range: give a number above 0, at most 1 (a share of the whole fleet's capacity",
        ),
        (
            ["--config", "{tmp}/ok.yaml", "--load-minutes", "0"],
            "--load-minutes=0 is out of range: give a number above 0",
        ),
        (
            ["--config", "{tmp}/ok.yaml", "--spare-nodes", "-1"],
            "--spare-nodes=-1 is out of range: give an integer of at least 0",
        ),
        (
            ["--config", "{tmp}/ok.yaml", "--node-failures-per-day", "2"],
            "--node-failures-per-day=2 is out of range: give a number from 0 to 1 (per node per day)",
        ),
    ],
)
def test_bad_input_exits_two_with_one_line_naming_it(run_cli, tmp_path, argv, needle):
    write(tmp_path, "units: 3\nunits_per_wave: 9\n", "bad.yaml")
    write(tmp_path, "units: 3\nunit_rolout: replace\n", "typo.yaml")
    write(tmp_path, "units: 3\n", "ok.yaml")
    code, out = run_cli("rollout", "plan", *(a.format(tmp=tmp_path) for a in argv))
    assert code == 2
    # One message (the console wraps it at 160 columns in a pipe).
    assert needle in " ".join(out.split()) and out.count("error:") == 1, out
