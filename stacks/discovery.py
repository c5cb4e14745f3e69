"""Discovery: how the router finds the unit members, and who may talk to whom on the way.

A Cloud Map HTTP namespace with one service per cell (`units-cell<n>`) that each unit's ECS service
registers its tasks in (ECS registers and deregisters them; see docs/discovery.md): a service holds
at most 1,000 instances and DiscoverInstances returns at most 1,000, so one service for the whole
fleet would hide members past the thousandth. Also the ALB's security group with the ALB <-> router
rules. The router SG itself lives in Network (the cells admit it); both
path SGs sit below Front and Router, so every SG-to-SG rule of the path is in this one template
and no stack references a later one.
"""

from __future__ import annotations

from collections.abc import Sequence

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_servicediscovery as cloudmap
from constructs import Construct

import contract
from stacks.nag import acknowledge, cfn_child
from stacks.network import VPC_CIDR

HTTPS_PORT = 443
HTTP_PORT = 80


def units_service_name(cell_id: str) -> str:
    """The Cloud Map service a cell's unit members register in, e.g. units-cell0."""
    return f"{contract.CLOUDMAP_UNITS_SERVICE_PREFIX}{cell_id}"


class DiscoveryStack(cdk.Stack):
    """Cloud Map namespace + one service per cell; the ALB security group with exact rules.

    clients -> ALB on the client ports (443 and 80): the VPC and the configured client ranges when
    internal, only the configured ranges when internet-facing; ALB -> router on the router port. (The router SG's
    own egress, node serving port in the VPC and HTTPS, is set in Network; each unit SG admits the
    router SG on the serving port.)
    """

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        vpc: ec2.IVpc,
        router_security_group: ec2.ISecurityGroup,
        namespace_name: str,
        cells: Sequence[str] = ("cell0",),
        internet_facing: bool = False,
        client_cidrs: Sequence[str] = (),
        client_prefix_lists: Sequence[str] = (),
        **kwargs,
    ) -> None:
        super().__init__(scope, id_, **kwargs)
        self._cell_services(namespace_name, cells)
        self._alb_security_group(
            vpc,
            router_security_group,
            internet_facing=internet_facing,
            client_cidrs=client_cidrs,
            client_prefix_lists=client_prefix_lists,
        )
        cdk.CfnOutput(self, "CloudMapNamespace", value=namespace_name)
        cdk.CfnOutput(self, "CloudMapServicePrefix", value=contract.CLOUDMAP_UNITS_SERVICE_PREFIX)
        cdk.CfnOutput(self, "CloudMapServiceCount", value=str(len(cells)))

    def _cell_services(self, namespace_name: str, cells: Sequence[str]) -> None:
        """The HTTP namespace and one Cloud Map service per cell, where ECS registers unit members."""
        self.namespace = cloudmap.HttpNamespace(
            self,
            "Namespace",
            name=namespace_name,
            description="flotilla: unit members, registered by ECS, discovered by the router",
        )
        # One service per cell: stacks/config.py checks that a cell's members, twice over during a
        # surge rollout, stay within Cloud Map's 1,000 instances per service.
        self.cell_services: dict[str, cloudmap.Service] = {
            cell: self.namespace.create_service(
                f"Units{cell.capitalize()}",
                name=units_service_name(cell),
                description=f"every unit member (leader and followers) of {cell}",
                # ECS reports task health to Cloud Map; the router judges readiness itself.
                custom_health_check=cloudmap.HealthCheckCustomConfig(failure_threshold=1),
            )
            for cell in cells
        }
        self.namespace_name = namespace_name
        self.service_names = tuple(units_service_name(cell) for cell in cells)

    def _alb_security_group(
        self,
        vpc: ec2.IVpc,
        router_security_group: ec2.ISecurityGroup,
        *,
        internet_facing: bool,
        client_cidrs: Sequence[str],
        client_prefix_lists: Sequence[str],
    ) -> None:
        """The ALB's security group: the clients in on both client ports, the router port out, and
        the router group's rule admitting the ALB."""
        self.alb_security_group = ec2.SecurityGroup(
            self,
            "AlbSecurityGroup",
            vpc=vpc,
            allow_all_outbound=False,
            description="flotilla ALB: clients in, router port out",
        )
        # The clients: the VPC itself when the ALB is internal (the application tier calls it from
        # inside), plus the ranges and prefix lists the config names; internet-facing, only those.
        peers: list[tuple[ec2.IPeer, str]] = [] if internet_facing else [(ec2.Peer.ipv4(VPC_CIDR), "the VPC")]
        peers += [(ec2.Peer.ipv4(cidr), cidr) for cidr in client_cidrs]
        peers += [(ec2.Peer.prefix_list(pl), pl) for pl in client_prefix_lists]
        if not peers:
            raise ValueError("an internet-facing ALB needs client_cidrs or client_prefix_lists: no 0.0.0.0/0 default")
        # Both client ports whether or not a certificate is configured: the listeners on them
        # change with certificate_arn (Front), this group does not, so removing a certificate
        # never closes 443 before the production listener has left it (Discovery deploys first).
        for peer, who in peers:
            for port in (HTTPS_PORT, HTTP_PORT):
                self.alb_security_group.add_ingress_rule(peer, ec2.Port.tcp(port), f"clients on {port} from {who}")
        # Both rules of the ALB -> router hop are written here, explicitly. Front and Router attach
        # the groups as immutable imports, so CDK's automatic target-group rules add nothing (and
        # cannot land in Network, which would make Network depend on this stack).
        self.alb_security_group.add_egress_rule(
            ec2.Peer.security_group_id(router_security_group.security_group_id),
            ec2.Port.tcp(contract.ROUTER_PORT),
            "ALB to router port",
        )
        ec2.CfnSecurityGroupIngress(
            self,
            "RouterFromAlb",
            group_id=router_security_group.security_group_id,
            source_security_group_id=self.alb_security_group.security_group_id,
            ip_protocol="tcp",
            from_port=contract.ROUTER_PORT,
            to_port=contract.ROUTER_PORT,
            description="ALB to router port",
        )
        if "0.0.0.0/0" in client_cidrs:
            acknowledge(
                cfn_child(self.alb_security_group, ec2.CfnSecurityGroup),
                "EC23",
                "0.0.0.0/0 is listed in front.client_cidrs by the operator's choice, on the client ports "
                "(443/80) only: an internal ALB has private addresses only; an internet-facing one serves "
                "HTTPS behind the WAF web ACL, and synth refuses it without a certificate or the routers' "
                "API keys.",
            )


def register_unit_members(service: ecs.BaseService, *, units_service: cloudmap.IService) -> None:
    """Make ECS register every task of a unit's ECS service in its cell's Cloud Map service.

    ECS writes AWS_INSTANCE_IPV4 (the host's address: host networking) and ECS_SERVICE_NAME, and
    deregisters the task when it stops, so crashed members never linger. A draining member stays
    listed until it exits; the router learns of the drain from /health/ready (not ready).

    Under host (and bridge) networking CreateService requires the registry to name a container
    and port of the task definition: "If the task definition that your service task specifies uses
    the bridge or host network mode, you must specify a containerName and containerPort
    combination from the task definition." (ECS API reference, ServiceRegistry,
    https://docs.aws.amazon.com/AmazonECS/latest/APIReference/API_ServiceRegistry.html). CDK
    2.275 fills them only for SRV records and drops them for an HTTP-namespace service even when
    passed (aws/aws-cdk#29245), so they are written into the template directly.
    """
    container = service.task_definition.default_container
    if container is None or not container.port_mappings:
        raise ValueError(f"{service.node.path}: the unit's task definition needs a container with a port mapping")
    port = container.port_mappings[0].container_port
    service.associate_cloud_map_service(service=units_service, container=container, container_port=port)
    registry = service.node.default_child
    if not isinstance(registry, ecs.CfnService):
        raise TypeError(f"{service.node.path}: expected an AWS::ECS::Service under the service construct")
    registry.add_property_override("ServiceRegistries.0.ContainerName", container.container_name)
    registry.add_property_override("ServiceRegistries.0.ContainerPort", port)
