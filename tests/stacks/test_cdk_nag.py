"""cdk-nag AwsSolutions: zero unacknowledged findings; every acknowledgement sits on the exact
resource it excuses, with a specific reason, and none is stale."""

from __future__ import annotations

import json

import aws_cdk as cdk
import pytest
from aws_cdk import aws_ec2 as ec2
from cdk_nag import AwsSolutionsChecks

from synth_helpers import config_with, synthesize


@pytest.fixture(scope="module")
def nagged(tmp_path_factory):
    """Two cells (3 units) so per-cell and per-unit acknowledgements are both exercised."""
    synth = synthesize(config_with(units=3, units_per_cell=2),
                       tmp_path_factory.mktemp("cdk-nag"), plugins=[AwsSolutionsChecks()])
    report = json.loads((synth.outdir / "validation-report.json").read_text())
    (plugin,) = [p for p in report["pluginReports"] if p["pluginName"] == "AwsSolutions"]
    return synth, plugin


def test_aws_solutions_has_no_unacknowledged_findings(nagged):
    _, plugin = nagged
    assert plugin["violations"] == []
    assert plugin["conclusion"] == "success"


def test_each_acknowledgement_is_on_the_resource_it_excuses_with_a_specific_reason(nagged):
    _, plugin = nagged
    assert plugin["suppressedViolations"]
    for finding in plugin["suppressedViolations"]:
        paths = [c["constructPath"] for c in finding["violatingConstructs"]]
        # On the resource itself: never a stack- or app-wide blanket acknowledgement.
        assert [finding["acknowledgedAt"]] == paths, finding["ruleName"]
        assert len(finding["reason"]) >= 60, finding["ruleName"]


def test_every_acknowledgement_matches_a_real_finding(nagged):
    synth, plugin = nagged
    used = {(f["acknowledgedAt"], f["acknowledgedId"]) for f in plugin["suppressedViolations"]}
    declared = set()
    for construct in synth.app.node.find_all():
        for entry in construct.node.metadata:
            if entry.type == cdk.Validations.ACKNOWLEDGED_RULES_METADATA_KEY:
                declared |= {(construct.node.path, rule) for rule in entry.data
                             if rule.startswith("AwsSolutions::")}
    assert declared == used, sorted(declared ^ used)


def test_nag_fails_synth_on_an_unacknowledged_finding(tmp_path):
    """The check has teeth: SSH open to the world is a finding that fails synth."""
    app = cdk.App(outdir=str(tmp_path), builtin_cloud_formation_validation=False)
    stack = cdk.Stack(app, "Open")
    vpc = ec2.Vpc(stack, "Vpc", max_azs=1, nat_gateways=0, restrict_default_security_group=False,
                  subnet_configuration=[ec2.SubnetConfiguration(
                      name="p", subnet_type=ec2.SubnetType.PUBLIC)])
    sg = ec2.SecurityGroup(stack, "Sg", vpc=vpc)
    sg.add_ingress_rule(ec2.Peer.any_ipv4(), ec2.Port.tcp(22))
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks())
    with pytest.raises(Exception, match="ValidationFailed"):
        app.synth()
