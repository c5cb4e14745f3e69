"""Observability: the fleet dashboard, the alarms, and the SNS topic that pages.

Deployed after Front (the alarms read the ALB's and target groups' metrics) and before the router
service, which receives `deployment_alarms` at construction and rolls back when one fires. Runtime
metrics (TTFT, tokens, ready units) arrive as EMF log lines under contract.METRICS_NAMESPACE.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

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


@dataclass(frozen=True, kw_only=True)
class ObservabilityProps:
    """What the dashboard and alarms watch (Front's load balancer and the router's target groups), the
    cells and their unit counts, the rollout whose dip the per-cell alarms allow, and the thresholds."""

    load_balancer: elbv2.ApplicationLoadBalancer
    target_groups: Sequence[elbv2.ApplicationTargetGroup]
    units_per_cell: Mapping[str, int]  # cell id -> the units it is expected to keep ready
    unit_rollout: str
    wave_in_cell: int
    alarm_email: str | None = None
    max_5xx_percent: float = 5.0
    max_p99_latency: cdk.Duration = cdk.Duration.seconds(10)
    max_router_added_latency: cdk.Duration = cdk.Duration.millis(500)
    min_ready_units: int = 1
    scaler: bool = False  # the Scaler stack is deployed: add its row and alarms

    def __post_init__(self) -> None:
        if not 0 < self.max_5xx_percent < 100:
            raise ValueError(f"max_5xx_percent={self.max_5xx_percent}: use a percentage between 0 and 100")
        added_ms, p99_ms = self.max_router_added_latency.to_milliseconds(), self.max_p99_latency.to_milliseconds()
        if not 0 < added_ms < p99_ms:
            raise ValueError(
                f"max_router_added_latency={added_ms} ms: use more than 0 and less than max_p99_latency ({p99_ms} ms)"
            )
        if self.min_ready_units < 1:
            raise ValueError(f"min_ready_units={self.min_ready_units}: at least one unit must be ready")
        if not self.units_per_cell or any(n < 1 for n in self.units_per_cell.values()):
            raise ValueError(f"units_per_cell={self.units_per_cell!r}: give every cell id its unit count (>= 1)")
        _ = self.ready_floor  # cell_ready_threshold refuses a bad unit_rollout or wave_in_cell

    @property
    def ready_floor(self) -> dict[str, int]:
        """Each cell's ReadyUnits alarm threshold (cell_ready_threshold)."""
        return {
            cell: cell_ready_threshold(count, unit_rollout=self.unit_rollout, wave_in_cell=self.wave_in_cell)
            for cell, count in self.units_per_cell.items()
        }


@dataclass(frozen=True)
class _FleetMetrics:
    """The load balancer's and the runtime's series that both the alarms and the dashboard read."""

    alb: elbv2.IApplicationLoadBalancerMetrics
    requests: cw.Metric
    elb_5xx: cw.Metric
    target_5xx: cw.Metric
    five_xx_percent: cw.MathExpression
    router_5xx_percent: cw.MathExpression
    router_added_p99: cw.Metric
    healthy: cw.MathExpression
    unhealthy: cw.MathExpression

    @classmethod
    def of(cls, props: ObservabilityProps) -> _FleetMetrics:
        alb = props.load_balancer.metrics
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

        def over_target_groups(label: str, prefix: str, metric) -> cw.MathExpression:
            """The sum of one target-group metric over the blue and green groups (missing is 0)."""
            return cw.MathExpression(
                expression=" + ".join(f"FILL({prefix}{i}, 0)" for i in range(len(props.target_groups))),
                using_metrics={f"{prefix}{i}": metric(tg) for i, tg in enumerate(props.target_groups)},
                label=label,
                period=MINUTE,
            )

        # HTTPCode_ELB_5XX_Count: "HTTP 5XX server error codes that originate from the load balancer.
        # This count does not include any response codes generated by the targets" (ALB user guide,
        # CloudWatch metrics for your Application Load Balancer): 502/503/504 when a router crashes,
        # resets, is missing or does not answer. The router's shedding 503s are target codes.
        router_faults = runtime_metric(contract.METRIC_ROUTER_FAULTS, statistic="Sum")
        return cls(
            alb=alb,
            requests=requests,
            elb_5xx=elb_5xx,
            target_5xx=target_5xx,
            five_xx_percent=percent_of_requests("5xx % of requests", {"e5": elb_5xx, "t5": target_5xx}),
            router_5xx_percent=percent_of_requests(
                "5xx a router caused, % of requests", {"e5": elb_5xx, "rf": router_faults}
            ),
            router_added_p99=runtime_metric(contract.METRIC_ROUTER_ADDED_LATENCY, statistic="p99"),
            healthy=over_target_groups(
                "healthy router targets",
                "h",
                lambda tg: tg.metrics.healthy_host_count(period=MINUTE, statistic="Minimum"),
            ),
            unhealthy=over_target_groups(
                "unhealthy router targets",
                "u",
                lambda tg: tg.metrics.unhealthy_host_count(period=MINUTE, statistic="Maximum"),
            ),
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

    def __init__(self, scope: Construct, id_: str, props: ObservabilityProps, **kwargs) -> None:
        super().__init__(scope, id_, **kwargs)
        self._alarm_topic(props)
        metrics = _FleetMetrics.of(props)
        self._fleet_alarms(props, metrics)
        self._cell_alarms(props)
        self._dashboard(props, metrics)
        self.scaler_alarms = self._scaler_row() if props.scaler else []
        cdk.CfnOutput(self, "AlarmTopicArn", value=self.topic.topic_arn)
        cdk.CfnOutput(self, "DashboardName", value=self.dashboard.dashboard_name)

    def _alarm_topic(self, props: ObservabilityProps) -> None:
        """The encrypted SNS topic every alarm pages, on alarm and on recovery."""
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
        if props.alarm_email:
            self.topic.add_subscription(subs.EmailSubscription(props.alarm_email))
        self._page = cw_actions.SnsAction(self.topic)

    def _alarm(
        self,
        name: str,
        metric: cw.Metric | cw.MathExpression,
        *,
        threshold: float,
        operator: cw.ComparisonOperator,
        periods: int,
        description: str,
        missing: cw.TreatMissingData = cw.TreatMissingData.NOT_BREACHING,
    ) -> cw.Alarm:
        """An alarm that pages the topic when it fires and when it recovers. Missing data does not
        breach unless said: a first deploy starts with no traffic and no router reporting, and ECS
        must not roll that deployment back for it."""
        a = metric.create_alarm(
            self,
            name,
            threshold=threshold,
            comparison_operator=operator,
            evaluation_periods=periods,
            datapoints_to_alarm=periods,
            treat_missing_data=missing,
            alarm_description=description,
        )
        a.add_alarm_action(self._page)
        a.add_ok_action(self._page)
        return a

    def _fleet_alarms(self, props: ObservabilityProps, m: _FleetMetrics) -> None:
        """The fleet-wide alarms, and of them the router's deployment alarms."""
        self.five_xx_alarm = self._alarm(
            "FiveXxRate",
            m.five_xx_percent,
            threshold=props.max_5xx_percent,
            operator=cw.ComparisonOperator.GREATER_THAN_THRESHOLD,
            periods=3,
            description=f"More than {props.max_5xx_percent} % of requests answered 5xx (ALB, router or unit, "
            "shedding included) for 3 minutes. Runbook: docs/runbooks/incident-triage.md",
        )
        # Time to first token from the leaders, not the ALB's TargetResponseTime: that is the time to
        # the response headers, which a non-streamed completion sends only when generation ends, so
        # its p99 sits above any first-token bound whenever some requests generate a few hundred tokens.
        self.latency_alarm = self._alarm(
            "P99Latency",
            runtime_metric(contract.METRIC_TIME_TO_FIRST_TOKEN, statistic="p99"),
            threshold=props.max_p99_latency.to_milliseconds(),
            operator=cw.ComparisonOperator.GREATER_THAN_THRESHOLD,
            periods=3,
            description=f"p99 time to first token above {props.max_p99_latency.to_seconds()} s for 3 minutes "
            "(units slow or queued). Runbook: docs/runbooks/incident-triage.md",
        )
        self.router_five_xx_alarm = self._alarm(
            "RouterFiveXxRate",
            m.router_5xx_percent,
            threshold=props.max_5xx_percent,
            operator=cw.ComparisonOperator.GREATER_THAN_THRESHOLD,
            periods=3,
            description=f"More than {props.max_5xx_percent} % of requests failed because of a router (the ALB's "
            "own 5xx: no router answered; or the router's own faults) for 3 minutes. Rolls a router "
            "deployment back. Runbook: docs/runbooks/rollback.md",
        )
        self.router_latency_alarm = self._alarm(
            "RouterAddedLatency",
            m.router_added_p99,
            threshold=props.max_router_added_latency.to_milliseconds(),
            operator=cw.ComparisonOperator.GREATER_THAN_THRESHOLD,
            periods=3,
            description=f"p99 latency the routers add above {props.max_router_added_latency.to_milliseconds()} ms "
            "for 3 minutes (the units' own time is not counted). Rolls a router deployment back. "
            "Runbook: docs/runbooks/rollback.md",
        )
        self.unhealthy_targets_alarm = self._alarm(
            "UnhealthyRouterTargets",
            m.unhealthy,
            threshold=1,
            operator=cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            periods=3,
            description="At least one router task failed the ALB health check for 3 minutes "
            "(blue or green target group).",
        )
        self.ready_units_alarm = self._alarm(
            "FleetReadyUnits",
            runtime_metric(contract.METRIC_READY_UNITS, statistic="Minimum"),
            threshold=props.min_ready_units,
            operator=cw.ComparisonOperator.LESS_THAN_THRESHOLD,
            periods=3,
            description=f"Some router saw fewer than {props.min_ready_units} ready units for 3 minutes "
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

    def _cell_alarms(self, props: ObservabilityProps) -> None:
        """Per cell, below what the cell keeps during a correct rollout (cell_ready_threshold) for 10
        minutes: a rollout's own dip, or one node failure recovering, never pages."""
        ready_floor = props.ready_floor

        def cell_description(cell: str, count: int) -> str:
            floor = ready_floor[cell]
            if props.unit_rollout == "replace":
                rollout = (
                    f"a replace rollout takes up to {min(props.wave_in_cell, count)} of its units out at once "
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
            cell: self._alarm(
                f"ReadyUnits{cell.capitalize()}",
                runtime_metric(contract.METRIC_READY_UNITS, statistic="Minimum", cell=cell),
                threshold=ready_floor[cell],
                operator=cw.ComparisonOperator.LESS_THAN_THRESHOLD,
                periods=10,
                description=cell_description(cell, count),
            )
            for cell, count in props.units_per_cell.items()
        }

    def _dashboard(self, props: ObservabilityProps, m: _FleetMetrics) -> None:
        """The fleet dashboard: traffic and errors, latency and throughput, readiness, routing,
        speculation, the router's own health, and every alarm's state."""
        ttft = {s: runtime_metric(contract.METRIC_TIME_TO_FIRST_TOKEN, statistic=s) for s in ("p50", "p99")}
        tokens_per_second = cw.MathExpression(
            expression="FILL(tok, 0) / PERIOD(tok)",
            using_metrics={"tok": runtime_metric(contract.METRIC_OUTPUT_TOKENS, statistic="Sum")},
            label="output tokens/s (fleet)",
            period=MINUTE,
        )
        p99 = m.alb.target_response_time(period=MINUTE, statistic="p99")
        p50 = m.alb.target_response_time(period=MINUTE, statistic="p50")
        self.dashboard = cw.Dashboard(self, "Dashboard", default_interval=cdk.Duration.hours(3))
        self.dashboard.add_widgets(
            cw.GraphWidget(title="Requests / min", left=[m.requests], width=8),
            cw.GraphWidget(
                title="4xx / 5xx / min",
                width=8,
                left=[
                    m.alb.http_code_elb(elbv2.HttpCodeElb.ELB_4XX_COUNT, period=MINUTE, statistic="Sum"),
                    m.alb.http_code_target(elbv2.HttpCodeTarget.TARGET_4XX_COUNT, period=MINUTE, statistic="Sum"),
                    m.elb_5xx,
                    m.target_5xx,
                ],
            ),
            cw.GraphWidget(
                title="5xx % of requests",
                left=[m.five_xx_percent],
                width=8,
                left_annotations=[cw.HorizontalAnnotation(value=props.max_5xx_percent)],
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
                left=[
                    runtime_metric(contract.METRIC_READY_UNITS, statistic="Minimum", cell=c)
                    for c in props.units_per_cell
                ],
            ),
            cw.GraphWidget(title="Router targets: healthy / unhealthy", left=[m.healthy, m.unhealthy], width=12),
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
            cw.GraphWidget(title="5xx a router caused, % of requests", left=[m.router_5xx_percent], width=12),
            cw.GraphWidget(title="Latency the routers add (ms): p99", left=[m.router_added_p99], width=12),
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

    def _scaler_row(self) -> list[cw.Alarm]:
        """The scaler's row (docs/scaling.md): units it wants, serving, starting, draining and beyond
        what capacity allows; the routers' requests and 429s; and two alarms: it wants more units than
        capacity allows (the ceiling, or units EC2 could not give), and it stopped deciding."""
        unmet = runtime_metric(scaling.METRIC_UNMET_UNITS, statistic="Maximum")
        passes = runtime_metric(scaling.METRIC_TARGET_UNITS, statistic="SampleCount")

        wants_more = self._alarm(
            "ScalerWantsMoreThanCapacity",
            unmet,
            threshold=1,
            operator=cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            periods=3,
            missing=cw.TreatMissingData.NOT_BREACHING,
            description="For 3 minutes the scaler wanted more units than capacity allows: the ceiling "
            "(units), or units given back because EC2 had no capacity or a quota. Runbook: "
            "docs/runbooks/scale-for-peak.md",
        )
        # One decision a minute: none for 5 minutes means the function fails or is not scheduled. Missing
        # data breaches here: silence is the failure.
        stopped = self._alarm(
            "ScalerNotDeciding",
            passes,
            threshold=1,
            operator=cw.ComparisonOperator.LESS_THAN_THRESHOLD,
            periods=5,
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
