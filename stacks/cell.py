"""A Cell-<n> stack: one ECS cluster holding up to 20 Trainium units (one capacity provider each).

Cells are the blast radius of a deployment: they deploy one after another, so a rollout moves
cell by cell. Roles and the log group are shared by the cell's units to keep the stack small.
"""

from __future__ import annotations

import jsii
from aws_cdk import Aspects, IAspect, RemovalPolicy, Stack
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from constructs import Construct, IConstruct

import contract
from stacks.config import FlotillaConfig
from stacks.image import node_image
from stacks.network import NetworkStack
from stacks.retention import retention
from stacks.unit import TrainiumUnit, UnitSurge


@jsii.implements(IAspect)
class _ServicesAfterCapacityProviderAssociation:
    """CloudFormation must associate a capacity provider with the cluster before a service may
    use it in its strategy (containers-roadmap#631). CDK creates the association in an aspect of
    the cluster; this aspect runs after it on the same node and makes every service wait for it."""

    def __init__(self, cluster: ecs.Cluster, services: list[ecs.Ec2Service]):
        self._cluster, self._services = cluster, services

    def visit(self, node: IConstruct) -> None:
        if node is not self._cluster:
            return
        association = self._cluster.node.try_find_child(self._cluster.node.id)
        if association is None:
            raise RuntimeError("CDK did not create the cluster's capacity provider association")
        for service in self._services:
            service.node.add_dependency(association)


class CellStack(Stack):
    """ECS cluster, the cell's shared node roles and log group, and its TrainiumUnits."""

    def __init__(self, scope: Construct, id_: str, *, cell: int, config: FlotillaConfig,
                 network: NetworkStack, **kwargs) -> None:
        super().__init__(scope, id_, **kwargs)
        self.cell = cell
        cell_id = f"cell{cell}"
        self.cluster = ecs.Cluster(self, "Cluster", vpc=network.vpc,
                                   container_insights_v2=ecs.ContainerInsights.ENABLED)

        # Instance role: only what the ECS agent needs (CDK adds those statements, scoped to this
        # cluster, when each unit's capacity provider is added).
        instance_role = iam.Role(self, "InstanceRole",
                                 assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
                                 description=f"flotilla {cell_id} Trainium instances: ECS agent")
        self.instance_profile = iam.InstanceProfile(self, "InstanceProfile", role=instance_role)

        self.log_group = logs.LogGroup(
            self, "Logs", retention=retention(config.node.log_retention_days),
            removal_policy=RemovalPolicy.DESTROY)
        self.execution_role = iam.Role(
            self, "ExecutionRole", assumed_by=iam.ServicePrincipal("ecs-tasks.amazonaws.com"),
            description=f"flotilla {cell_id}: pull the node image, write container logs")
        self.task_role = iam.Role(
            self, "TaskRole", assumed_by=iam.ServicePrincipal("ecs-tasks.amazonaws.com"),
            description=f"flotilla {cell_id} nodes: read the model, rendezvous within the cluster")
        self._grant_node_permissions(config)

        image = node_image(self, image_uri=config.image)
        surge = UnitSurge.for_rollout(config.unit_rollout)
        self.units: list[TrainiumUnit] = []
        for placement in config.units_in_cell(cell):
            environment = {
                contract.ENV_ROLE: "node",
                contract.ENV_UNIT_ID: placement.unit_id,
                contract.ENV_CELL_ID: cell_id,
                contract.ENV_REVISION: config.revision,
                contract.ENV_NODES_PER_UNIT: str(config.nodes_per_unit),
                contract.ENV_RENDEZVOUS: "ecs",
                contract.ENV_ENGINE: config.node.engine,
                contract.ENV_MODEL_URI: config.model.s3_uri,
                contract.ENV_MODEL_NAME: config.model.name,
                contract.ENV_PREFILL_STRATEGY: config.node.prefill_strategy,
                contract.ENV_DECODE_STRATEGY: config.node.decode_strategy,
                contract.ENV_DRAIN_TIMEOUT: str(config.node.drain_timeout_s),
                contract.ENV_PORT: str(contract.NODE_API_PORT),
            }
            self.units.append(TrainiumUnit(
                self, f"Unit{placement.index}", unit_id=placement.unit_id, cell_id=cell_id,
                cluster=self.cluster, vpc=network.vpc,
                subnet=network.private_subnet(placement.az_index),
                instance_type=config.instance_type, shape=config.shape,
                nodes=config.nodes_per_unit, surge=surge,
                instance_profile=self.instance_profile,
                root_volume_gib=config.node.root_volume_gib, image=image,
                task_role=self.task_role, execution_role=self.execution_role,
                log_group=self.log_group, environment=environment))
        Aspects.of(self.cluster).add(_ServicesAfterCapacityProviderAssociation(
            self.cluster, [u.service for u in self.units]))

    def _grant_node_permissions(self, config: FlotillaConfig) -> None:
        """Task role: read the model artifacts, see its own cluster's tasks, read EC2 topology."""
        model = config.model
        bucket_arn = f"arn:{self.partition}:s3:::{model.bucket}"
        self.task_role.add_to_policy(iam.PolicyStatement(
            sid="ReadModelArtifacts", actions=["s3:GetObject"],
            resources=[f"{bucket_arn}/{model.prefix}*"]))
        self.task_role.add_to_policy(iam.PolicyStatement(
            sid="ListModelArtifacts", actions=["s3:ListBucket"], resources=[bucket_arn],
            conditions={"StringLike": {"s3:prefix": [f"{model.prefix}*"]}} if model.prefix
            else None))
        in_this_cluster = {"ArnEquals": {"ecs:cluster": self.cluster.cluster_arn}}
        # ListTasks has no task-level resource; the cluster condition scopes it.
        self.task_role.add_to_policy(iam.PolicyStatement(
            sid="ListClusterTasks", actions=["ecs:ListTasks"], resources=["*"],
            conditions=in_this_cluster))
        self.task_role.add_to_policy(iam.PolicyStatement(
            sid="DescribeClusterTasks",
            actions=["ecs:DescribeTasks", "ecs:DescribeContainerInstances"],
            resources=[self.cluster.arn_for_tasks("*"),
                       self.format_arn(service="ecs", resource="container-instance",
                                       resource_name=f"{self.cluster.cluster_name}/*")],
            conditions=in_this_cluster))
        # DescribeInstanceTopology supports no resource-level permissions.
        self.task_role.add_to_policy(iam.PolicyStatement(
            sid="ReadInstanceTopology", actions=["ec2:DescribeInstanceTopology"],
            resources=["*"]))
