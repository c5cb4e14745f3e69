"""A Cell-<n> stack: one ECS cluster holding up to contract.MAX_UNITS_PER_CELL units (Trainium, or x86 for
staging), one capacity provider each.

Cells are the blast radius of a deployment: a cell waits for the cell `parallel_cells` before it
(contract/rollout.py), so a rollout moves a few cells at a time and stops at the first cell it
breaks. Roles and the log group are shared by the cell's units to keep the stack small.
"""

from __future__ import annotations

from collections.abc import Mapping

import jsii
from aws_cdk import Aspects, Duration, IAspect, RemovalPolicy, Stack, Tags
from aws_cdk import aws_autoscaling as autoscaling
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from constructs import Construct, IConstruct

import contract
from contract.layout import DEFAULT_BATCH_SIZE, DEFAULT_SEQ_LEN
from contract.node_boot import boot_artifacts
from stacks.config import FlotillaConfig, UnitPlacement
from stacks.discovery import DiscoveryStack
from stacks.image import builtin_model_setting, unit_image
from stacks.nag import acknowledge, cfn_child
from stacks.network import NetworkStack
from stacks.retention import retention
from stacks.scaler import scaled_counts
from stacks.speculation import speculation_environment
from stacks.unit import ServingUnit, UnitProps, UnitSurge


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
    """ECS cluster, the cell's shared node roles and log group, and its ServingUnits."""

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        cell: int,
        config: FlotillaConfig,
        network: NetworkStack,
        discovery: DiscoveryStack,
        **kwargs,
    ) -> None:
        super().__init__(scope, id_, **kwargs)
        self.cell = cell
        self.cell_id = contract.cell_id(cell)
        Tags.of(self).add("flotilla:cell", self.cell_id)
        self.cluster = ecs.Cluster(
            self,
            "Cluster",
            vpc=network.vpc,
            cluster_name=f"{config.deployment_name}-{self.cell_id}",
            container_insights_v2=ecs.ContainerInsights.ENABLED,
        )
        instance_role = self._shared_by_units(config)
        image = unit_image(
            self,
            image_uri=config.image,
            engine=config.node.engine,
            nodes_per_unit=config.nodes_per_unit,
            builtin_model=config.model.builtin,
        )
        surge = UnitSurge.for_rollout(config.unit_rollout)
        scaled = scaled_counts(self, cell=cell, config=config)
        self.units: list[ServingUnit] = [
            ServingUnit(
                self,
                f"Unit{placement.index}",
                self._unit_props(
                    config, placement, network=network, discovery=discovery, image=image, surge=surge, scaled=scaled
                ),
            )
            for placement in config.units_in_cell(cell)
        ]
        self._roll_in_waves(config)
        Aspects.of(self.cluster).add(
            _ServicesAfterCapacityProviderAssociation(self.cluster, [u.service for u in self.units])
        )
        self._acknowledge_nag_findings(config, instance_role, image)

    def _shared_by_units(self, config: FlotillaConfig) -> iam.Role:
        """The instance role and profile, log group, execution role and task role every unit of the
        cell shares; returns the instance role, whose findings the acknowledgements name."""
        # Instance role: what the ECS agent needs (CDK adds those statements, scoped to this cluster,
        # when each unit's capacity provider is added) and the boot's artifacts.
        instance_role = iam.Role(
            self,
            "InstanceRole",
            assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
            description=f"flotilla {self.cell_id} Trainium instances: ECS agent",
        )
        self.instance_profile = iam.InstanceProfile(self, "InstanceProfile", role=instance_role)
        # The boot (user data, before any task) reads the artifacts it installs with this role, each
        # object by its exact key: nothing else in the bucket (contract/node_boot.py).
        artifacts = boot_artifacts(efa_interfaces=config.shape.efa_interfaces)
        if artifacts:
            instance_role.add_to_policy(
                iam.PolicyStatement(
                    sid="ReadNodeBootArtifacts",
                    actions=["s3:GetObject"],
                    resources=[f"arn:{self.partition}:s3:::{config.model.bucket}/{a.key}" for a in artifacts],
                )
            )
        self.log_group = logs.LogGroup(
            self, "Logs", retention=retention(config.node.log_retention_days), removal_policy=RemovalPolicy.DESTROY
        )
        self.execution_role = iam.Role(
            self,
            "ExecutionRole",
            assumed_by=iam.ServicePrincipal("ecs-tasks.amazonaws.com"),
            description=f"flotilla {self.cell_id}: pull the node image, write container logs",
        )
        self.task_role = iam.Role(
            self,
            "TaskRole",
            assumed_by=iam.ServicePrincipal("ecs-tasks.amazonaws.com"),
            description=f"flotilla {self.cell_id} nodes: read the model, rendezvous within the cluster",
        )
        self._grant_node_permissions(config)
        return instance_role

    def _node_environment(self, config: FlotillaConfig, unit_id: str) -> dict[str, str]:
        """The environment of one unit's node containers (contract's ENV_* names)."""
        environment = {
            contract.ENV_ROLE: "node",
            contract.ENV_UNIT_ID: unit_id,
            contract.ENV_CELL_ID: self.cell_id,
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
        if config.model.builtin:
            environment[contract.ENV_MODEL] = builtin_model_setting(config.model.builtin)
        if config.node.engine == contract.Engine.NEURON:
            environment[contract.ENV_COMPILE_CACHE_URI] = config.model.compile_cache
            environment[contract.ENV_INSTANCE_TYPE] = config.instance_type
            environment[contract.ENV_NEURON_SAMPLING] = config.node.neuron_sampling
            environment[contract.ENV_NEURON_PREFIX_CACHING_BLOCK] = str(config.node.neuron_prefix_caching_block)
            # The sequence and batch synth checked the layout at (contract/layout.py). Left out at the
            # node's own defaults (the same constants), so a deployment that keeps them keeps its task
            # definitions, and with them its running units, across this setting's arrival.
            if config.node.neuron_seq_len != DEFAULT_SEQ_LEN:
                environment[contract.ENV_NEURON_SEQ_LEN] = str(config.node.neuron_seq_len)
            if config.node.neuron_batch_size != DEFAULT_BATCH_SIZE:
                environment[contract.ENV_NEURON_BATCH_SIZE] = str(config.node.neuron_batch_size)
        environment.update(speculation_environment(config))
        return environment

    def _unit_props(
        self,
        config: FlotillaConfig,
        placement: UnitPlacement,
        *,
        network: NetworkStack,
        discovery: DiscoveryStack,
        image: ecs.ContainerImage,
        surge: UnitSurge,
        scaled: Mapping[str, float],
    ) -> UnitProps:
        """One unit's props: the cell's shared resources, its subnet and its settings."""
        return UnitProps(
            unit_id=placement.unit_id,
            family=f"{config.deployment_name}-{placement.unit_id}",
            cluster=self.cluster,
            vpc=network.vpc,
            router_security_group=network.router_security_group,
            subnet=network.private_subnet(placement.az_index),
            instance_type=config.instance_type,
            shape=config.shape,
            nodes=config.nodes_per_unit,
            max_nodes=config.max_nodes_per_unit,
            surge=surge,
            instance_profile=self.instance_profile,
            root_volume_gib=config.node.root_volume_gib,
            image=image,
            task_role=self.task_role,
            execution_role=self.execution_role,
            log_group=self.log_group,
            environment=self._node_environment(config, placement.unit_id),
            units_service=discovery.cell_services[self.cell_id],
            health_check_grace=Duration.seconds(config.node.health_check_grace_s),
            instance_store=config.node.instance_store,
            artifact_bucket=config.model.bucket,
            capacity_reservation_id=config.capacity.reservation_id,
            capacity_reservation_group_arn=config.capacity.reservation_group_arn,
            market_type=config.capacity.market,
            drained=placement.unit_id in config.drained_units,
            scaled_count=scaled.get(placement.unit_id),
            own_placement_group=config.own_placement_groups,
            placement_group_name=config.unit_placement_group,
        )

    def _roll_in_waves(self, config: FlotillaConfig) -> None:
        """Units roll in waves (config.wave_plan): every service of in-cell wave k DependsOn every
        service of wave k-1, and services without a DependsOn between them are updated (and
        created) in parallel. CloudFormation finishes a service update when its ECS deployment
        reaches a steady state, which needs every new task HEALTHY (aws/containers-roadmap#897),
        and stops at the first unit whose deployment fails (the circuit breaker), rolling the
        cell back. docs/rollouts.md has the whole sequence."""
        plan = config.wave_plan
        waves: dict[int, list[ServingUnit]] = {}
        for index, unit in enumerate(self.units):
            waves.setdefault(plan.wave_of(index), []).append(unit)
        for wave, members in waves.items():
            for unit in members:
                for previous in waves.get(wave - 1, []):
                    unit.service.node.add_dependency(previous.service)

    def _grant_node_permissions(self, config: FlotillaConfig) -> None:
        """Task role: read the model artifacts, see its own cluster's tasks, read peer instances."""
        model = config.model
        bucket_arn = f"arn:{self.partition}:s3:::{model.bucket}"
        self.task_role.add_to_policy(
            iam.PolicyStatement(
                sid="ReadModelArtifacts", actions=["s3:GetObject"], resources=[f"{bucket_arn}/{model.prefix}*"]
            )
        )
        self.task_role.add_to_policy(
            iam.PolicyStatement(
                sid="ListModelArtifacts",
                actions=["s3:ListBucket"],
                resources=[bucket_arn],
                conditions={"StringLike": {"s3:prefix": [f"{model.prefix}*"]}} if model.prefix else None,
            )
        )
        if config.node.engine == contract.Engine.NEURON:
            # The compile cache is the one place nodes write: a restarted node loads what another
            # compiled instead of compiling again (runtime/artifacts/compile_cache.py).
            cache_arn = f"arn:{self.partition}:s3:::{model.compile_cache_bucket}"
            self.task_role.add_to_policy(
                iam.PolicyStatement(
                    sid="ReadWriteCompileCache",
                    actions=["s3:GetObject", "s3:PutObject"],
                    resources=[f"{cache_arn}/{model.compile_cache_prefix}*"],
                )
            )
            self.task_role.add_to_policy(
                iam.PolicyStatement(
                    sid="ListCompileCache",
                    actions=["s3:ListBucket"],
                    resources=[cache_arn],
                    conditions={"StringLike": {"s3:prefix": [f"{model.compile_cache_prefix}*"]}}
                    if model.compile_cache_prefix
                    else None,
                )
            )
        in_this_cluster = {"ArnEquals": {"ecs:cluster": self.cluster.cluster_arn}}
        # ListTasks has no task-level resource; the cluster condition scopes it.
        self.task_role.add_to_policy(
            iam.PolicyStatement(
                sid="ListClusterTasks", actions=["ecs:ListTasks"], resources=["*"], conditions=in_this_cluster
            )
        )
        self.task_role.add_to_policy(
            iam.PolicyStatement(
                sid="DescribeClusterTasks",
                actions=["ecs:DescribeTasks", "ecs:DescribeContainerInstances"],
                resources=[
                    self.cluster.arn_for_tasks("*"),
                    self.format_arn(
                        service="ecs", resource="container-instance", resource_name=f"{self.cluster.cluster_name}/*"
                    ),
                ],
                conditions=in_this_cluster,
            )
        )
        # Rendezvous maps its peers' instances to private IPs and network-topology paths. Neither
        # EC2 Describe* call supports resource-level permissions.
        self.task_role.add_to_policy(
            iam.PolicyStatement(
                sid="ReadInstancesAndTopology",
                actions=["ec2:DescribeInstances", "ec2:DescribeInstanceTopology"],
                resources=["*"],
            )
        )

    def _acknowledge_nag_findings(
        self, config: FlotillaConfig, instance_role: iam.Role, image: ecs.ContainerImage
    ) -> None:
        """cdk-nag findings that are deliberate, each on its own resource with its reason."""
        cluster = f"<{self.get_logical_id(cfn_child(self.cluster, ecs.CfnCluster))}>"
        instance_policy = cfn_child(instance_role.node.find_child("DefaultPolicy"), iam.CfnPolicy)
        acknowledge(
            instance_policy,
            "IAM5",
            applies_to="Action::ecs:Submit*",
            reason=(
                "CDK's ECS agent statement: SubmitTaskStateChange, SubmitContainerStateChange and "
                "SubmitAttachmentStateChanges are all needed by the agent and scoped to this cell's "
                "cluster ARN."
            ),
        )
        acknowledge(
            instance_policy,
            "IAM5",
            applies_to="Resource::*",
            reason=(
                "ECS agent essentials: ecs:DiscoverPollEndpoint and ecr:GetAuthorizationToken have no "
                "resource-level permissions; ecs:Poll and ecs:StartTelemetrySession are conditioned on "
                "this cell's cluster; logs:CreateLogStream/PutLogEvents are the agent's documented "
                "essentials (AmazonEC2ContainerServiceforEC2Role)."
            ),
        )
        if not isinstance(image, ecs.RepositoryImage):
            # Only an image asset (ECR) makes CDK grant ecr:GetAuthorizationToken on "*"; with a
            # configured `image` the execution role writes logs only and has no such finding.
            execution_policy = cfn_child(self.execution_role.node.find_child("DefaultPolicy"), iam.CfnPolicy)
            acknowledge(
                execution_policy,
                "IAM5",
                applies_to="Resource::*",
                reason=(
                    "ecr:GetAuthorizationToken has no resource-level permissions; image pulls are scoped "
                    "to the image's repository and log writes to this cell's log group."
                ),
            )
        task_policy = cfn_child(self.task_role.node.find_child("DefaultPolicy"), iam.CfnPolicy)
        acknowledge(
            task_policy,
            "IAM5",
            applies_to="Resource::*",
            reason=(
                "ecs:ListTasks is conditioned on ecs:cluster = this cell's cluster; "
                "ec2:DescribeInstances and ec2:DescribeInstanceTopology have no resource-level "
                "permissions (rendezvous finds its peers' private IPs and orders ranks by network "
                "topology)."
            ),
        )
        model = config.model
        acknowledge(
            task_policy,
            "IAM5",
            reason=(
                "Nodes read every object under the configured model prefix: sharded checkpoint "
                "files whose names are not known at synth. Nothing outside the prefix."
            ),
            applies_to=f"Resource::arn:<AWS::Partition>:s3:::{model.bucket}/{model.prefix}*",
        )
        if config.node.engine == contract.Engine.NEURON:
            acknowledge(
                task_policy,
                "IAM5",
                reason=(
                    "The neuron engine's compile cache: nodes read and write objects under the "
                    "configured compile-cache prefix only; the keys are hashes of model, NxD "
                    "Inference config and Neuron SDK version, known only at run time."
                ),
                applies_to=f"Resource::arn:<AWS::Partition>:s3:::{model.compile_cache_bucket}/"
                f"{model.compile_cache_prefix}*",
            )
        for kind in ("task", "container-instance"):
            acknowledge(
                task_policy,
                "IAM5",
                reason=(
                    f"Rendezvous describes its unit's tasks and their container instances; {kind} "
                    "ids are only known at run time, the ARN is limited to this cell's cluster."
                ),
                applies_to=f"Resource::arn:<AWS::Partition>:ecs:<AWS::Region>:<AWS::AccountId>:{kind}/{cluster}/*",
            )
        for unit in self.units:
            acknowledge(
                cfn_child(unit.auto_scaling_group, autoscaling.CfnAutoScalingGroup),
                "AS3",
                reason=(
                    "The ECS capacity provider owns this ASG's instance lifecycle (managed scaling, "
                    "draining, termination protection); instance and task failures surface as ECS "
                    "service events and unit health alarms rather than ASG notifications."
                ),
            )
            acknowledge(
                cfn_child(unit.task_definition, ecs.CfnTaskDefinition),
                "ECS2",
                reason=(
                    "The environment holds only non-secret identity and settings (unit id, revision, "
                    "model URI); a changed value is meant to be a new task definition revision, which "
                    "is how a unit rolls to a new revision."
                ),
            )
