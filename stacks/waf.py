"""AWS WAF in front of an internet-facing ALB: a per-client-IP rate limit, AWS managed rule groups
with the body rules a prompt can trip set to count, and every request logged (the API key redacted)
to an encrypted `aws-waf-logs-` log group, so that a rule can be turned back to block from evidence."""

from __future__ import annotations

from collections.abc import Sequence

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from aws_cdk import aws_wafv2 as wafv2
from constructs import Construct

from stacks.front_door import REDACTED_HEADERS, WAF_LOG_GROUP_PREFIX, counted_rules

# The managed rule groups in use, in evaluation order after the rate rule.
MANAGED_GROUPS = (
    "AWSManagedRulesAmazonIpReputationList",
    "AWSManagedRulesKnownBadInputsRuleSet",
    "AWSManagedRulesCommonRuleSet",
)


def _visibility(name: str) -> wafv2.CfnWebACL.VisibilityConfigProperty:
    return wafv2.CfnWebACL.VisibilityConfigProperty(
        cloud_watch_metrics_enabled=True, metric_name=f"flotilla-{name}", sampled_requests_enabled=True
    )


def _managed(priority: int, group: str, count: Sequence[str]) -> wafv2.CfnWebACL.RuleProperty:
    return wafv2.CfnWebACL.RuleProperty(
        name=group,
        priority=priority,
        override_action=wafv2.CfnWebACL.OverrideActionProperty(none={}),
        statement=wafv2.CfnWebACL.StatementProperty(
            managed_rule_group_statement=wafv2.CfnWebACL.ManagedRuleGroupStatementProperty(
                vendor_name="AWS",
                name=group,
                # Count: the rule still matches, labels the request and is logged, but lets it through
                # (AWS WAF developer guide, "Overriding rule group rule actions").
                rule_action_overrides=[
                    wafv2.CfnWebACL.RuleActionOverrideProperty(
                        name=rule, action_to_use=wafv2.CfnWebACL.RuleActionProperty(count={})
                    )
                    for rule in count
                ]
                or None,
            )
        ),
        visibility_config=_visibility(group),
    )


class FrontDoorWaf(Construct):
    """The web ACL, its association with the ALB, and its logging."""

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        load_balancer_arn: str,
        deployment_name: str,
        requests_per_5_min: int,
        blocked_body_rules: Sequence[str] = (),
        log_retention: logs.RetentionDays = logs.RetentionDays.ONE_MONTH,
    ) -> None:
        super().__init__(scope, id_)
        blocked = tuple(blocked_body_rules)
        self.web_acl = wafv2.CfnWebACL(
            self,
            "WebAcl",
            scope="REGIONAL",  # an ALB's web ACL is regional (CLOUDFRONT is for distributions)
            default_action=wafv2.CfnWebACL.DefaultActionProperty(allow={}),
            visibility_config=_visibility("front"),
            rules=[
                # Per client IP over AWS WAF's default 5-minute window; the lowest limit WAF takes is 10
                # ("Rate-based rule high-level settings in AWS WAF", developer guide). It caps a single
                # source; the routers' per-key limits are what meter legitimate callers.
                wafv2.CfnWebACL.RuleProperty(
                    name="RequestsPerClientIp",
                    priority=0,
                    action=wafv2.CfnWebACL.RuleActionProperty(block={}),
                    statement=wafv2.CfnWebACL.StatementProperty(
                        rate_based_statement=wafv2.CfnWebACL.RateBasedStatementProperty(
                            limit=requests_per_5_min, aggregate_key_type="IP", evaluation_window_sec=300
                        )
                    ),
                    visibility_config=_visibility("requests-per-client-ip"),
                ),
                # The routers bound body size themselves (--max-body-bytes, 4 MiB); an ALB's web ACL
                # sees only the first 8 KB of a body anyway ("Body inspection size limits").
                *(
                    _managed(priority, group, counted_rules(group, blocked))
                    for priority, group in enumerate(MANAGED_GROUPS, start=1)
                ),
            ],
        )
        association = wafv2.CfnWebACLAssociation(
            self, "WebAclAssociation", resource_arn=load_balancer_arn, web_acl_arn=self.web_acl.attr_arn
        )
        # The logical ids these two had at the top of the Front stack: a new id replaces the resource,
        # and CloudFormation deletes the old association last, which disassociates the ALB's web ACL
        # (DisassociateWebACL takes only the ALB's ARN), leaving the door without WAF.
        self.web_acl.override_logical_id("WebAcl")
        association.override_logical_id("WebAclAssociation")
        self.log_group = self._log_group(deployment_name, log_retention)
        stack = cdk.Stack.of(self)
        # WAF takes the log group's ARN without the ":*" that Fn::GetAtt Arn ends in (the
        # LoggingConfiguration examples: arn:aws:logs:<region>:<account>:log-group:aws-waf-logs-<name>).
        destination = stack.format_arn(
            service="logs",
            resource="log-group",
            resource_name=self.log_group.log_group_name,
            arn_format=cdk.ArnFormat.COLON_RESOURCE_NAME,
        )
        # "When you successfully enable logging ... For an Amazon CloudWatch Logs log group, AWS WAF
        # creates a resource policy on the log group" (WAF API reference, LoggingConfiguration); WAF
        # logs headers but never the body.
        self.logging = wafv2.CfnLoggingConfiguration(
            self,
            "Logging",
            resource_arn=self.web_acl.attr_arn,
            log_destination_configs=[destination],
            redacted_fields=[
                wafv2.CfnLoggingConfiguration.FieldToMatchProperty(single_header={"Name": name})
                for name in REDACTED_HEADERS
            ],
        )

    def _log_group(self, deployment_name: str, retention: logs.RetentionDays) -> logs.LogGroup:
        """`aws-waf-logs-<deployment>`, encrypted with its own key: the logs hold every caller's
        address, path and headers. CloudWatch Logs uses the key as logs.<region>.amazonaws.com, for
        this log group only (CloudWatch Logs user guide, "Encrypt log data in CloudWatch Logs using
        AWS KMS": the key policy's encryption-context condition on aws:logs:arn)."""
        stack = cdk.Stack.of(self)
        name = f"{WAF_LOG_GROUP_PREFIX}{deployment_name}"
        key = kms.Key(
            self,
            "LogKey",
            enable_key_rotation=True,
            description=f"flotilla {name} encryption",
            removal_policy=cdk.RemovalPolicy.DESTROY,
        )
        key.add_to_resource_policy(
            iam.PolicyStatement(
                sid="CloudWatchLogsUseForTheWafLogGroup",
                actions=["kms:Encrypt*", "kms:Decrypt*", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:Describe*"],
                principals=[iam.ServicePrincipal(f"logs.{stack.region}.amazonaws.com")],
                resources=["*"],  # in a key policy, "*" is this key
                conditions={
                    "ArnEquals": {
                        "kms:EncryptionContext:aws:logs:arn": stack.format_arn(
                            service="logs",
                            resource="log-group",
                            resource_name=name,
                            arn_format=cdk.ArnFormat.COLON_RESOURCE_NAME,
                        )
                    }
                },
            )
        )
        return logs.LogGroup(
            self,
            "Logs",
            log_group_name=name,
            encryption_key=key,
            retention=retention,
            # Named, so a kept group would stop the next create under the same name (a scheme switch
            # destroys and re-creates Front, docs/runbooks/front-door.md); retention bounds the logs.
            removal_policy=cdk.RemovalPolicy.DESTROY,
        )
