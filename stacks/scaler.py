"""The Scaler stack (only with the config's `scaling` section): the cloud scaler, a Lambda function
that EventBridge runs once a minute (runtime/scaler/aws.py), and one SSM parameter per cell that
holds the cell's desired counts, which the cell stack reads so a deploy writes back what the scaler
set (docs/scaling.md, "Deploys do not fight the scaler"). Deployed before the cells: their stacks
read its parameters.

Why a scheduled function (docs/scaling.md, "Where the scaler runs"): every pass reads its state
from ECS and SSM, so a pass that fails or a new environment forgets nothing (no runaway after a
restart); reserved concurrency 1 means two passes never act at once; it needs no network path to
the units (the routers' reports are in CloudWatch); and it has nothing long-lived to wedge.
"""

from __future__ import annotations

from pathlib import Path

from aws_cdk import ArnFormat, CfnParameter, Duration, Fn, IgnoreMode, RemovalPolicy, Stack, Token
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_ssm as ssm
from constructs import Construct

import contract
from contract import scaling
from stacks.config import FlotillaConfig
from stacks.nag import acknowledge, cfn_child
from stacks.retention import retention
from stacks.scaling_config import fixed_units, start_timeout_s

REPO_ROOT = Path(__file__).resolve().parent.parent
# The function's code: the decision function and its AWS runner, and the contract they import.
# Nothing else of the repository (no torch, no router): the Lambda Python runtime brings boto3.
CODE_EXCLUDE = [
    "*",
    "!contract/",
    "!runtime/__init__.py",
    "!runtime/emf.py",
    "!runtime/scaler/",
    "runtime/scaler/local*.py",
    "**/__pycache__",
    "**/*.pyc",
]
HANDLER = "runtime.scaler.aws.handler"
# The runner's own environment names (runtime/scaler/aws.py reads them).
ENV_CELLS, ENV_UNITS_PER_CELL = "FLOTILLA_CELLS", "FLOTILLA_UNITS_PER_CELL"
ENV_FIXED_UNITS, ENV_START_TIMEOUT = "FLOTILLA_FIXED_UNITS", "FLOTILLA_START_TIMEOUT_S"


def function_name(deployment: str) -> str:
    """Named, so the Observability stack can watch its errors without a cross-stack reference."""
    return f"{deployment}-scaler"


def counts_parameter(deployment: str, cell: int) -> str:
    """runtime/scaler/aws.py counts_parameter: the cell's desired counts (stacks must not import runtime)."""
    return f"{scaling.PARAMETER_PREFIX}{deployment}/{contract.cell_id(cell)}/desired-counts"


def scaled_counts(stack: Stack, *, cell: int, config: FlotillaConfig) -> dict[str, float]:
    """Each scaled unit's desired count in a cell stack: its slot of the cell's counts parameter, read
    through a CloudFormation parameter of type AWS::SSM::Parameter::Value<List<String>>, whose value
    "CloudFormation always fetches ... from Parameter Store when it updates stacks" (CloudFormation
    user guide, systems-manager-parameter-types.html). Empty without scaling; the floor's units and
    the drained ones keep the count the template states."""
    if config.scaling is None:
        return {}
    fixed = set(fixed_units(config))
    units = [p for p in config.units_in_cell(cell) if p.unit_id not in fixed]
    if not units:
        return {}
    counts = CfnParameter(
        stack,
        "DesiredCounts",
        type="AWS::SSM::Parameter::Value<List<String>>",
        default=counts_parameter(config.deployment_name, cell),
        description="the units' desired counts as the scaler keeps them (Scaler stack)",
    )
    return {p.unit_id: Token.as_number(Fn.select(p.index, counts.value_as_list)) for p in units}


class ScalerStack(Stack):
    def __init__(self, scope: Construct, id_: str, *, config: FlotillaConfig, **kwargs) -> None:
        super().__init__(scope, id_, **kwargs)
        assert config.scaling is not None
        dep = config.deployment_name
        # Created once with every slot at 0 and never changed by CloudFormation again (its value does
        # not depend on anything that changes): the scaler owns it from then on.
        self.count_parameters = [
            ssm.StringListParameter(
                self,
                f"DesiredCounts{cell}",
                parameter_name=counts_parameter(dep, cell),
                string_list_value=["0"] * config.units_per_cell,
                description=f"flotilla {dep} {contract.cell_id(cell)}: each unit's desired count, kept by the scaler",
            )
            for cell in range(config.cells)
        ]
        self.log_group = logs.LogGroup(
            self,
            "Logs",
            retention=retention(config.node.log_retention_days),
            removal_policy=RemovalPolicy.DESTROY,
        )
        self.role = iam.Role(
            self,
            "Role",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description=f"flotilla {dep} scaler: read the units' state and load, set their desired counts",
        )
        self.function = lambda_.Function(
            self,
            "Function",
            function_name=function_name(dep),
            runtime=lambda_.Runtime.PYTHON_3_14,
            handler=HANDLER,
            code=lambda_.Code.from_asset(str(REPO_ROOT), exclude=CODE_EXCLUDE, ignore_mode=IgnoreMode.DOCKER),
            role=self.role,
            timeout=Duration.seconds(50),  # within the minute between passes
            memory_size=256,
            # One pass at a time, ever: two would each start the units the other did not see yet.
            reserved_concurrent_executions=1,
            log_group=self.log_group,
            environment={
                scaling.ENV_DEPLOYMENT: dep,
                scaling.ENV_SCALING_POLICY: config.scaling.policy(config.units).dumps(),
                scaling.ENV_NODES_PER_UNIT: str(config.nodes_per_unit),
                ENV_CELLS: str(config.cells),
                ENV_UNITS_PER_CELL: str(config.units_per_cell),
                ENV_FIXED_UNITS: ",".join(fixed_units(config)),
                ENV_START_TIMEOUT: str(start_timeout_s(config)),
            },
            description=f"flotilla {dep}: the scaler's pass (runtime/scaler/aws.py)",
        )
        rule = events.Rule(self, "EveryMinute", schedule=events.Schedule.rate(Duration.minutes(1)))
        # No retry and a short age: a missed pass is replaced by the next one a minute later.
        rule.add_target(targets.LambdaFunction(self.function, retry_attempts=0, max_event_age=Duration.seconds(60)))
        self._grant(config)
        # CDK makes the function depend on its role, which its Role attribute already orders (cfn-lint
        # W3005); only the dependency on the role's policy, which nothing else orders, is kept.
        function_cfn = cfn_child(self.function, lambda_.CfnFunction)
        function_cfn.add_override("DependsOn", [self.get_logical_id(self._policy())])

    def _grant(self, config: FlotillaConfig) -> None:
        """Exactly the calls runtime/scaler/aws.py makes, each on this deployment's resources."""
        dep = config.deployment_name
        clusters = self.format_arn(service="ecs", resource="cluster", resource_name=f"{dep}-cell*")
        services = self.format_arn(service="ecs", resource="service", resource_name=f"{dep}-cell*/*")
        self.role.add_to_policy(
            iam.PolicyStatement(
                sid="ListUnitServices",
                actions=["ecs:ListServices"],
                resources=["*"],
                conditions={"ArnLike": {"ecs:cluster": clusters}},
            )
        )
        self.role.add_to_policy(
            iam.PolicyStatement(
                sid="ReadAndSetUnitServices",
                actions=["ecs:DescribeServices", "ecs:UpdateService"],
                resources=[services],
            )
        )
        router_logs = self.format_arn(
            service="logs",
            resource="log-group",
            resource_name=f"{dep}-Router-Logs*",
            arn_format=ArnFormat.COLON_RESOURCE_NAME,
        )
        any_group = self.format_arn(
            service="logs", resource="log-group", resource_name="*", arn_format=ArnFormat.COLON_RESOURCE_NAME
        )
        self.role.add_to_policy(
            iam.PolicyStatement(sid="FindRouterLogs", actions=["logs:DescribeLogGroups"], resources=[any_group])
        )
        self.role.add_to_policy(
            iam.PolicyStatement(sid="ReadRouterReports", actions=["logs:FilterLogEvents"], resources=[router_logs])
        )
        self.role.add_to_policy(
            iam.PolicyStatement(sid="ReadTrafficMetrics", actions=["cloudwatch:GetMetricData"], resources=["*"])
        )

        def parameter(name: str) -> str:
            return self.format_arn(service="ssm", resource="parameter", resource_name=name.lstrip("/"))

        state = parameter(f"{scaling.PARAMETER_PREFIX}{dep}/scaler-state")
        counts = parameter(counts_parameter(dep, 0).replace(contract.cell_id(0), "cell*"))
        self.role.add_to_policy(
            iam.PolicyStatement(
                sid="ScalerMemoryAndCounts", actions=["ssm:GetParameter", "ssm:PutParameter"], resources=[state, counts]
            )
        )
        self.role.add_to_policy(
            iam.PolicyStatement(
                sid="ReadTemporaryFloor",
                actions=["ssm:GetParameter"],
                resources=[parameter(scaling.parameter_name(dep))],
            )
        )
        # The log group's writes: CDK grants them to the function's role for its own log group.
        self.log_group.grant_write(self.role)
        self._acknowledge(dep)

    def _policy(self) -> iam.CfnPolicy:
        """The role's policy resource (CDK's DefaultPolicy, made by the first grant)."""
        return cfn_child(self.role.node.find_child("DefaultPolicy"), iam.CfnPolicy)

    def _acknowledge(self, dep: str) -> None:
        policy = self._policy()
        acknowledge(
            policy,
            "IAM5",
            applies_to="Resource::*",
            reason=(
                "ecs:ListServices has no resource-level permission (it is conditioned on this deployment's cell "
                "clusters, ecs:cluster); cloudwatch:GetMetricData has none at all (the scaler reads the Flotilla "
                "namespace's traffic and first-token metrics)."
            ),
        )
        for resource, why in (
            (f"Resource::arn:<AWS::Partition>:ecs:<AWS::Region>:<AWS::AccountId>:service/{dep}-cell*/*",
             "the units' services of every cell of this deployment, named by CloudFormation"),
            (f"Resource::arn:<AWS::Partition>:logs:<AWS::Region>:<AWS::AccountId>:log-group:{dep}-Router-Logs*",
             "the Router stack's log group, whose name CloudFormation suffixes"),
            ("Resource::arn:<AWS::Partition>:logs:<AWS::Region>:<AWS::AccountId>:log-group:*",
             "DescribeLogGroups finds the router's log group by its prefix; it reads names only"),
            (f"Resource::arn:<AWS::Partition>:ssm:<AWS::Region>:<AWS::AccountId>:parameter/flotilla/{dep}/cell*/desired-counts",
             "each cell's desired counts, one parameter per cell of this deployment"),
        ):  # fmt: skip
            acknowledge(policy, "IAM5", applies_to=resource, reason=f"Scaler: {why}.")
