"""Router: the stateless proxy tier as a Fargate service with ECS native blue/green.

Each router deployment starts green tasks in the idle target group, shifts the production rule to
them, bakes while the Observability alarms watch, and rolls back on an alarm or a failed circuit
breaker. Autoscaling tracks ALB requests per healthy target.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import aws_cdk as cdk
from aws_cdk import aws_applicationautoscaling as appscaling
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_elasticloadbalancingv2 as elbv2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from constructs import Construct

import contract
from contract import apikeys
from stacks.image import node_image
from stacks.nag import acknowledge, cfn_child

CONTAINER_NAME = "router"
FARGATE_MAX_STOP_TIMEOUT_S = 120


@dataclass(frozen=True, kw_only=True)
class RouterProps:
    """Everything the router tier is built from: where it runs (Network), the target groups, rule and
    alarms it deploys behind (Front, Observability), what it reads at run time (Discovery's Cloud Map
    services, the admission parameter, the API keys' secret), and the service's own settings, named as
    the config's `router` section names them."""

    vpc: ec2.IVpc
    router_security_group: ec2.ISecurityGroup
    image_uri: str | None  # a registry URI, or None for the runtime/ asset
    blue_target_group: elbv2.ApplicationTargetGroup
    green_target_group: elbv2.ApplicationTargetGroup
    production_rule: elbv2.ApplicationListenerRule
    deployment_alarms: Sequence[cw.IAlarm]
    cloudmap_namespace_name: str
    cloudmap_service_names: Sequence[str]
    admission_parameter_name: str
    balance: str = contract.ROUTER_BALANCE_POLICIES[0]
    api_keys_secret_name: str | None = None  # None: the routers take requests without a key
    api_keys_ttl_s: int = apikeys.API_KEYS_TTL_S
    limit_routers: int = 1  # routers sharing each key's limits (each admits 1/n)
    desired_count: int = 2  # the autoscaling minimum (the service states no count of its own)
    max_count: int = 10  # the autoscaling maximum
    cpu: int = 1024
    memory_mib: int = 2048
    requests_per_target_per_minute: int = 600
    bake_time: cdk.Duration = cdk.Duration.minutes(10)
    drain_timeout: cdk.Duration = cdk.Duration.seconds(60)
    log_retention: logs.RetentionDays = logs.RetentionDays.ONE_MONTH

    def __post_init__(self) -> None:
        if not 1 <= self.desired_count <= self.max_count:
            raise ValueError(
                f"router desired_count={self.desired_count}, max_count={self.max_count}: "
                "need 1 <= desired_count <= max_count"
            )
        if not self.deployment_alarms:
            raise ValueError(
                "deployment_alarms is empty: the router's blue/green rollback needs the "
                "Observability stack's alarms (pass them at construction, aws-cdk#36308)"
            )
        if self.stop_timeout_s > FARGATE_MAX_STOP_TIMEOUT_S:
            raise ValueError(
                f"router drain_timeout={self.drain_s} s: Fargate stops a task at most "
                f"{FARGATE_MAX_STOP_TIMEOUT_S} s after SIGTERM; use <= "
                f"{FARGATE_MAX_STOP_TIMEOUT_S - 10} s"
            )

    @property
    def drain_s(self) -> int:
        return int(self.drain_timeout.to_seconds())

    @property
    def stop_timeout_s(self) -> int:
        """ECS sends SIGTERM, waits stopTimeout, then SIGKILL: the router gets 10 s beyond its drain."""
        return self.drain_s + 10


class RouterStack(cdk.Stack):
    """Fargate router service behind the Front stack's blue and green target groups."""

    def __init__(self, scope: Construct, id_: str, props: RouterProps, **kwargs) -> None:
        super().__init__(scope, id_, **kwargs)
        self._task_definition(props)
        access_env = self._read_api_keys(props.api_keys_secret_name, props.api_keys_ttl_s, props.limit_routers)
        image = self._container(props, access_env)
        self._service(props)
        self._autoscale(props)
        cdk.CfnOutput(self, "ClusterName", value=self.cluster.cluster_name)
        cdk.CfnOutput(self, "ServiceName", value=self.service.service_name)
        self._acknowledge_findings(image)

    def _task_definition(self, props: RouterProps) -> None:
        """The cluster and the Fargate task definition, with the task role's read access to the unit
        members in Cloud Map and to the admission limit."""
        self.cluster = ecs.Cluster(
            self,
            "Cluster",
            vpc=props.vpc,
            container_insights_v2=ecs.ContainerInsights.ENABLED,
        )
        self.task_definition = ecs.FargateTaskDefinition(
            self,
            "TaskDefinition",
            cpu=props.cpu,
            memory_limit_mib=props.memory_mib,
            runtime_platform=ecs.RuntimePlatform(
                cpu_architecture=ecs.CpuArchitecture.X86_64,
                operating_system_family=ecs.OperatingSystemFamily.LINUX,
            ),
        )
        # DiscoverInstances and DiscoverInstancesRevision support no resource-level permissions
        # (Resource must be "*"; AWS's AWSCloudMapDiscoverInstanceAccess grants both on "*"); the
        # condition keys pin them to our namespace and the cells' services, by prefix so the policy
        # stays one line long however many cells there are.
        self.task_definition.add_to_task_role_policy(
            iam.PolicyStatement(
                sid="DiscoverUnitMembers",
                actions=["servicediscovery:DiscoverInstances", "servicediscovery:DiscoverInstancesRevision"],
                resources=["*"],
                conditions={
                    "StringEquals": {"servicediscovery:NamespaceName": props.cloudmap_namespace_name},
                    "StringLike": {"servicediscovery:ServiceName": f"{contract.CLOUDMAP_UNITS_SERVICE_PREFIX}*"},
                },
            )
        )
        # The fleet-wide admission limit `flotilla shed` writes (contract/admission.py): read only, this
        # one parameter. The stacks do not create it, so a deploy never resets an incident's limit;
        # a missing parameter means no limit.
        self.task_definition.add_to_task_role_policy(
            iam.PolicyStatement(
                sid="ReadAdmissionLimit",
                actions=["ssm:GetParameter"],
                resources=[
                    self.format_arn(
                        service="ssm", resource="parameter", resource_name=props.admission_parameter_name.lstrip("/")
                    )
                ],
            )
        )

    def _container(self, props: RouterProps, access_env: dict[str, str]) -> ecs.ContainerImage:
        """The router container (the node image, command `router`) with its log group and a
        read-only root; returns the image, whose kind decides an acknowledgement."""
        log_group = logs.LogGroup(self, "Logs", retention=props.log_retention, removal_policy=cdk.RemovalPolicy.DESTROY)
        health_url = f"http://127.0.0.1:{contract.ROUTER_PORT}{contract.ROUTER_HEALTH_PATH}"
        # The node image (same image, command `router`): a registry URI, else the runtime/ asset.
        image = node_image(self, image_uri=props.image_uri)
        self.container = self.task_definition.add_container(
            CONTAINER_NAME,
            image=image,
            command=list(contract.ROUTER_COMMAND),
            environment={
                contract.ENV_ROLE: "router",
                contract.ENV_PORT: str(contract.ROUTER_PORT),
                contract.ENV_DISCOVERY: "cloudmap",
                contract.ENV_CLOUDMAP_NAMESPACE: props.cloudmap_namespace_name,
                contract.ENV_CLOUDMAP_SERVICE: ",".join(props.cloudmap_service_names),
                contract.ENV_DRAIN_TIMEOUT: str(props.drain_s),
                contract.ENV_ADMISSION_PARAMETER: props.admission_parameter_name,
                contract.ENV_BALANCE: props.balance,
                **access_env,
            },
            port_mappings=[ecs.PortMapping(container_port=contract.ROUTER_PORT, protocol=ecs.Protocol.TCP)],
            health_check=ecs.HealthCheck(
                # The image is Python: no curl needed.
                command=[
                    "CMD",
                    "python3",
                    "-c",
                    f"import urllib.request; urllib.request.urlopen('{health_url}', timeout=2)",
                ],
                interval=cdk.Duration.seconds(10),
                timeout=cdk.Duration.seconds(5),
                retries=3,
                start_period=cdk.Duration.seconds(15),
            ),
            logging=ecs.LogDrivers.aws_logs(stream_prefix="router", log_group=log_group),
            stop_timeout=cdk.Duration.seconds(props.stop_timeout_s),
            readonly_root_filesystem=True,
        )
        # Read-only root; /tmp on the task's ephemeral storage for anything a library writes.
        self.task_definition.add_volume(name="tmp")
        self.container.add_mount_points(ecs.MountPoint(container_path="/tmp", source_volume="tmp", read_only=False))
        return image

    def _service(self, props: RouterProps) -> None:
        """The Fargate service, deployed blue/green behind the Front stack's two target groups and
        rolled back on the Observability stack's alarms."""
        self.service = ecs.FargateService(
            self,
            "Service",
            cluster=self.cluster,
            task_definition=self.task_definition,
            # No DesiredCount: CloudFormation writes a stated count back on every update of the
            # service (every new cell changes the router's environment), resetting an autoscaled
            # fleet to its minimum (aws/containers-roadmap#493). Omitted, a create starts 1 task and
            # an update keeps the current count (aws/aws-cdk#13130, quoting CloudFormation; CDK's
            # removeDefaultDesiredCount flag covers only ecs-patterns). Registering the scalable
            # target below "changes the resource's current capacity to a value that is inside of
            # this range" (Application Auto Scaling API, RegisterScalableTarget), so the service
            # reaches desired_count right after create and never drops below it.
            desired_count=None,
            # Owned by Network (egress) and Discovery (ALB ingress); immutable here so the
            # target-group attachment adds no rules of its own.
            security_groups=[
                ec2.SecurityGroup.from_security_group_id(
                    self,
                    "RouterSecurityGroup",
                    props.router_security_group.security_group_id,
                    mutable=False,
                    allow_all_outbound=False,
                )
            ],
            vpc_subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS),
            assign_public_ip=False,
            deployment_strategy=ecs.DeploymentStrategy.BLUE_GREEN,
            bake_time=props.bake_time,
            circuit_breaker=ecs.DeploymentCircuitBreaker(enable=True, rollback=True),
            # Passed here, not via enable_deployment_alarms() later: aws/aws-cdk#36308.
            deployment_alarms=ecs.DeploymentAlarmConfig(
                alarm_names=[a.alarm_name for a in props.deployment_alarms],
                behavior=ecs.AlarmBehavior.ROLLBACK_ON_ALARM,
            ),
            min_healthy_percent=100,
            max_healthy_percent=200,
            health_check_grace_period=cdk.Duration.seconds(30),
        )
        self.service.load_balancer_target(
            container_name=CONTAINER_NAME,
            container_port=contract.ROUTER_PORT,
            alternate_target=ecs.AlternateTarget(
                "GreenTarget",
                alternate_target_group=props.green_target_group,
                production_listener=ecs.ListenerRuleConfiguration.application_listener_rule(props.production_rule),
            ),
        ).attach_to_application_target_group(props.blue_target_group)

    def _read_api_keys(self, secret_name: str | None, ttl_s: int, limit_routers: int) -> dict[str, str]:
        """The router's environment for API keys, and read access to exactly the keys' secret.

        `flotilla keys` creates the secret (the stacks do not: a deploy must never reset the keys), so
        its ARN ends in the six random characters Secrets Manager appends, matched by `-??????`
        (Secrets Manager user guide, "Secret ARNs": the suffix keeps a deleted-and-recreated secret's
        grants from carrying over). The secret uses the AWS managed key aws/secretsmanager, for which
        GetSecretValue needs no kms:Decrypt grant of its own (Secrets Manager user guide, "Secret
        encryption and decryption").
        """
        if secret_name is None:
            return {}
        self.task_definition.add_to_task_role_policy(
            iam.PolicyStatement(
                sid="ReadApiKeys",
                actions=["secretsmanager:GetSecretValue"],
                resources=[
                    self.format_arn(
                        service="secretsmanager",
                        resource="secret",
                        resource_name=f"{secret_name}-??????",
                        arn_format=cdk.ArnFormat.COLON_RESOURCE_NAME,
                    )
                ],
            )
        )
        return {
            contract.ENV_API_KEYS_SECRET: secret_name,
            contract.ENV_API_KEYS_TTL: str(ttl_s),
            contract.ENV_LIMIT_ROUTERS: str(limit_routers),
        }

    def _autoscale(self, props: RouterProps) -> None:
        """Target tracking on requests per healthy router target, summed over BOTH target groups.

        The predefined ALBRequestCountPerTarget metric names one target group, and blue/green
        moves production between two; a policy per group would leave the idle group's policy with
        no data, which blocks scale-in. One metric-math policy over both groups follows the live
        one whichever it is.
        """
        blue_target_group, green_target_group = props.blue_target_group, props.green_target_group
        load_balancer_full_name = blue_target_group.first_load_balancer_full_name
        scalable = self.service.auto_scale_task_count(min_capacity=props.desired_count, max_capacity=props.max_count)

        def alb_metric(
            query_id: str, name: str, stat: str, tg
        ) -> appscaling.CfnScalingPolicy.TargetTrackingMetricDataQueryProperty:
            return appscaling.CfnScalingPolicy.TargetTrackingMetricDataQueryProperty(
                id=query_id,
                return_data=False,
                metric_stat=appscaling.CfnScalingPolicy.TargetTrackingMetricStatProperty(
                    stat=stat,
                    metric=appscaling.CfnScalingPolicy.TargetTrackingMetricProperty(
                        namespace="AWS/ApplicationELB",
                        metric_name=name,
                        dimensions=[
                            appscaling.CfnScalingPolicy.TargetTrackingMetricDimensionProperty(
                                name="LoadBalancer", value=load_balancer_full_name
                            ),
                            appscaling.CfnScalingPolicy.TargetTrackingMetricDimensionProperty(
                                name="TargetGroup", value=tg.target_group_full_name
                            ),
                        ],
                    ),
                ),
            )

        self.scaling_policy = appscaling.CfnScalingPolicy(
            self,
            "RequestsPerTarget",
            policy_name="flotilla-router-requests-per-target",
            policy_type="TargetTrackingScaling",
            scaling_target_id=cfn_child(scalable.node.find_child("Target"), appscaling.CfnScalableTarget).ref,
            target_tracking_scaling_policy_configuration=appscaling.CfnScalingPolicy.TargetTrackingScalingPolicyConfigurationProperty(
                target_value=props.requests_per_target_per_minute,
                scale_in_cooldown=300,
                scale_out_cooldown=60,
                customized_metric_specification=appscaling.CfnScalingPolicy.CustomizedMetricSpecificationProperty(
                    metrics=[
                        alb_metric("rb", "RequestCount", "Sum", blue_target_group),
                        alb_metric("rg", "RequestCount", "Sum", green_target_group),
                        alb_metric("hb", "HealthyHostCount", "Average", blue_target_group),
                        alb_metric("hg", "HealthyHostCount", "Average", green_target_group),
                        appscaling.CfnScalingPolicy.TargetTrackingMetricDataQueryProperty(
                            id="perTarget",
                            return_data=True,
                            label="ALB requests per healthy router target (blue + green)",
                            expression="(FILL(rb, 0) + FILL(rg, 0)) / MAX([FILL(hb, 0) + FILL(hg, 0), 1])",
                        ),
                    ],
                ),
            ),
        )

    def _acknowledge_findings(self, image: ecs.ContainerImage) -> None:
        """Each acknowledgement on the exact L1 resource it excuses."""
        acknowledge(
            cfn_child(self.task_definition, ecs.CfnTaskDefinition),
            "ECS2",
            reason=(
                "The router's environment holds only non-secret settings (role, port, Cloud Map "
                "namespace and service names, drain timeout, admission parameter name, the API keys' "
                "secret name); the keys themselves it reads hashed from Secrets Manager at run time, "
                "re-read every TTL so that revocation needs no new task."
            ),
        )
        task_policy = self.task_definition.task_role.node.find_child("DefaultPolicy")
        acknowledge(
            cfn_child(task_policy, iam.CfnPolicy),
            "IAM5",
            applies_to="Resource::*",
            reason=(
                "servicediscovery:DiscoverInstances and DiscoverInstancesRevision support no "
                "resource-level permissions (AWS's own AWSCloudMapDiscoverInstanceAccess policy uses "
                "Resource *); the statement is pinned to flotilla's namespace and its per-cell "
                "services by the servicediscovery:NamespaceName and ServiceName condition keys."
            ),
        )
        if not isinstance(image, ecs.RepositoryImage):
            # An ECR (asset) image: CDK grants ecr:GetAuthorizationToken, which needs Resource *.
            # The role the image made when it bound: "Creates the task execution IAM role if it
            # doesn't already exist" (aws-cdk-lib 2.275, TaskDefinition.obtain_execution_role).
            execution_role = self.task_definition.obtain_execution_role()
            acknowledge(
                cfn_child(execution_role.node.find_child("DefaultPolicy"), iam.CfnPolicy),
                "IAM5",
                applies_to="Resource::*",
                reason=(
                    "ecr:GetAuthorizationToken has no resource-level permissions; image "
                    "pulls are scoped to the router image's repository and log writes "
                    "to this stack's log group."
                ),
            )
        green_role = self.service.node.find_child("GreenTargetRole")
        acknowledge(
            cfn_child(green_role, iam.CfnRole),
            "IAM4",
            applies_to="Policy::arn:<AWS::Partition>:iam::aws:policy/AmazonECSInfrastructureRolePolicyForLoadBalancers",
            reason=(
                "ECS native blue/green needs a role ECS assumes to rewrite the listener rules "
                "and register targets; AmazonECSInfrastructureRolePolicyForLoadBalancers is the "
                "AWS-maintained policy for exactly that and follows new ELB actions ECS needs."
            ),
        )
