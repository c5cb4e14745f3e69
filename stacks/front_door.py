"""The front door's rules that the deployment config and the Front stack share: what synth refuses
for a door others can reach, and which AWS WAF managed rules only count. No aws_cdk here: the config
checks run before anything is built."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from contract.bad_input import NOT_GIVEN

if TYPE_CHECKING:
    from stacks.config import FlotillaConfig

# AWS managed rules that inspect the request *body* and can match an ordinary prompt, by rule group
# (AWS WAF developer guide, "Baseline rule groups": the core rule set, AWSManagedRulesCommonRuleSet,
# and Known bad inputs, AWSManagedRulesKnownBadInputsRuleSet; rule names as those tables spell them).
# A prompt is text a user wrote or pasted: HTML (CrossSiteScripting_BODY), a file path such as
# ../../etc/passwd in a question about one (GenericLFI_BODY), a URL (GenericRFI_BODY), the metadata
# address 169.254.169.254 in a cloud question (EC2MetaDataSSRF_BODY), a ${jndi:...} string or Java
# class names in a security or coding question (Log4JRCE_BODY, JavaDeserializationRCE_BODY), and
# any chat history past 8 KB (SizeRestrictions_BODY, "Inspects for request bodies that are over 8 KB
# (8,192 bytes)"). Blocked, each answers 403 at the ALB and never reaches the routers' metrics; so the
# web ACL counts them and logs every match, and front.waf_blocked_body_rules turns a rule back to
# block once its log shows only attacks (docs/runbooks/waf-body-rules.md). The prompt is the model's
# input, not code anything executes, which is why counting costs no protection the routers relied on.
COUNTED_BODY_RULES: dict[str, tuple[str, ...]] = {
    "AWSManagedRulesCommonRuleSet": (
        "SizeRestrictions_BODY",
        "CrossSiteScripting_BODY",
        "GenericLFI_BODY",
        "GenericRFI_BODY",
        "EC2MetaDataSSRF_BODY",
    ),
    "AWSManagedRulesKnownBadInputsRuleSet": ("Log4JRCE_BODY", "JavaDeserializationRCE_BODY"),
}
BODY_RULE_NAMES: tuple[str, ...] = tuple(r for rules in COUNTED_BODY_RULES.values() for r in rules)
# A private DNS name for the PrivateLink endpoint service: lowercase labels of letters, digits and
# hyphens (pydantic-core's regex engine has no look-ahead, so the 253-character total is not checked).
DNS_NAME_RE = re.compile(r"^([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]{2,63}$")
# WAF's log destination must be named with this prefix (WAF API reference, LoggingConfiguration:
# "The name that you give the destination must start with aws-waf-logs-").
WAF_LOG_GROUP_PREFIX = "aws-waf-logs-"
# The header the routers read API keys from: WAF logs every header unless told to redact it
# (LoggingConfiguration.RedactedFields, SingleHeader), and a key in a log is a key anyone with
# logs:GetLogEvents can use.
REDACTED_HEADERS = ("authorization",)


def counted_rules(group: str, blocked: tuple[str, ...]) -> tuple[str, ...]:
    """The body rules of `group` that count rather than block, given the rules the config blocks."""
    return tuple(r for r in COUNTED_BODY_RULES.get(group, ()) if r not in blocked)


def check_front_door(cfg: FlotillaConfig) -> None:
    """Refuse a front door that admits everyone by default, carries keys and prompts in clear text
    over the internet, or admits callers from outside the VPC without API keys.

    No opt-out: a caller that authenticates users upstream (its own gateway) or the one account
    behind a PrivateLink endpoint can hold a key like any client (`flotilla keys create`), and a
    deployment without keys or TLS stays internal, where the VPC is the boundary."""
    from stacks.config import ConfigError  # noqa: PLC0415 - config imports this module

    front = cfg.front
    internet = front.scheme == "internet-facing"
    if internet and not (front.client_cidrs or front.client_prefix_lists):
        raise ConfigError(
            "front.scheme",
            front.scheme,
            "internet-facing needs front.client_cidrs or front.client_prefix_lists (the clients the ALB "
            "admits; there is no 0.0.0.0/0 default), or use internal",
        )
    if internet and front.privatelink_principals:
        raise ConfigError(
            "front.privatelink_principals",
            list(front.privatelink_principals),
            "only with front.scheme internal (PrivateLink consumers reach the internal ALB privately)",
        )
    if internet and cfg.certificate_arn is None:
        raise ConfigError(
            "certificate_arn",
            NOT_GIVEN,
            "set certificate_arn to an ACM certificate of this region, or front.scheme: internal",
            problem="is required with front.scheme internet-facing (keys and prompts would cross the internet "
            "in clear text)",
        )
    if not front.api_keys and (internet or front.privatelink_principals):
        reach = "front.scheme internet-facing" if internet else "front.privatelink_principals set"
        undo = "front.scheme: internal" if internet else "remove front.privatelink_principals"
        raise ConfigError(
            "front.api_keys",
            False,
            f"set front.api_keys: true and issue keys with flotilla keys create, or {undo}",
            problem=f"is not allowed with {reach} (anyone admitted could call the fleet)",
        )
    if front.privatelink_private_dns_name and not front.privatelink_principals:
        raise ConfigError(
            "front.privatelink_private_dns_name",
            front.privatelink_private_dns_name,
            "set front.privatelink_principals too, or remove the name",
            problem="names the PrivateLink endpoint service, which exists only with front.privatelink_principals",
        )
