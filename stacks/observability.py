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
from contract import scaling
from stacks.config import UNIT_ROLLOUTS

MINUTE = cdk.Duration.minutes(1)
# Units of one cell a node failure may keep out of rotation before its ready-units alarm pages. The
# failed node's unit re-forms by itself (the ASG replaces the instance, ECS starts the task, the
# unit loads the model again): instance launch + task start + model load, about 15 minutes for a
# 10-minute load (ops/rollout_sim.py's StepTimes), longer than the alarm's 10 minutes. Without this
# allowance every node failure would page although nothing needs a person yet; two units of one cell
# out at once, beyond what the rollout takes out, are not what a healthy fleet does.
NODE_FAILURE_UNITS_TOLERATED = 1


def cell_ready_threshold(units: int, *, unit_rollout: str, wave_in_cell: int) -> int:
    """The fewest ready units a cell keeps while it works as designed: its ReadyUnits alarm's
    threshold (it fires below it).

    A correct rollout takes out of rotation: with `replace` (minimum healthy 0 %) one in-cell wave
    (`wave_in_cell` units, contract/rollout.py; fewer if the cell is smaller) for the whole of
    their drain, restart and model load, tens of minutes per wave; with `surge` (minimum healthy
    100 %) none, because ECS stops a unit's old tasks only after the new ones pass their container
    check, which they pass only once the new unit is ready (docs/rollouts.md, rehearsed). Beyond
    that, NODE_FAILURE_UNITS_TOLERATED for a node failure recovering by itself. Never below 1: a
    cell with no ready unit serves nothing, which pages even when a replace wave planned it.
    """
    if unit_rollout not in UNIT_ROLLOUTS:
        raise ValueError(f"unit_rollout={unit_rollout!r}: use one of {', '.join(UNIT_ROLLOUTS)}")
    if units < 1 or wave_in_cell < 1:
        raise ValueError(f"units={units}, wave_in_cell={wave_in_cell}: both at least 1")
    rolling_out = min(wave_in_cell, units) if unit_rollout == "replace" else 0
    return max(1, units - rolling_out - NODE_FAILURE_UNITS_TOLERATED)


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

    `deployment_alarms` are the ones the router's blue/green deployment watches, and they measure
    only what a router revision can break: the 5xx the router causes (the ALB's own 5xx when a
    router crashes, resets or hangs, plus the router's own faults), the latency the router adds, and
    router targets failing their health check. Slow units and shedding (429/503 by design) must not
    roll a healthy router back, so the fleet-wide 5xx rate, the time to first token and the
    ready-unit alarms only page.
    """

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        load_balancer: elbv2.ApplicationLoadBalancer,
        target_groups: Sequence[elbv2.ApplicationTargetGroup],
        units_per_cell: dict[str, int],
        unit_rollout: str,
        wave_in_cell: int,
        alarm_email: str | None = None,
        max_5xx_percent: float = 5.0,
        max_p99_latency: cdk.Duration = cdk.Duration.seconds(10),
        max_router_added_latency: cdk.Duration = cdk.Duration.millis(500),
        min_ready_units: int = 1,
        scaler: bool = False,
        **kwargs,
    ) -> None:
        super().__init__(scope, id_, **kwargs)
        if not 0 < max_5xx_percent < 100:
            raise ValueError(f"max_5xx_percent={max_5xx_percent}: use a percentage between 0 and 100")
        if not 0 < max_router_added_latency.to_milliseconds() < max_p99_latency.to_milliseconds():
            raise ValueError(
                f"max_router_added_latency={max_router_added_latency.to_milliseconds()} ms: use more than 0 and "
                f"less than max_p99_latency ({max_p99_latency.to_milliseconds()} ms)"
            )
        if min_ready_units < 1:
            raise ValueError(f"min_ready_units={min_ready_units}: at least one unit must be ready")
        if not units_per_cell or any(n < 1 for n in units_per_cell.values()):
            raise ValueError(f"units_per_cell={units_per_cell!r}: give every cell id its unit count (>= 1)")
        ready_floor = {
            cell: cell_ready_threshold(count, unit_rollout=unit_rollout, wave_in_cell=wave_in_cell)
            for cell, count in units_per_cell.items()
        }

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

        def percent_of_requests(label: str, counts: dict[str, cw.IMetric]) -> cw.MathExpression:
            """100 * the sum of `counts` / ALB requests, 0 without requests (missing counts are 0)."""
            total = " + ".join(f"FILL({k}, 0)" for k in counts)
            return cw.MathExpression(
                expression=f"IF(req > 0, 100 * ({total}) / req, 0)",
                using_metrics={"req": requests, **counts},
                label=label,
                period=MINUTE,
            )

        five_xx_percent = percent_of_requests("5xx % of requests", {"e5": elb_5xx, "t5": target_5xx})
        # HTTPCode_ELB_5XX_Count: "HTTP 5XX server error codes that originate from the load balancer.
        # This count does not include any response codes generated by the targets" (ALB user guide,
        # CloudWatch metrics for your Application Load Balancer): 502/503/504 when a router crashes,
        # resets, is missing or does not answer. The router's shedding 503s are target codes.
        router_faults = runtime_metric(contract.METRIC_ROUTER_FAULTS, statistic="Sum")
        router_5xx_percent = percent_of_requests(
            "5xx a router caused, % of requests", {"e5": elb_5xx, "rf": router_faults}
        )
        router_added_p99 = runtime_metric(contract.METRIC_ROUTER_ADDED_LATENCY, statistic="p99")
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
            description=f"More than {max_5xx_percent} % of requests answered 5xx (ALB, router or unit, "
            "shedding included) for 3 minutes. Runbook: docs/runbooks/incident-triage.md",
        )
        # Time to first token from the leaders, not the ALB's TargetResponseTime: that is the time to
        # the response headers, which a non-streamed completion sends only when generation ends, so
        # its p99 sits above any first-token bound whenever some requests generate a few hundred tokens.
        self.latency_alarm = alarm(
            "P99Latency",
            runtime_metric(contract.METRIC_TIME_TO_FIRST_TOKEN, statistic="p99"),
            threshold=max_p99_latency.to_milliseconds(),
            operator=cw.ComparisonOperator.GREATER_THAN_THRESHOLD,
            periods=3,
            description=f"p99 time to first token above {max_p99_latency.to_seconds()} s for 3 minutes "
            "(units slow or queued). Runbook: docs/runbooks/incident-triage.md",
        )
        self.router_five_xx_alarm = alarm(
            "RouterFiveXxRate",
            router_5xx_percent,
            threshold=max_5xx_percent,
            operator=cw.ComparisonOperator.GREATER_THAN_THRESHOLD,
            periods=3,
            description=f"More than {max_5xx_percent} % of requests failed because of a router (the ALB's "
            "own 5xx: no router answered; or the router's own faults) for 3 minutes. Rolls a router "
            "deployment back. Runbook: docs/runbooks/rollback.md",
        )
        self.router_latency_alarm = alarm(
            "RouterAddedLatency",
            router_added_p99,
            threshold=max_router_added_latency.to_milliseconds(),
            operator=cw.ComparisonOperator.GREATER_THAN_THRESHOLD,
            periods=3,
            description=f"p99 latency the routers add above {max_router_added_latency.to_milliseconds()} ms "
            "for 3 minutes (the units' own time is not counted). Rolls a router deployment back. "
            "Runbook: docs/runbooks/rollback.md",
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
            self.router_five_xx_alarm,
            self.router_latency_alarm,
            self.unhealthy_targets_alarm,
        ]

        # Per cell, below what the cell keeps during a correct rollout (cell_ready_threshold) for 10
        # minutes: a rollout's own dip, or one node failure recovering, never pages.
        def cell_description(cell: str, count: int) -> str:
            floor = ready_floor[cell]
            if unit_rollout == "replace":
                rollout = (
                    f"a replace rollout takes up to {min(wave_in_cell, count)} of its units out at once "
                    "while they reload"
                )
            else:
                rollout = "a surge rollout keeps every unit in rotation"
            short = "no unit ready" if floor == 1 else f"fewer than {floor} units ready"
            return (
                f"Cell {cell} ({count} units): {short} for 10 minutes. Normal: {rollout}, "
                f"and {NODE_FAILURE_UNITS_TOLERATED} more may be re-forming after a node failure; fewer ready "
                "means units fail to come back or a rollout takes out more than its wave. Runbook: "
                "docs/runbooks/unit-not-ready.md"
            )

        self.cell_ready_alarms: dict[str, cw.Alarm] = {
            cell: alarm(
                f"ReadyUnits{cell.capitalize()}",
                runtime_metric(contract.METRIC_READY_UNITS, statistic="Minimum", cell=cell),
                threshold=ready_floor[cell],
                operator=cw.ComparisonOperator.LESS_THAN_THRESHOLD,
                periods=10,
                description=cell_description(cell, count),
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
        # Routing by cache (docs/routing.md): how often requests reach their key's unit, and how far the
        # busiest unit is above the mean (a hot unit: docs/runbooks/hot-unit.md).
        self.dashboard.add_widgets(
            cw.GraphWidget(
                title="Routing: % of keyed requests to their own unit; busiest unit's load, % of mean (max)",
                width=24,
                left=[runtime_metric(contract.METRIC_ROUTED_TO_PREFERRED, statistic="Average")],
                right=[runtime_metric(contract.METRIC_BUSIEST_UNIT_LOAD, statistic="Maximum")],
            ),
        )
        # Speculative decoding (docs/engine.md): leaders write these only while their engines draft.
        self.dashboard.add_widgets(
            cw.GraphWidget(
                title="Speculative decoding: draft tokens kept (%); tokens per decode step",
                width=24,
                left=[runtime_metric(contract.METRIC_SPEC_ACCEPTANCE, statistic="Average")],
                right=[runtime_metric(contract.METRIC_DECODE_TOKENS_PER_STEP, statistic="Average")],
            ),
        )
        self.dashboard.add_widgets(
            cw.GraphWidget(title="5xx a router caused, % of requests", left=[router_5xx_percent], width=12),
            cw.GraphWidget(title="Latency the routers add (ms): p99", left=[router_added_p99], width=12),
        )
        self.dashboard.add_widgets(
            cw.AlarmStatusWidget(
                title="Alarms",
                width=24,
                alarms=[
                    *self.deployment_alarms,
                    self.five_xx_alarm,
                    self.latency_alarm,
                    self.ready_units_alarm,
                    *self.cell_ready_alarms.values(),
                ],
            ),
        )
        self.scaler_alarms = self._scaler_row(action) if scaler else []
        cdk.CfnOutput(self, "AlarmTopicArn", value=self.topic.topic_arn)
        cdk.CfnOutput(self, "DashboardName", value=self.dashboard.dashboard_name)

    def _scaler_row(self, action: cw_actions.SnsAction) -> list[cw.Alarm]:
        """The scaler's row (docs/scaling.md): units it wants, serving, starting, draining and beyond
        what capacity allows; the routers' requests and 429s; and two alarms: it wants more units than
        capacity allows (the ceiling, or units EC2 could not give), and it stopped deciding."""
        unmet = runtime_metric(scaling.METRIC_UNMET_UNITS, statistic="Maximum")
        passes = runtime_metric(scaling.METRIC_TARGET_UNITS, statistic="SampleCount")

        def page(
            name: str,
            metric: cw.Metric,
            *,
            operator: cw.ComparisonOperator,
            minutes: int,
            missing: cw.TreatMissingData,
            description: str,
        ) -> cw.Alarm:  # noqa: E501
            a = metric.create_alarm(
                self,
                name,
                threshold=1,
                comparison_operator=operator,
                evaluation_periods=minutes,
                datapoints_to_alarm=minutes,
                treat_missing_data=missing,
                alarm_description=description,
            )
            a.add_alarm_action(action)
            a.add_ok_action(action)
            return a

        wants_more = page(
            "ScalerWantsMoreThanCapacity",
            unmet,
            operator=cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            minutes=3,
            missing=cw.TreatMissingData.NOT_BREACHING,
            description="For 3 minutes the scaler wanted more units than capacity allows: the ceiling "
            "(units), or units given back because EC2 had no capacity or a quota. Runbook: "
            "docs/runbooks/scale-for-peak.md",
        )
        # One decision a minute: none for 5 minutes means the function fails or is not scheduled. Missing
        # data breaches here: silence is the failure.
        stopped = page(
            "ScalerNotDeciding",
            passes,
            operator=cw.ComparisonOperator.LESS_THAN_THRESHOLD,
            minutes=5,
            missing=cw.TreatMissingData.BREACHING,
            description="The scaler made no decision for 5 minutes (its function fails or is not "
            "scheduled): the fleet stays at its size. Runbook: docs/runbooks/scale-for-peak.md",
        )
        units = [
            runtime_metric(name, statistic="Maximum")
            for name in (
                scaling.METRIC_TARGET_UNITS,
                scaling.METRIC_ACTIVE_UNITS,
                scaling.METRIC_PENDING_UNITS,
                scaling.METRIC_DRAINING_UNITS,
                scaling.METRIC_UNMET_UNITS,
            )
        ]
        traffic = [runtime_metric(n, statistic="Sum") for n in (scaling.METRIC_REQUESTS, scaling.METRIC_BUSY_REFUSALS)]
        self.dashboard.add_widgets(
            cw.GraphWidget(title="Scaler: units wanted, serving, starting, draining, unmet", left=units, width=12),
            cw.GraphWidget(title="Routers: requests and 429s / min", left=traffic, width=6),
            cw.AlarmStatusWidget(title="Scaler alarms", alarms=[wants_more, stopped], width=6),
        )
        return [wants_more, stopped]
