"""cfn-lint: zero errors on every synthesized template; any warning must be listed here with why.

Every stack of the deployment is linted with and without a certificate (the front door's two
shapes), plus the cells of the other instance types and fleet sizes.
"""

from __future__ import annotations

import functools
import json

import pytest

# rule id -> why it is acceptable. Empty today: every template lints clean. (CDK's blue/green
# listener rules raise W3005, redundant DependsOn, only when the rules and the ECS service share a
# stack; the service lives in the Router stack, the rules in Front.)
ALLOWED_WARNINGS: dict[str, str] = {}

# Every stack of the default deployment, in deploy order; test_every_stack_is_linted keeps it whole.
STACK_IDS = ["Network", "Discovery", "Cell-0", "Front", "Observability", "Router"]


def lint_template(template: dict) -> list:
    return _lint(json.dumps(template, sort_keys=True))


@functools.lru_cache(maxsize=None)
def _lint(template_json: str) -> list:
    # A stack the certificate does not change (Network, Cell-0) is the same text in both front
    # doors: lint it once.
    # Imported here: cfn-lint (and networkx under it) is a second of every test worker's collection.
    from cfnlint.api import ManualArgs, lint

    return lint(template_json, config=ManualArgs(regions=["us-east-1", "us-west-2"]))


def assert_lints_clean(stack_id: str, template: dict) -> None:
    matches = lint_template(template)
    errors = [m for m in matches if m.rule.id.startswith("E")]
    assert not errors, [f"{stack_id}: {m.rule.id} {m.message} at {m.path}" for m in errors]
    unexplained = [m for m in matches if m.rule.id not in ALLOWED_WARNINGS]
    assert not unexplained, [f"{stack_id}: {m.rule.id} {m.message}" for m in unexplained]


@pytest.mark.parametrize("stack_id", STACK_IDS)
def test_deployment_templates_lint_clean(deployment_synth, stack_id):
    assert_lints_clean(stack_id, deployment_synth.template(stack_id))


def test_every_stack_is_linted(deployment_synth):
    assert [s.node.id for s in deployment_synth.stacks] == STACK_IDS


def test_trn1n_cell_template_lints_clean(trn1n_synth):
    assert_lints_clean("Cell-0", trn1n_synth.template("Cell-0"))


@pytest.mark.parametrize("stack_id", ["Cell-0", "Cell-1"])
def test_staging_cell_templates_lint_clean(staging_synth, stack_id):
    """x86 units: one ordinary interface with SecurityGroupIds, no devices, the x86 AMI parameter."""
    assert_lints_clean(stack_id, staging_synth.template(stack_id))


def test_full_twenty_unit_cell_of_the_fleet_lints_clean(fleet_synth):
    # Every fleet cell is built by the same code; Cell-0 (20 units) stands for all eight.
    assert_lints_clean("Cell-0", fleet_synth.template("Cell-0"))


def test_linter_reports_a_real_error_so_a_clean_result_means_something(default_synth):
    broken = json.loads(json.dumps(default_synth.template("Cell-0")))
    pg = next(r for r in broken["Resources"].values() if r["Type"] == "AWS::EC2::PlacementGroup")
    pg["Properties"]["Strategy"] = "clustered"
    assert any(m.rule.id.startswith("E") for m in lint_template(broken))
