"""The public front door: synth refuses it without TLS or without API keys, and its AWS WAF web ACL
counts the body rules a prompt can trip and logs every request with the API key redacted.

Expected rule names are typed from AWS's tables (AWS WAF developer guide, "Baseline rule groups":
core rule set and Known bad inputs), not read from the stacks."""

from __future__ import annotations

import json

import pytest
from synth_helpers import CERTIFICATE_ARN, REPO_ROOT, cdk_json_context, config_with, run_app, synthesize

from stacks.config import ConfigError

PUBLIC = {"scheme": "internet-facing", "client_cidrs": ["203.0.113.0/24"]}
PRINCIPAL = "arn:aws:iam::210987654321:root"

# The body rules of the two groups in use whose patterns occur in ordinary text: pasted HTML, a path
# in a question about files, a URL, the EC2 metadata address, a ${jndi:...} or java.lang class name in
# a coding question, and any body past 8 KB (a long chat history).
CORE_RULE_SET_BODY = {
    "SizeRestrictions_BODY",
    "CrossSiteScripting_BODY",
    "GenericLFI_BODY",
    "GenericRFI_BODY",
    "EC2MetaDataSSRF_BODY",
}
KNOWN_BAD_INPUTS_BODY = {"Log4JRCE_BODY", "JavaDeserializationRCE_BODY"}


def overrides(acl: dict) -> dict[str, dict[str, dict]]:
    """{rule group: {rule: the action it is overridden to}} of the web ACL's managed groups."""
    out = {}
    for rule in acl["Properties"]["Rules"]:
        group = rule["Statement"].get("ManagedRuleGroupStatement")
        if group is not None:
            out[group["Name"]] = {o["Name"]: o["ActionToUse"] for o in group.get("RuleActionOverrides", [])}
    return out


def only(synth, type_: str) -> tuple[str, dict]:
    found = synth.resources("Front", type_)
    assert len(found) == 1, f"expected one {type_}, found {sorted(found)}"
    return next(iter(found.items()))


# --- refusals ------------------------------------------------------------------------------------


def test_internet_facing_without_a_certificate_is_refused_naming_certificate_arn():
    with pytest.raises(ConfigError) as err:
        config_with(front=PUBLIC)
    line = str(err.value)
    assert line.startswith("certificate_arn is required with front.scheme internet-facing")
    assert "set certificate_arn" in line and "front.scheme: internal" in line and "\n" not in line


@pytest.mark.parametrize(
    "front, undo",
    [
        ({**PUBLIC, "api_keys": False}, "front.scheme: internal"),
        ({"privatelink_principals": [PRINCIPAL], "api_keys": False}, "remove front.privatelink_principals"),
    ],
)
def test_a_door_others_can_reach_without_api_keys_is_refused_naming_front_api_keys(front, undo):
    with pytest.raises(ConfigError) as err:
        config_with(certificate_arn=CERTIFICATE_ARN, front=front)
    line = str(err.value)
    assert line.startswith("front.api_keys=False is not allowed with")
    assert "set front.api_keys: true" in line and "flotilla keys create" in line and undo in line
    assert "\n" not in line


def test_an_internal_door_may_go_without_keys_and_certificate():
    """Inside the VPC the network is the boundary: nothing is refused."""
    config_with(front={"api_keys": False})


def test_synth_refuses_the_plain_http_public_door_with_one_line(tmp_path):
    proc = run_app("front:\n  scheme: internet-facing\n  client_cidrs: [203.0.113.0/24]\n", tmp_path)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: certificate_arn is required with front.scheme internet-facing")


def test_every_shipped_example_passes_the_front_door_checks():
    from stacks.config import load_config

    for example in sorted((REPO_ROOT / "examples").glob("*.yaml")):
        load_config(cdk_json_context()["flotilla"], str(example))


# --- WAF ---------------------------------------------------------------------------------------


def test_every_body_rule_a_prompt_can_trip_counts_and_nothing_else_is_relaxed(https_front_door_synth):
    _, acl = only(https_front_door_synth, "AWS::WAFv2::WebACL")
    by_group = overrides(acl)
    assert by_group["AWSManagedRulesCommonRuleSet"] == {r: {"Count": {}} for r in CORE_RULE_SET_BODY}
    assert by_group["AWSManagedRulesKnownBadInputsRuleSet"] == {r: {"Count": {}} for r in KNOWN_BAD_INPUTS_BODY}
    assert by_group["AWSManagedRulesAmazonIpReputationList"] == {}
    # The groups themselves still act (OverrideAction None): every other rule blocks.
    assert all(
        r["OverrideAction"] == {"None": {}}
        for r in acl["Properties"]["Rules"]
        if "ManagedRuleGroupStatement" in r["Statement"]
    )


def test_a_body_rule_the_config_names_blocks_again(tmp_path):
    synth = synthesize(
        config_with(
            certificate_arn=CERTIFICATE_ARN,
            front={**PUBLIC, "waf_blocked_body_rules": ["CrossSiteScripting_BODY", "Log4JRCE_BODY"]},
        ),
        tmp_path,
    )
    by_group = overrides(only(synth, "AWS::WAFv2::WebACL")[1])
    assert set(by_group["AWSManagedRulesCommonRuleSet"]) == CORE_RULE_SET_BODY - {"CrossSiteScripting_BODY"}
    assert set(by_group["AWSManagedRulesKnownBadInputsRuleSet"]) == KNOWN_BAD_INPUTS_BODY - {"Log4JRCE_BODY"}


def test_an_unknown_rule_to_block_is_refused_with_the_names_allowed():
    with pytest.raises(ConfigError) as err:
        config_with(certificate_arn=CERTIFICATE_ARN, front={**PUBLIC, "waf_blocked_body_rules": ["SQLi_BODY"]})
    assert err.value.key == "front.waf_blocked_body_rules" and "CrossSiteScripting_BODY" in str(err.value)


def test_the_web_acl_logs_to_an_encrypted_aws_waf_logs_group_with_the_api_key_redacted(https_front_door_synth):
    resources = https_front_door_synth.resources("Front")
    acl_id, _ = only(https_front_door_synth, "AWS::WAFv2::WebACL")
    _, logging = only(https_front_door_synth, "AWS::WAFv2::LoggingConfiguration")
    props = logging["Properties"]
    assert props["ResourceArn"] == {"Fn::GetAtt": [acl_id, "Arn"]}
    # The API key travels in Authorization (Bearer): WAF matches header names case-insensitively.
    assert {f["SingleHeader"]["Name"].lower() for f in props["RedactedFields"]} == {"authorization"}
    (destination,) = props["LogDestinationConfigs"]
    parts = destination["Fn::Join"][1]
    assert parts[-2] == ":log-group:"  # a log group ARN, without the ":*" of Fn::GetAtt Arn
    group_id = parts[-1]["Ref"]
    group = resources[group_id]["Properties"]
    assert group["LogGroupName"].startswith("aws-waf-logs-")
    assert group["RetentionInDays"] == 30  # node.log_retention_days
    key_id = group["KmsKeyId"]["Fn::GetAtt"][0]
    key = resources[key_id]["Properties"]
    assert key["EnableKeyRotation"] is True
    (logs_use,) = [
        s for s in key["KeyPolicy"]["Statement"] if "logs." in json.dumps(s.get("Principal", {}).get("Service", ""))
    ]
    context = logs_use["Condition"]["ArnEquals"]["kms:EncryptionContext:aws:logs:arn"]
    assert json.dumps(context).endswith(f':log-group:{group["LogGroupName"]}"]]}}')


def test_an_internal_door_has_no_web_acl_and_no_waf_logs(default_synth):
    assert default_synth.resources("Front", "AWS::WAFv2::WebACL") == {}
    assert default_synth.resources("Front", "AWS::WAFv2::LoggingConfiguration") == {}
