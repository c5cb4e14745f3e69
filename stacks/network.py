"""The Network stack: one VPC over three AZs shared by the Front stack and every Cell stack.

Public subnets hold the NAT gateways (and the ALB only when the front door is opted into
internet-facing); private subnets with egress hold the internal ALB, the router and the Trainium
nodes. VPC endpoints keep image pulls, logs and model reads off the NAT gateways.
"""

from __future__ import annotations

from aws_cdk import Fn, RemovalPolicy, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_logs as logs
from constructs import Construct

import contract
from stacks.config import private_subnet_mask

VPC_CIDR = "10.0.0.0/16"
PUBLIC_SUBNET_MASK = 24  # NAT gateways, and an opted-in internet-facing ALB, only


class NetworkStack(Stack):
    """VPC, flow logs and endpoints. Other stacks use `.vpc` and `.private_subnet(az_index)`."""

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        availability_zones: tuple[str, ...],
        log_retention: logs.RetentionDays,
        **kwargs,
    ) -> None:
        # Set before super().__init__: the availability_zones property below reads it.
        self._azs = tuple(availability_zones)
        super().__init__(scope, id_, **kwargs)

        self._vpc(log_retention)
        self._endpoints()
        self._router_security_group()

    def _vpc(self, log_retention: logs.RetentionDays) -> None:
        """The VPC over the deployment's AZs, a NAT gateway in each, with flow logs."""
        self.vpc = ec2.Vpc(
            self,
            "Vpc",
            ip_addresses=ec2.IpAddresses.cidr(VPC_CIDR),
            availability_zones=list(self.availability_zones),
            # One NAT gateway per AZ: losing an AZ must not cut the other AZs' egress.
            nat_gateways=len(self.availability_zones),
            subnet_configuration=[
                ec2.SubnetConfiguration(
                    name="Public",
                    subnet_type=ec2.SubnetType.PUBLIC,
                    cidr_mask=PUBLIC_SUBNET_MASK,
                    map_public_ip_on_launch=False,
                ),
                # /18 (/19 past three AZs): every EFA interface of every node takes one address
                # (config.check_quotas, config.private_subnet_mask).
                ec2.SubnetConfiguration(
                    name="Private",
                    subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS,
                    cidr_mask=private_subnet_mask(len(self.availability_zones)),
                ),
            ],
            # The CDK default adds a Lambda-backed custom resource to strip the default SG's
            # rules; nothing in flotilla uses the default SG, and custom resources cannot run
            # in the offline/moto test path.
            restrict_default_security_group=False,
        )
        flow_log_group = logs.LogGroup(self, "FlowLogs", retention=log_retention, removal_policy=RemovalPolicy.DESTROY)
        self.vpc.add_flow_log(
            "FlowLog",
            destination=ec2.FlowLogDestination.to_cloud_watch_logs(flow_log_group),
            traffic_type=ec2.FlowLogTrafficType.ALL,
        )

    def _endpoints(self) -> None:
        """The S3 gateway endpoint and the interface endpoints for ECR and CloudWatch Logs."""
        # Gateway endpoint: model artifacts (tens to hundreds of GB per node) never cross a NAT.
        self.vpc.add_gateway_endpoint("S3", service=ec2.GatewayVpcEndpointAwsService.S3)
        # Interface endpoints: image pulls and container logs stay inside the VPC.
        self.endpoint_security_group = ec2.SecurityGroup(
            self,
            "EndpointSg",
            vpc=self.vpc,
            allow_all_outbound=False,
            description="Interface endpoints: HTTPS from inside the VPC",
        )
        self.endpoint_security_group.add_ingress_rule(
            # The literal CIDR (not the VPC's CidrBlock attribute) keeps the rule checkable.
            ec2.Peer.ipv4(VPC_CIDR),
            ec2.Port.tcp(443),
            "HTTPS from the VPC to the endpoints",
        )
        for name, service in (
            ("EcrApi", ec2.InterfaceVpcEndpointAwsService.ECR),
            ("EcrDocker", ec2.InterfaceVpcEndpointAwsService.ECR_DOCKER),
            ("Logs", ec2.InterfaceVpcEndpointAwsService.CLOUDWATCH_LOGS),
        ):
            self.vpc.add_interface_endpoint(
                name,
                service=service,
                open=False,
                private_dns_enabled=True,
                security_groups=[self.endpoint_security_group],
                subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS),
            )

    def _router_security_group(self) -> None:
        # The router's security group lives here, not in the Front stack, so each Cell stack can
        # admit it to its units (router -> node API port) without depending on the Front stack.
        # The Front stack attaches it to the router service and adds the ALB -> router rule.
        self.router_security_group = ec2.SecurityGroup(
            self,
            "RouterSg",
            vpc=self.vpc,
            allow_all_outbound=False,
            description="flotilla router tasks: to unit leaders and AWS APIs only",
        )
        self.router_security_group.add_egress_rule(
            ec2.Peer.ipv4(VPC_CIDR), ec2.Port.tcp(contract.NODE_API_PORT), "Router to the API port of unit members"
        )
        self.router_security_group.add_egress_rule(
            ec2.Peer.any_ipv4(), ec2.Port.tcp(443), "AWS APIs (service discovery, logs, image pulls) over HTTPS"
        )

    @property
    def availability_zones(self) -> list[str]:
        # Explicit AZs when configured; otherwise the region's first three via Fn::GetAZs. Never
        # the CDK default, which for an env-bound stack triggers a context lookup (credentials,
        # network) and would break offline synth.
        if self._azs:
            return list(self._azs)
        return [Fn.select(i, Fn.get_azs()) for i in range(3)]

    def private_subnet(self, az_index: int) -> ec2.ISubnet:
        """The private subnet of the VPC's AZ number az_index (units are spread round-robin)."""
        return self.vpc.private_subnets[az_index]
