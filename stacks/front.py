"""Front: the internet-facing ALB, its listeners, and the blue and green router target groups.

The router ECS service (stacks/router.py) lives in its own stack so that the alarms it rolls back on
(Observability) can be created between the two: alarms need the ALB's metrics, the router service
needs the alarms at construction (aws/aws-cdk#36308).
"""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_elasticloadbalancingv2 as elbv2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from aws_cdk import region_info
from constructs import Construct

import contract
from stacks.config import LIVE_TARGET_GROUPS

# The ALB security group (Discovery) admits exactly these client ports.
from stacks.discovery import HTTP_PORT, HTTPS_PORT
from stacks.nag import acknowledge


class FrontStack(cdk.Stack):
    """ALB in public subnets; production listener (HTTPS, or HTTP with a warning); internal test
    listener; blue and green target groups health-checking the router.

    `live_target_group` names the target group the production and test rules send 100 % to in the
    template. ECS blue/green moves the live weight at every router deployment; when a later deploy
    must update a listener rule, set it to the group that is live *now* so CloudFormation does not
    send traffic back to an empty group (aws/aws-cdk#36649, docs/runbooks/routine-deploy.md).
    """

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        vpc: ec2.IVpc,
        alb_security_group: ec2.ISecurityGroup,
        certificate_arn: str | None,
        live_target_group: str = "blue",
        health_check_interval: cdk.Duration = cdk.Duration.seconds(10),
        health_check_timeout: cdk.Duration = cdk.Duration.seconds(5),
        healthy_threshold: int = 2,
        unhealthy_threshold: int = 3,
        deregistration_delay: cdk.Duration = cdk.Duration.seconds(60),
        idle_timeout: cdk.Duration = cdk.Duration.seconds(120),
        access_log_retention: cdk.Duration = cdk.Duration.days(90),
        **kwargs,
    ) -> None:
        super().__init__(scope, id_, **kwargs)
        if live_target_group not in LIVE_TARGET_GROUPS:
            raise ValueError(
                f"live_target_group={live_target_group!r} is not one of {LIVE_TARGET_GROUPS}: pass the "
                "target group that serves production now (see docs/runbooks/routine-deploy.md)"
            )
        if health_check_timeout.to_seconds() >= health_check_interval.to_seconds():
            raise ValueError(
                f"health_check_timeout ({health_check_timeout.to_seconds()} s) must be shorter than "
                f"health_check_interval ({health_check_interval.to_seconds()} s)"
            )
        self.https = certificate_arn is not None
        self.live_target_group = live_target_group

        self.access_log_bucket = s3.Bucket(
            self,
            "AccessLogs",
            # ALB access logs support SSE-S3 only (not SSE-KMS).
            encryption=s3.BucketEncryption.S3_MANAGED,
            enforce_ssl=True,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            lifecycle_rules=[s3.LifecycleRule(expiration=access_log_retention)],
            removal_policy=cdk.RemovalPolicy.RETAIN,
        )

        # Owned by the Discovery stack with its exact rules; imported immutable so that listeners
        # and target groups attached here add no rules of their own.
        self.alb_security_group = ec2.SecurityGroup.from_security_group_id(
            self, "AlbSecurityGroup", alb_security_group.security_group_id, mutable=False, allow_all_outbound=False
        )
        self.load_balancer = elbv2.ApplicationLoadBalancer(
            self,
            "Alb",
            vpc=vpc,
            internet_facing=True,
            vpc_subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PUBLIC),
            security_group=self.alb_security_group,
            drop_invalid_header_fields=True,
            # Long prefills of big prompts can keep a stream quiet for a while.
            idle_timeout=idle_timeout,
        )
        self._log_access(prefix="alb")

        def target_group(name: str) -> elbv2.ApplicationTargetGroup:
            return elbv2.ApplicationTargetGroup(
                self,
                f"{name.capitalize()}TargetGroup",
                vpc=vpc,
                port=contract.ROUTER_PORT,
                protocol=elbv2.ApplicationProtocol.HTTP,
                target_type=elbv2.TargetType.IP,
                health_check=elbv2.HealthCheck(
                    path=contract.ROUTER_HEALTH_PATH,
                    port=str(contract.ROUTER_PORT),
                    protocol=elbv2.Protocol.HTTP,
                    interval=health_check_interval,
                    timeout=health_check_timeout,
                    healthy_threshold_count=healthy_threshold,
                    unhealthy_threshold_count=unhealthy_threshold,
                    healthy_http_codes="200",
                ),
                # ECS deregisters a retiring router, waits this long while the ALB lets in-flight
                # requests finish (then closes them), and only then sends SIGTERM. Shorter than
                # the ALB's 300 s default so blue/green and scale-in finish quickly; long enough
                # for a typical generation stream (as long as the router's own drain timeout).
                deregistration_delay=deregistration_delay,
            )

        self.blue_target_group = target_group("blue")
        self.green_target_group = target_group("green")

        not_found = elbv2.ListenerAction.fixed_response(404, content_type="text/plain", message_body="no route")
        if self.https:
            self.production_listener = self.load_balancer.add_listener(
                "Https",
                port=HTTPS_PORT,
                protocol=elbv2.ApplicationProtocol.HTTPS,
                open=False,
                certificates=[elbv2.ListenerCertificate.from_arn(certificate_arn)],
                ssl_policy=elbv2.SslPolicy.RECOMMENDED_TLS,
                default_action=not_found,
            )
            self.load_balancer.add_listener(
                "HttpRedirect",
                port=HTTP_PORT,
                protocol=elbv2.ApplicationProtocol.HTTP,
                open=False,
                default_action=elbv2.ListenerAction.redirect(protocol="HTTPS", port=str(HTTPS_PORT), permanent=True),
            )
        else:
            cdk.Annotations.of(self).add_warning_v2(
                "flotilla:front:no-certificate",
                "No certificate_arn configured: the ALB serves plain HTTP on port 80, so prompts and "
                "completions cross the internet unencrypted. Set certificate_arn (an ACM certificate "
                "in this region) to serve HTTPS on 443 with HTTP redirected to it.",
            )
            self.production_listener = self.load_balancer.add_listener(
                "Http",
                port=HTTP_PORT,
                protocol=elbv2.ApplicationProtocol.HTTP,
                open=False,
                default_action=not_found,
            )
        # The test listener carries ECS's pre-shift test traffic to the green tasks: VPC only.
        self.test_listener = self.load_balancer.add_listener(
            "Test",
            port=contract.ROUTER_TEST_PORT,
            protocol=elbv2.ApplicationProtocol.HTTP,
            open=False,
            default_action=not_found,
        )

        live, idle = (
            (self.blue_target_group, self.green_target_group)
            if live_target_group == "blue"
            else (self.green_target_group, self.blue_target_group)
        )

        def rule(name: str, listener: elbv2.ApplicationListener) -> elbv2.ApplicationListenerRule:
            # ECS native blue/green rewrites these weights during each router deployment.
            return elbv2.ApplicationListenerRule(
                self,
                name,
                listener=listener,
                priority=1,
                conditions=[elbv2.ListenerCondition.path_patterns(["/*"])],
                action=elbv2.ListenerAction.weighted_forward(
                    [
                        elbv2.WeightedTargetGroup(target_group=live, weight=100),
                        elbv2.WeightedTargetGroup(target_group=idle, weight=0),
                    ]
                ),
            )

        self.production_rule = rule("ProductionRule", self.production_listener)
        self.test_rule = rule("TestRule", self.test_listener)

        scheme = "https" if self.https else "http"
        cdk.CfnOutput(self, "Url", value=f"{scheme}://{self.load_balancer.load_balancer_dns_name}")
        cdk.CfnOutput(self, "ProductionRuleArn", value=self.production_rule.listener_rule_arn)
        cdk.CfnOutput(self, "TestRuleArn", value=self.test_rule.listener_rule_arn)
        cdk.CfnOutput(self, "BlueTargetGroupArn", value=self.blue_target_group.target_group_arn)
        cdk.CfnOutput(self, "GreenTargetGroupArn", value=self.green_target_group.target_group_arn)

        acknowledge(
            self.access_log_bucket.node.default_child,
            "S1",
            "This bucket receives the ALB's access logs; logging its own accesses to itself would "
            "recurse and to another bucket would only move the finding.",
        )

    def _log_access(self, *, prefix: str) -> None:
        """Access logs without knowing the region at synth time (environment-agnostic app).

        `log_access_logs()` needs a concrete region to pick the ELB log-delivery account; here the
        account comes from CDK's region fact table (a CfnMapping keyed by AWS::Region), and the
        log-delivery service principal covers regions opened after August 2022.
        """
        bucket = self.access_log_bucket
        objects = bucket.arn_for_objects(f"{prefix}/AWSLogs/{self.account}/*")
        elb_account = self.regional_fact(region_info.FactName.ELBV2_ACCOUNT)
        bucket.add_to_resource_policy(
            iam.PolicyStatement(
                sid="ElbLogDeliveryAccount",
                actions=["s3:PutObject"],
                resources=[objects],
                principals=[iam.AccountPrincipal(elb_account)],
            )
        )
        bucket.add_to_resource_policy(
            iam.PolicyStatement(
                sid="ElbLogDeliveryService",
                actions=["s3:PutObject"],
                resources=[objects],
                principals=[iam.ServicePrincipal("logdelivery.elasticloadbalancing.amazonaws.com")],
            )
        )
        self.load_balancer.set_attribute("access_logs.s3.enabled", "true")
        self.load_balancer.set_attribute("access_logs.s3.bucket", bucket.bucket_name)
        self.load_balancer.set_attribute("access_logs.s3.prefix", prefix)
        # The ALB checks it may write before it enables logging.
        self.load_balancer.node.add_dependency(bucket.policy)
