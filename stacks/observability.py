"""Observability: the fleet dashboard, the alarms, and the SNS topic that pages.

Deployed after Front (the alarms read the ALB's and target groups' metrics) and before the router
service, which receives `deployment_alarms` at construction and rolls back when one fires. Runtime
metrics (TTFT, tokens, ready units) arrive as EMF log lines under contract.METRICS_NAMESPACE.
"""

from __future__ import annotations

from collections.abc import Sequence

import aws_cdk as cdk
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_elasticloadbalancingv2 as elbv2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subs
from constructs import Construct

import contract

MINUTE = cdk.Duration.minutes(1)


def runtime_metric(name: str, *, statistic: str, cell: str | None = None, period: cdk.Duration = MINUTE) -> cw.Metric:
    """A metric the runtime emits as EMF: fleet-wide (Service only) or for one cell."""
    dimensions = {contract.METRIC_DIM_SERVICE: contract.METRIC_SERVICE_VALUE}
    if cell is not None:
        dimensions[contract.METRIC_DIM_CELL] = cell
    return cw.Metric(
        namespace=contract.METRICS_NAMESPACE,
        metric_name=name,
        dimensions_map=dimensions,
        statistic=statistic,
        period=period,
    )


class ObservabilityStack(cdk.Stack):
    """Dashboard + alarms + encrypted SNS topic.

    `deployment_alarms` (5xx rate, p99 latency, unhealthy router targets) are the ones the router's
    blue/green deployment watches: what a router revision can break. The ready-unit alarms (fleet
    and per cell) only page: units still loading on a first deploy, or rolling to a new revision,
    would otherwise roll back a healthy router.
    """

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        load_balancer: elbv2.ApplicationLoadBalancer,
        target_groups: Sequence[elbv2.ApplicationTargetGroup],
        units_per_cell: dict[str, int],
        alarm_email: str | None = None,
        max_5xx_percent: float = 5.0,
        max_p99_latency: cdk.Duration = cdk.Duration.seconds(10),
        min_ready_units: int = 1,
        **kwargs,
    ) -> None:
        super().__init__(scope, id_, **kwargs)
        if not 0 < max_5xx_percent < 100:
            raise ValueError(f"max_5xx_percent={max_5xx_percent}: use a percentage between 0 and 100")
        if min_ready_units < 1:
            raise ValueError(f"min_ready_units={min_ready_units}: at least one unit must be ready")
        if not units_per_cell or any(n < 1 for n in units_per_cell.values()):
            raise ValueError(f"units_per_cell={units_per_cell!r}: give every cell id its unit count (>= 1)")

        key = kms.Key(self, "AlarmTopicKey", enable_key_rotation=True, description="flotilla alarm topic encryption")
        # CloudWatch must be able to publish to the encrypted topic.
        key.add_to_resource_policy(
            iam.PolicyStatement(
                actions=["kms:Decrypt", "kms:GenerateDataKey*"],
                principals=[iam.ServicePrincipal("cloudwatch.amazonaws.com")],
                resources=["*"],
                conditions={"StringEquals": {"aws:SourceAccount": self.account}},
            )
        )
        self.topic = sns.Topic(self, "AlarmTopic", display_name="flotilla alarms", master_key=key, enforce_ssl=True)
        if alarm_email:
            self.topic.add_subscription(subs.EmailSubscription(alarm_email))
        action = cw_actions.SnsAction(self.topic)

        alb = load_balancer.metrics
        requests = alb.request_count(period=MINUTE, statistic="Sum")
        elb_5xx = alb.http_code_elb(elbv2.HttpCodeElb.ELB_5XX_COUNT, period=MINUTE, statistic="Sum")
        target_5xx = alb.http_code_target(elbv2.HttpCodeTarget.TARGET_5XX_COUNT, period=MINUTE, statistic="Sum")
        five_xx_percent = cw.MathExpression(
            expression="IF(req > 0, 100 * (FILL(e5, 0) + FILL(t5, 0)) / req, 0)",
            using_metrics={"req": requests, "e5": elb_5xx, "t5": target_5xx},
            label="5xx % of requests",
            period=MINUTE,
        )
        p99 = alb.target_response_time(period=MINUTE, statistic="p99")
        p50 = alb.target_response_time(period=MINUTE, statistic="p50")
        unhealthy = cw.MathExpression(
            expression=" + ".join(f"FILL(u{i}, 0)" for i in range(len(target_groups))),
            using_metrics={
                f"u{i}": tg.metrics.unhealthy_host_count(period=MINUTE, statistic="Maximum")
                for i, tg in enumerate(target_groups)
            },
            label="unhealthy router targets",
            period=MINUTE,
        )
        healthy = cw.MathExpression(
            expression=" + ".join(f"FILL(h{i}, 0)" for i in range(len(target_groups))),
            using_metrics={
                f"h{i}": tg.metrics.healthy_host_count(period=MINUTE, statistic="Minimum")
                for i, tg in enumerate(target_groups)
            },
            label="healthy router targets",
            period=MINUTE,
        )

        def alarm(
            name: str,
            metric: cw.IMetric,
            *,
            threshold: float,
            operator: cw.ComparisonOperator,
            periods: int,
            description: str,
        ) -> cw.Alarm:
            a = metric.create_alarm(
                self,
                name,
                threshold=threshold,
                comparison_operator=operator,
                evaluation_periods=periods,
                datapoints_to_alarm=periods,
                # Quiet until there is traffic or a router reporting: a first deploy starts with no
                # data, and ECS must not roll that deployment back for it.
                treat_missing_data=cw.TreatMissingData.NOT_BREACHING,
                alarm_description=description,
            )
            a.add_alarm_action(action)
            a.add_ok_action(action)
            return a

        self.five_xx_alarm = alarm(
            "FiveXxRate",
            five_xx_percent,
            threshold=max_5xx_percent,
            operator=cw.ComparisonOperator.GREATER_THAN_THRESHOLD,
            periods=3,
            description=f"More than {max_5xx_percent} % of requests answered 5xx (ALB or router) "
            "for 3 minutes. Runbook: docs/runbooks/rollback.md",
        )
        self.latency_alarm = alarm(
            "P99Latency",
            p99,
            threshold=max_p99_latency.to_seconds(),
            operator=cw.ComparisonOperator.GREATER_THAN_THRESHOLD,
            periods=3,
            description=f"p99 time to response headers above {max_p99_latency.to_seconds()} s for 3 "
            "minutes. Runbook: docs/runbooks/rollback.md",
        )
        self.unhealthy_targets_alarm = alarm(
            "UnhealthyRouterTargets",
            unhealthy,
            threshold=1,
            operator=cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            periods=3,
            description="At least one router task failed the ALB health check for 3 minutes "
            "(blue or green target group).",
        )
        fleet_ready = runtime_metric(contract.METRIC_READY_UNITS, statistic="Minimum")
        self.ready_units_alarm = alarm(
            "FleetReadyUnits",
            fleet_ready,
            threshold=min_ready_units,
            operator=cw.ComparisonOperator.LESS_THAN_THRESHOLD,
            periods=3,
            description=f"Some router saw fewer than {min_ready_units} ready units for 3 minutes "
            "(Minimum across routers: a new router that cannot discover units fires it).",
        )
        # ECS rolls a deployment back when any of its alarms is in ALARM during it
        # (https://docs.aws.amazon.com/AmazonECS/latest/developerguide/deployment-alarm-failure.html),
        # whatever the cause: only alarms a router revision can set off belong here.
        self.deployment_alarms: list[cw.Alarm] = [
            self.five_xx_alarm,
            self.latency_alarm,
            self.unhealthy_targets_alarm,
        ]
        # A unit reloading its model after a rollout is briefly not ready; page only when a cell
        # stays short for 10 minutes.
        self.cell_ready_alarms: dict[str, cw.Alarm] = {
            cell: alarm(
                f"ReadyUnits{cell.capitalize()}",
                runtime_metric(contract.METRIC_READY_UNITS, statistic="Minimum", cell=cell),
                threshold=count,
                operator=cw.ComparisonOperator.LESS_THAN_THRESHOLD,
                periods=10,
                description=f"Cell {cell}: fewer than {count} ready units for 10 minutes.",
            )
            for cell, count in units_per_cell.items()
        }

        ttft = {s: runtime_metric(contract.METRIC_TIME_TO_FIRST_TOKEN, statistic=s) for s in ("p50", "p99")}
        tokens_per_second = cw.MathExpression(
            expression="FILL(tok, 0) / PERIOD(tok)",
            using_metrics={"tok": runtime_metric(contract.METRIC_OUTPUT_TOKENS, statistic="Sum")},
            label="output tokens/s (fleet)",
            period=MINUTE,
        )
        self.dashboard = cw.Dashboard(self, "Dashboard", default_interval=cdk.Duration.hours(3))
        self.dashboard.add_widgets(
            cw.GraphWidget(title="Requests / min", left=[requests], width=8),
            cw.GraphWidget(
                title="4xx / 5xx / min",
                width=8,
                left=[
                    alb.http_code_elb(elbv2.HttpCodeElb.ELB_4XX_COUNT, period=MINUTE, statistic="Sum"),
                    alb.http_code_target(elbv2.HttpCodeTarget.TARGET_4XX_COUNT, period=MINUTE, statistic="Sum"),
                    elb_5xx,
                    target_5xx,
                ],
            ),
            cw.GraphWidget(
                title="5xx % of requests",
                left=[five_xx_percent],
                width=8,
                left_annotations=[cw.HorizontalAnnotation(value=max_5xx_percent)],
            ),
        )
        self.dashboard.add_widgets(
            cw.GraphWidget(title="Latency to response headers (s): p50, p99", left=[p50, p99], width=8),
            cw.GraphWidget(title="Time to first token (ms): p50, p99", left=list(ttft.values()), width=8),
            cw.GraphWidget(title="Output tokens / s", left=[tokens_per_second], width=8),
        )
        self.dashboard.add_widgets(
            cw.GraphWidget(
                title="Ready units per cell (minimum over routers)",
                width=12,
                left=[runtime_metric(contract.METRIC_READY_UNITS, statistic="Minimum", cell=c) for c in units_per_cell],
            ),
            cw.GraphWidget(title="Router targets: healthy / unhealthy", left=[healthy, unhealthy], width=12),
        )
        self.dashboard.add_widgets(
            cw.AlarmStatusWidget(
                title="Alarms",
                width=24,
                alarms=[*self.deployment_alarms, self.ready_units_alarm, *self.cell_ready_alarms.values()],
            ),
        )
        cdk.CfnOutput(self, "AlarmTopicArn", value=self.topic.topic_arn)
        cdk.CfnOutput(self, "DashboardName", value=self.dashboard.dashboard_name)
