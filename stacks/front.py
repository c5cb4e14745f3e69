"""Front: the ALB (internal by default), its listeners, the blue and green router target groups, and
the WAF web ACL an internet-facing ALB gets.

The router ECS service (stacks/router.py) lives in its own stack so that the alarms it rolls back on
(Observability) can be created between the two: alarms need the ALB's metrics, the router service
needs the alarms at construction (aws/aws-cdk#36308).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_elasticloadbalancingv2 as elbv2
from aws_cdk import aws_elasticloadbalancingv2_targets as elb_targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from aws_cdk import region_info
from constructs import Construct

import contract
from stacks.config import LIVE_TARGET_GROUPS

# The ALB security group (Discovery) admits exactly these client ports.
from stacks.discovery import HTTP_PORT, HTTPS_PORT
from stacks.nag import acknowledge, cfn_child
from stacks.network import VPC_CIDR
from stacks.waf import FrontDoorWaf

# What the production rule forwards to the routers; the listener answers 404 to everything else.
FRONT_DOOR_PATHS = (contract.API_PATH_PATTERN, contract.ROUTER_HEALTH_PATH)

# Without a certificate the redirect listener waits here, a port the ALB security group does not
# admit, so that adding or removing certificate_arn moves listeners between ports in place (see
# FrontStack._listeners) instead of replacing the production listener and its rules.
PARKED_PORT = 8081


@dataclass(frozen=True, kw_only=True)
class FrontProps:
    """Everything the front door is built from: the VPC and the ALB security group (Network,
    Discovery), the config's front-door settings, and the target groups' health check and timeouts."""

    vpc: ec2.IVpc
    alb_security_group: ec2.ISecurityGroup
    certificate_arn: str | None  # None: plain HTTP on port 80, with a synth warning
    live_target_group: str = "blue"
    internet_facing: bool = False
    deployment_name: str = "flotilla"
    waf_requests_per_5_min: int = 3000
    waf_blocked_body_rules: Sequence[str] = ()
    waf_log_retention: logs.RetentionDays = logs.RetentionDays.ONE_MONTH
    privatelink_principals: Sequence[str] = ()
    privatelink_private_dns_name: str | None = None
    health_check_interval: cdk.Duration = cdk.Duration.seconds(10)
    health_check_timeout: cdk.Duration = cdk.Duration.seconds(5)
    healthy_threshold: int = 2
    unhealthy_threshold: int = 3
    deregistration_delay: cdk.Duration = cdk.Duration.seconds(60)
    idle_timeout: cdk.Duration = cdk.Duration.seconds(120)
    access_log_retention: cdk.Duration = cdk.Duration.days(90)

    def __post_init__(self) -> None:
        if self.live_target_group not in LIVE_TARGET_GROUPS:
            raise ValueError(
                f"live_target_group={self.live_target_group!r} is not one of {LIVE_TARGET_GROUPS}: pass the "
                "target group that serves production now (see docs/runbooks/routine-deploy.md)"
            )
        if self.health_check_timeout.to_seconds() >= self.health_check_interval.to_seconds():
            raise ValueError(
                f"health_check_timeout ({self.health_check_timeout.to_seconds()} s) must be shorter than "
                f"health_check_interval ({self.health_check_interval.to_seconds()} s)"
            )


class FrontStack(cdk.Stack):
    """ALB, internal in private subnets (or internet-facing in public subnets, behind AWS WAF);
    production listener (HTTPS, or HTTP with a warning) whose one rule forwards the API and the
    health check; blue and green target groups health-checking the router.

    `live_target_group` names the target group the production rule sends 100 % to in the
    template. ECS blue/green moves the live weight at every router deployment; when a later deploy
    must update a listener rule, set it to the group that is live *now* so CloudFormation does not
    send traffic back to an empty group (aws/aws-cdk#36649, docs/runbooks/routine-deploy.md).
    """

    def __init__(self, scope: Construct, id_: str, props: FrontProps, **kwargs) -> None:
        super().__init__(scope, id_, **kwargs)
        self.https = props.certificate_arn is not None
        self.live_target_group = props.live_target_group
        self.internet_facing = props.internet_facing
        self._load_balancer(props)
        self.blue_target_group = self._target_group("blue", props)
        self.green_target_group = self._target_group("green", props)
        if not self.https:
            cdk.Annotations.of(self).add_warning_v2(
                "flotilla:front:no-certificate",
                "No certificate_arn configured: the ALB serves plain HTTP on port 80, so prompts, "
                f"completions and API keys cross {'the internet' if props.internet_facing else 'the network'} "
                "unencrypted. Set certificate_arn (an ACM certificate in this region) to serve HTTPS on "
                "443 with HTTP redirected to it.",
            )
        not_found = elbv2.ListenerAction.fixed_response(404, content_type="text/plain", message_body="no route")
        self.production_listener, self.redirect_listener = self._listeners(props.certificate_arn, not_found)
        # No test listener: ECS native blue/green takes one only to send test traffic to the green
        # tasks before the production shift, for lifecycle hooks to check (TestListenerRule
        # "Required: No", AWS::ECS::Service AdvancedConfiguration), and this deployment has none.
        self.production_rule = self._production_rule(props.live_target_group)
        self.endpoint_service = (
            self._privatelink(props.vpc, props.privatelink_principals, props.privatelink_private_dns_name)
            if props.privatelink_principals
            else None
        )
        self._outputs()
        acknowledge(
            cfn_child(self.access_log_bucket, s3.CfnBucket),
            "S1",
            "This bucket receives the ALB's access logs; logging its own accesses to itself would "
            "recurse and to another bucket would only move the finding.",
        )

    def _load_balancer(self, props: FrontProps) -> None:
        """The ALB in the Discovery stack's security group, its access-log bucket, and the WAF web
        ACL in front of it when it faces the internet."""
        self.access_log_bucket = s3.Bucket(
            self,
            "AccessLogs",
            # ALB access logs support SSE-S3 only (not SSE-KMS).
            encryption=s3.BucketEncryption.S3_MANAGED,
            enforce_ssl=True,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            lifecycle_rules=[s3.LifecycleRule(expiration=props.access_log_retention)],
            removal_policy=cdk.RemovalPolicy.RETAIN,
        )
        # Owned by the Discovery stack with its exact rules; imported immutable so that listeners
        # and target groups attached here add no rules of their own.
        self.alb_security_group = ec2.SecurityGroup.from_security_group_id(
            self,
            "AlbSecurityGroup",
            props.alb_security_group.security_group_id,
            mutable=False,
            allow_all_outbound=False,
        )
        self.load_balancer = elbv2.ApplicationLoadBalancer(
            self,
            "Alb",
            vpc=props.vpc,
            # Scheme is create-only: switching it replaces the ALB (docs/runbooks/front-door.md).
            internet_facing=props.internet_facing,
            vpc_subnets=ec2.SubnetSelection(
                subnet_type=ec2.SubnetType.PUBLIC if props.internet_facing else ec2.SubnetType.PRIVATE_WITH_EGRESS
            ),
            security_group=self.alb_security_group,
            drop_invalid_header_fields=True,
            # Long prefills of big prompts can keep a stream quiet for a while.
            idle_timeout=props.idle_timeout,
        )
        self._log_access(prefix="alb")
        self.waf = (
            FrontDoorWaf(
                self,
                "Waf",
                load_balancer_arn=self.load_balancer.load_balancer_arn,
                deployment_name=props.deployment_name,
                requests_per_5_min=props.waf_requests_per_5_min,
                blocked_body_rules=props.waf_blocked_body_rules,
                log_retention=props.waf_log_retention,
            )
            if props.internet_facing
            else None
        )

    def _target_group(self, name: str, props: FrontProps) -> elbv2.ApplicationTargetGroup:
        """The blue or the green router target group, health-checking the router."""
        return elbv2.ApplicationTargetGroup(
            self,
            f"{name.capitalize()}TargetGroup",
            vpc=props.vpc,
            port=contract.ROUTER_PORT,
            protocol=elbv2.ApplicationProtocol.HTTP,
            target_type=elbv2.TargetType.IP,
            health_check=elbv2.HealthCheck(
                path=contract.ROUTER_HEALTH_PATH,
                port=str(contract.ROUTER_PORT),
                protocol=elbv2.Protocol.HTTP,
                interval=props.health_check_interval,
                timeout=props.health_check_timeout,
                healthy_threshold_count=props.healthy_threshold,
                unhealthy_threshold_count=props.unhealthy_threshold,
                healthy_http_codes="200",
            ),
            # ECS deregisters a retiring router, waits this long while the ALB lets in-flight
            # requests finish (then closes them), and only then sends SIGTERM. Shorter than
            # the ALB's 300 s default so blue/green and scale-in finish quickly; long enough
            # for a typical generation stream (as long as the router's own drain timeout).
            deregistration_delay=props.deregistration_delay,
        )

    def _production_rule(self, live_target_group: str) -> elbv2.ApplicationListenerRule:
        """Only the API and the health check reach the routers: everything else (/metrics, any path a
        router may serve later) gets the listener's 404. A path pattern is compared, case
        sensitively, with the URL's path only; several values match if any does
        (ListenerRule PathPatternConfig, CloudFormation reference). One rule, not two: ECS
        blue/green shifts the weights of exactly the production rule it is given (ECS rewrites
        them during each router deployment, aws/aws-cdk#36649)."""
        live, idle = (
            (self.blue_target_group, self.green_target_group)
            if live_target_group == "blue"
            else (self.green_target_group, self.blue_target_group)
        )
        return elbv2.ApplicationListenerRule(
            self,
            "ProductionRule",
            listener=self.production_listener,
            priority=1,
            conditions=[elbv2.ListenerCondition.path_patterns(list(FRONT_DOOR_PATHS))],
            action=elbv2.ListenerAction.weighted_forward(
                [
                    elbv2.WeightedTargetGroup(target_group=live, weight=100),
                    elbv2.WeightedTargetGroup(target_group=idle, weight=0),
                ]
            ),
        )

    def _outputs(self) -> None:
        scheme = "https" if self.https else "http"
        cdk.CfnOutput(self, "Url", value=f"{scheme}://{self.load_balancer.load_balancer_dns_name}")
        cdk.CfnOutput(self, "ProductionRuleArn", value=self.production_rule.listener_rule_arn)
        cdk.CfnOutput(self, "BlueTargetGroupArn", value=self.blue_target_group.target_group_arn)
        cdk.CfnOutput(self, "GreenTargetGroupArn", value=self.green_target_group.target_group_arn)
        if self.waf is not None:  # for docs/runbooks/waf-body-rules.md
            cdk.CfnOutput(self, "WebAclArn", value=self.waf.web_acl.attr_arn)
            cdk.CfnOutput(self, "WafLogGroup", value=self.waf.log_group.log_group_name)

    def _privatelink(
        self, vpc: ec2.IVpc, principals: Sequence[str], private_dns_name: str | None
    ) -> ec2.VpcEndpointService:
        """An endpoint service for consumers in other VPCs or accounts: an internal NLB whose TCP
        listener forwards to the ALB's production listener (an `alb` target group), offered to the
        named principals, each connection accepted by the operator.

        TLS ends at the ALB, so an HTTPS consumer checks the certificate against the name it
        called: the endpoint's own DNS names (vpce-...amazonaws.com) never match it. With a private
        DNS name (a name the certificate covers), a consumer's endpoint with private DNS enabled
        answers to that name in its VPC, once the provider has verified the domain
        (StartVpcEndpointServicePrivateDnsVerification: "The service provider must successfully
        perform the verification before the consumer can use the name"; EC2 API reference);
        docs/runbooks/front-door.md has the steps."""
        port = HTTPS_PORT if self.https else HTTP_PORT
        nlb_sg = ec2.SecurityGroup(
            self, "PrivateLinkSg", vpc=vpc, allow_all_outbound=False, description="flotilla PrivateLink NLB: to the ALB"
        )
        # The NLB's own addresses are in the VPC, which the internal ALB admits (Discovery).
        nlb_sg.add_egress_rule(ec2.Peer.ipv4(VPC_CIDR), ec2.Port.tcp(port), "NLB to the ALB's client port")
        nlb = elbv2.NetworkLoadBalancer(
            self,
            "PrivateLinkNlb",
            vpc=vpc,
            internet_facing=False,
            vpc_subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS),
            security_groups=[nlb_sg],
            cross_zone_enabled=True,
            # Endpoint traffic is admitted by the service's allowed principals and acceptance, not by
            # address: an NLB applies its inbound rules to PrivateLink traffic unless this is off
            # (EnforceSecurityGroupInboundRulesOnPrivateLinkTraffic, ELBv2 API reference).
            enforce_security_group_inbound_rules_on_private_link_traffic=False,
        )
        listener = nlb.add_listener("PrivateLink", port=port, protocol=elbv2.Protocol.TCP)
        listener.add_targets(
            "Alb",
            port=port,
            targets=[elb_targets.AlbListenerTarget(self.production_listener)],
            health_check=elbv2.HealthCheck(
                protocol=elbv2.Protocol.HTTPS if self.https else elbv2.Protocol.HTTP,
                path=contract.ROUTER_HEALTH_PATH,
            ),
        )
        service = ec2.VpcEndpointService(
            self,
            "EndpointService",
            vpc_endpoint_service_load_balancers=[nlb],
            acceptance_required=True,
            allowed_principals=[iam.ArnPrincipal(p) for p in principals],
        )
        # CDK names the L1 after the construct ("EndpointService"), not "Resource": no default_child.
        (cfn_service,) = [c for c in service.node.children if isinstance(c, ec2.CfnVPCEndpointService)]
        if private_dns_name:
            # AWS::EC2::VPCEndpointService PrivateDnsName (CloudFormation reference); CDK's
            # VpcEndpointService construct has no setting for it.
            cfn_service.private_dns_name = private_dns_name
        elif self.https:
            cdk.Annotations.of(self).add_warning_v2(
                "flotilla:front:privatelink-dns",
                "PrivateLink with certificate_arn but no front.privatelink_private_dns_name: consumers "
                "calling the endpoint's own DNS name get a certificate mismatch. Set "
                "front.privatelink_private_dns_name to a name the certificate covers and verify its "
                "domain (docs/runbooks/front-door.md), or have each consumer map that name to its "
                "endpoint in a private hosted zone.",
            )
        cdk.CfnOutput(
            self,
            "EndpointServiceName",
            value=f"com.amazonaws.vpce.{self.region}.{service.vpc_endpoint_service_id}",
        )
        cdk.CfnOutput(self, "EndpointServiceId", value=service.vpc_endpoint_service_id)
        acknowledge(
            cfn_child(nlb, elbv2.CfnLoadBalancer),
            "ELB2",
            "Network Load Balancer access logs record TLS listeners only (ELB user guide, access logs for "
            "your Network Load Balancer); this TCP listener passes every request to the ALB, whose access "
            "logs record each one.",
        )
        return service

    def _listeners(
        self, certificate_arn: str | None, not_found: elbv2.ListenerAction
    ) -> tuple[elbv2.ApplicationListener, elbv2.ApplicationListener]:
        """The production listener and the redirect listener, the same two resources with or
        without a certificate, so that adding certificate_arn (and removing it) is an update.

        A listener's LoadBalancerArn is its only create-only property and a listener rule's
        ListenerArn is its (cfn-lint 1.58 resource schemas, createOnlyProperties): a production
        listener that changes port and protocol in place keeps its rules, and the Router stack's
        imports of the listener and of the production rule stay valid (CloudFormation refuses to
        change or delete an export another stack imports,
        https://docs.aws.amazon.com/AWSCloudFormation/latest/UserGuide/intrinsic-function-reference-importvalue.html).

        Two listeners of a load balancer cannot hold one port at once (ELB: DuplicateListener, "A
        listener with the specified port already exists.", CreateListener/ModifyListener errors,
        Elastic Load Balancing API reference), so port 80 changes hands in order: CloudFormation
        updates a resource only after those it depends on, using the new template's dependencies.
        With a certificate the redirect listener (taking 80) depends on the production listener
        (leaving 80 for 443); without one the production listener (taking 80) depends on the
        redirect listener (leaving 80 for PARKED_PORT).
        """
        if certificate_arn is not None:
            production = self.load_balancer.add_listener(
                "Production",
                port=HTTPS_PORT,
                protocol=elbv2.ApplicationProtocol.HTTPS,
                open=False,
                certificates=[elbv2.ListenerCertificate.from_arn(certificate_arn)],
                ssl_policy=elbv2.SslPolicy.RECOMMENDED_TLS,
                default_action=not_found,
            )
            redirect = self.load_balancer.add_listener(
                "Redirect",
                port=HTTP_PORT,
                protocol=elbv2.ApplicationProtocol.HTTP,
                open=False,
                default_action=elbv2.ListenerAction.redirect(protocol="HTTPS", port=str(HTTPS_PORT), permanent=True),
            )
            redirect.node.add_dependency(production)
        else:
            production = self.load_balancer.add_listener(
                "Production",
                port=HTTP_PORT,
                protocol=elbv2.ApplicationProtocol.HTTP,
                open=False,
                default_action=not_found,
            )
            # Unreachable (the ALB security group does not admit PARKED_PORT): kept so that the
            # way back from HTTPS is an update too.
            redirect = self.load_balancer.add_listener(
                "Redirect",
                port=PARKED_PORT,
                protocol=elbv2.ApplicationProtocol.HTTP,
                open=False,
                default_action=not_found,
            )
            production.node.add_dependency(redirect)
        return production, redirect

    def _log_access(self, *, prefix: str) -> None:
        """Access logs in every region, with or without a region known at synth.

        Regions older than August 2022 deliver logs as a per-region ELB account, newer ones as the
        log-delivery service principal (ELB user guide, "Enable access logs", step 2). CDK knows
        the account of 31 regions only; its regional_fact() emits Fn::FindInMap over them, and
        CloudFormation fails the stack in any other region ("Fn::FindInMap will always raise an
        error if it can't find the mapping", aws-cloudformation/aws-cloudformation-templates#271,
        even inside an Fn::If branch not taken). So: with a configured region, the account
        statement exists only where CDK knows the account; environment-agnostic, it lists one
        Fn::If per known region that yields the region's ELB account or AWS::NoValue (removed), plus
        this stack's own account (which owns the bucket anyway), so it is valid in every region.
        The Fn::Ifs sit side by side, not nested: checks that follow both branches of each stay linear.
        """
        bucket = self.access_log_bucket
        objects = bucket.arn_for_objects(f"{prefix}/AWSLogs/{self.account}/*")
        principals = self._elb_log_principals()
        if principals:
            bucket.add_to_resource_policy(
                iam.PolicyStatement(
                    sid="ElbLogDeliveryAccount",
                    actions=["s3:PutObject"],
                    resources=[objects],
                    principals=principals,
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

    def _elb_log_principals(self) -> list[iam.IPrincipal]:
        """The ELB log-delivery account principal(s) for this stack's region (see _log_access)."""
        if not cdk.Token.is_unresolved(self.region):
            account = region_info.Fact.find(self.region, region_info.FactName.ELBV2_ACCOUNT)
            return [iam.AccountPrincipal(account)] if account else []
        known = sorted(
            (r.name, account)
            for r in region_info.RegionInfo.regions
            if (account := region_info.Fact.find(r.name, region_info.FactName.ELBV2_ACCOUNT))
        )
        principals: list[iam.IPrincipal] = []
        for region, account in known:
            condition = cdk.CfnCondition(
                self,
                "ElbLogAccountIn" + "".join(part.capitalize() for part in region.split("-")),
                expression=cdk.Fn.condition_equals(cdk.Aws.REGION, region),
            )
            arn = cdk.Fn.condition_if(
                condition.logical_id, f"arn:{self.partition}:iam::{account}:root", cdk.Aws.NO_VALUE
            ).to_string()
            principals.append(iam.ArnPrincipal(arn))
        return [*principals, iam.AccountRootPrincipal()]
