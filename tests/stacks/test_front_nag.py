"""Layer 4: cdk-nag AwsSolutions finds nothing unacknowledged in the front-door stacks, and every
acknowledgement is one we meant, on the construct we meant, with a reason."""

from __future__ import annotations

import json
from pathlib import Path

import aws_cdk as cdk
import cdk_nag
import pytest

from front_app import build

# (rule, construct path): each one is explained where it is acknowledged.
EXPECTED_ACKNOWLEDGEMENTS = {
    ("AwsSolutions-EC23", "Discovery/AlbSecurityGroup/Resource"),
    ("AwsSolutions-S1", "Front/AccessLogs/Resource"),
    ("AwsSolutions-IAM5[Resource::*]", "Router/TaskDefinition/TaskRole/DefaultPolicy/Resource"),
    ("AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/"
     "AmazonECSInfrastructureRolePolicyForLoadBalancers]", "Router/Service/GreenTargetRole/Resource"),
    ("AwsSolutions-ECS2", "Router/TaskDefinition/Resource"),
}


@pytest.fixture(scope="module", params=["https", "http-only"])
def nag_report(request) -> dict:
    fa = build(certificate_arn=None) if request.param == "http-only" else build()
    cdk.Validations.of(fa.app).add_plugins(cdk_nag.AwsSolutionsChecks(fa.app))
    assembly = fa.app.synth()  # raises ValidationFailed on any unacknowledged finding
    reports = json.loads(Path(assembly.directory, "validation-report.json").read_text())["pluginReports"]
    (report,) = [r for r in reports if r["pluginName"] == "AwsSolutions"]
    return report


def test_cdk_nag_finds_no_unacknowledged_violation(nag_report):
    assert nag_report["conclusion"] == "success"
    assert nag_report["violations"] == []


def test_every_acknowledgement_is_expected_and_has_a_specific_reason(nag_report):
    found = set()
    for v in nag_report["suppressedViolations"]:
        assert len(v["reason"]) > 60, v["ruleName"]
        for c in v["violatingConstructs"]:
            found.add((v["ruleName"], c["constructPath"]))
    # Network's acknowledgements belong to (and are checked by) the infrastructure tests.
    assert {f for f in found if not f[1].startswith("Network/")} == EXPECTED_ACKNOWLEDGEMENTS


def test_each_acknowledgement_sits_on_the_resource_it_excuses(nag_report):
    for finding in nag_report["suppressedViolations"]:
        paths = [c["constructPath"] for c in finding["violatingConstructs"]]
        assert [finding["acknowledgedAt"]] == paths, finding["ruleName"]
