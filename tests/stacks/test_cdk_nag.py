"""cdk-nag AwsSolutions: zero unacknowledged findings; every acknowledgement sits on the exact
resource it excuses, with a specific reason, and none is stale. Checked with and without a
certificate, since the front door's listeners and security group rules differ."""

from __future__ import annotations

import json

import aws_cdk as cdk
import pytest
from aws_cdk import aws_ec2 as ec2
from cdk_nag import AwsSolutionsChecks
from synth_helpers import FRONT_DOORS, PREBUILT_IMAGE, REPO_ROOT, cdk_json_context, config_with, synthesize

from stacks.config import load_config

# The front door's acknowledgements (rule, construct path), each explained where it is made; the
# Network's and the cells' are covered by the checks below but not listed here.
FRONT_DOOR_ACKNOWLEDGEMENTS = {
    ("AwsSolutions-S1", "Front/AccessLogs/Resource"),
    ("AwsSolutions-IAM5[Resource::*]", "Router/TaskDefinition/TaskRole/DefaultPolicy/Resource"),
    (
        "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/"
        "AmazonECSInfrastructureRolePolicyForLoadBalancers]",
        "Router/Service/GreenTargetRole/Resource",
    ),
    ("AwsSolutions-ECS2", "Router/TaskDefinition/Resource"),
}
# Only when front.client_cidrs lists 0.0.0.0/0 (the operator's explicit choice).
OPEN_CLIENT_RANGE_ACKNOWLEDGEMENT = ("AwsSolutions-EC23", "Discovery/AlbSecurityGroup/Resource")
# Only when the router's image is built from this repository (no `image` configured): CDK then
# grants the ECR token, which has no resource-level permissions.
BUILT_IMAGE_ACKNOWLEDGEMENT = (
    "AwsSolutions-IAM5[Resource::*]",
    "Router/TaskDefinition/ExecutionRole/DefaultPolicy/Resource",
)
FRONT_DOOR_STACKS = ("Discovery/", "Front/", "Observability/", "Router/")


def nag(config, outdir):
    """(the synthesized deployment, cdk-nag's AwsSolutions report on it)."""
    synth = synthesize(config, outdir, plugins=[AwsSolutionsChecks()])
    report = json.loads((synth.outdir / "validation-report.json").read_text())
    (plugin,) = [p for p in report["pluginReports"] if p["pluginName"] == "AwsSolutions"]
    return synth, plugin


def front_door_acknowledgements(plugin) -> set[tuple[str, str]]:
    return {
        (f["ruleName"], c["constructPath"])
        for f in plugin["suppressedViolations"]
        for c in f["violatingConstructs"]
        if c["constructPath"].startswith(FRONT_DOOR_STACKS)
    }


@pytest.fixture(scope="module", params=[*FRONT_DOORS, "staging"])
def nagged(request, tmp_path_factory):
    """Two cells (3 units) so per-cell and per-unit acknowledgements are both exercised; "staging" is
    examples/staging.yaml (x86 units on the reference engine), held to the same rules."""
    if request.param == "staging":
        config = load_config(cdk_json_context()["flotilla"], str(REPO_ROOT / "examples" / "staging.yaml"))
        assert (config.units, config.cells) == (3, 2)
    else:
        config = config_with(units=3, units_per_cell=2, **FRONT_DOORS[request.param])
    return nag(config, tmp_path_factory.mktemp("cdk-nag"))


def built_image(synth) -> bool:
    """True when the images are built from this repository (assets), not a configured `image`."""
    return synth.deployment.config.image is None


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
        assert len(finding["reason"]) > 60, finding["ruleName"]


def test_the_front_door_acknowledges_exactly_the_expected_findings(nagged):
    synth, plugin = nagged
    expected = FRONT_DOOR_ACKNOWLEDGEMENTS | ({BUILT_IMAGE_ACKNOWLEDGEMENT} if built_image(synth) else set())
    if "0.0.0.0/0" in synth.deployment.config.front.client_cidrs:
        expected |= {OPEN_CLIENT_RANGE_ACKNOWLEDGEMENT}
    assert front_door_acknowledgements(plugin) == expected


def test_with_a_prebuilt_image_the_router_acknowledges_no_ecr_token_grant(tmp_path):
    _, plugin = nag(config_with(image=PREBUILT_IMAGE), tmp_path)
    assert plugin["violations"] == []
    assert front_door_acknowledgements(plugin) == FRONT_DOOR_ACKNOWLEDGEMENTS


def test_every_acknowledgement_matches_a_real_finding(nagged):
    synth, plugin = nagged
    used = {(f["acknowledgedAt"], f["acknowledgedId"]) for f in plugin["suppressedViolations"]}
    declared = set()
    for construct in synth.app.node.find_all():
        for entry in construct.node.metadata:
            if entry.type == cdk.Validations.ACKNOWLEDGED_RULES_METADATA_KEY:
                declared |= {(construct.node.path, rule) for rule in entry.data if rule.startswith("AwsSolutions::")}
    assert declared == used, sorted(declared ^ used)


def test_nag_fails_synth_on_an_unacknowledged_finding(tmp_path):
    """The check has teeth: SSH open to the world is a finding that fails synth."""
    app = cdk.App(outdir=str(tmp_path), builtin_cloud_formation_validation=False)
    stack = cdk.Stack(app, "Open")
    vpc = ec2.Vpc(
        stack,
        "Vpc",
        max_azs=1,
        nat_gateways=0,
        restrict_default_security_group=False,
        subnet_configuration=[ec2.SubnetConfiguration(name="p", subnet_type=ec2.SubnetType.PUBLIC)],
    )
    sg = ec2.SecurityGroup(stack, "Sg", vpc=vpc)
    sg.add_ingress_rule(ec2.Peer.any_ipv4(), ec2.Port.tcp(22))
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks())
    with pytest.raises(Exception, match="ValidationFailed"):
        app.synth()
