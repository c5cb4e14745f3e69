"""Builds every flotilla stack for one FlotillaConfig, in deployment order.

Network -> Discovery -> Cell-0 ... Cell-n (in lanes of cells, config.wave_plan), and Discovery ->
Front -> Observability -> Router.
app.py calls build_deployment once; tests call it too, so what they check is what `make synth`
emits.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import aws_cdk as cdk

import contract
from contract import admission, apikeys
from stacks.cell import CellStack
from stacks.config import FlotillaConfig, cloudmap_quota_warnings, quota_notices
from stacks.discovery import DiscoveryStack
from stacks.front import FrontProps, FrontStack
from stacks.network import NetworkStack
from stacks.observability import ObservabilityProps, ObservabilityStack
from stacks.retention import retention
from stacks.router import RouterProps, RouterStack
from stacks.scaler import ScalerStack
from stacks.scaling_config import floor_per_cell


@dataclass
class Deployment:
    """Handles on the built stacks, for app.py and the tests."""

    config: FlotillaConfig
    network: NetworkStack
    discovery: DiscoveryStack
    cells: list[CellStack] = field(default_factory=list)
    front: FrontStack | None = None
    observability: ObservabilityStack | None = None
    router: RouterStack | None = None
    scaler: ScalerStack | None = None


StackSettings = Callable[[str], dict]  # a stack id -> the keyword settings every stack takes


def build_deployment(app: cdk.App, config: FlotillaConfig, synthesizer_factory=None) -> Deployment:
    """All stacks of the deployment. synthesizer_factory() -> IStackSynthesizer lets tests drop
    the bootstrap-version rule (moto has no CDK bootstrap stack)."""
    env = cdk.Environment(account=config.account, region=config.region) if (config.account or config.region) else None

    def common(stack_id: str) -> dict:
        kwargs = dict(
            env=env,
            stack_name=f"{config.deployment_name}-{stack_id}",
            description=f"flotilla {config.deployment_name}: {stack_id}",
        )
        if synthesizer_factory is not None:
            kwargs["synthesizer"] = synthesizer_factory()
        return kwargs

    # Every resource of the deployment carries its name (cost allocation, console filters).
    cdk.Tags.of(app).add("flotilla:deployment", config.deployment_name)
    network = NetworkStack(
        app,
        "Network",
        availability_zones=config.availability_zones,
        log_retention=retention(config.node.log_retention_days),
        **common("Network"),
    )
    discovery = DiscoveryStack(
        app,
        "Discovery",
        vpc=network.vpc,
        router_security_group=network.router_security_group,
        namespace_name=f"{config.deployment_name}.internal",
        cells=[contract.cell_id(c) for c in range(config.cells)],
        internet_facing=config.front.scheme == "internet-facing",
        client_cidrs=config.front.client_cidrs,
        client_prefix_lists=config.front.client_prefix_lists,
        **common("Discovery"),
    )
    _warn_at_synth(config, network, discovery)
    deployment = Deployment(config=config, network=network, discovery=discovery)
    if config.scaling is not None:
        # Before the cells: their stacks read the counts parameters it creates.
        deployment.scaler = ScalerStack(app, "Scaler", config=config, **common("Scaler"))
    _add_cells(app, deployment, common)
    front = deployment.front = _front(app, deployment, common)
    # Between Front (its alarms read the ALB's metrics) and Router (which needs the alarms at
    # construction to roll back on them, aws/aws-cdk#36308).
    observability = deployment.observability = _observability(app, deployment.config, front, common)
    deployment.router = _router(app, deployment, front, observability, common)
    return deployment


def _warn_at_synth(config: FlotillaConfig, network: NetworkStack, discovery: DiscoveryStack) -> None:
    """What synth tells the operator about the config: quotas to raise, AZs to name, a surge the
    reservation cannot hold, Cloud Map limits."""
    # Adjustable quotas: a synth warning with the number to request when AWS's default is too
    # small or set per account (hard limits fail in stacks/config.py instead); info otherwise.
    for notice in quota_notices(config):
        annotations = cdk.Annotations.of(network)
        if notice.worth_a_warning:
            annotations.add_warning_v2(f"flotilla:quota:{notice.key}", notice.message())
        else:
            annotations.add_info(notice.message())
    if not config.availability_zones:
        # Fn::GetAZs gives the region's first AZs whatever they offer, and a unit's group has one
        # subnet, so it cannot fall back to another AZ; changing the list later replaces the subnets
        # other stacks import, which CloudFormation refuses.
        cdk.Annotations.of(network).add_warning_v2(
            "flotilla:default-azs",
            f"availability_zones is empty: the VPC takes the region's first three AZs whether "
            f"{config.instance_type} is offered there or not, and changing them later needs a new deployment. "
            f"Name the AZs of your capacity: aws ec2 describe-instance-type-offerings --location-type "
            f"availability-zone --filters Name=instance-type,Values={config.instance_type}",
        )
    reserved = config.capacity.reservation_id or config.capacity.reservation_group_arn
    if reserved and config.unit_rollout == "surge":
        peak = config.units * config.max_nodes_per_unit
        cdk.Annotations.of(network).add_warning_v2(
            "flotilla:reservation-surge",
            f"unit_rollout surge with a reservation: a rollout needs up to {peak:,} {config.instance_type} "
            f"instances ({config.units * config.nodes_per_unit:,} serving plus as many for the new revision); "
            "a reservation or Capacity Block sized for the fleet holds half, and the new revision waits for "
            "capacity. Use unit_rollout: replace, or reserve the surge",
        )
    for n, warning in enumerate(cloudmap_quota_warnings(config)):
        cdk.Annotations.of(discovery).add_warning_v2(f"flotilla:cloudmap-quota-{n}", warning)


def _add_cells(app: cdk.App, deployment: Deployment, common: StackSettings) -> None:
    config, network, discovery = deployment.config, deployment.network, deployment.discovery
    for cell in range(config.cells):
        stack = CellStack(
            app,
            f"Cell-{cell}",
            cell=cell,
            config=config,
            network=network,
            discovery=discovery,
            **common(f"Cell-{cell}"),
        )
        # Cells roll in lanes: Cell-n waits for Cell-(n - parallel_cells), so `cdk deploy
        # --concurrency parallel_cells` ("Maximum number of simultaneous deployments (dependency
        # permitting)", cdk deploy --help, CLI 2.1148.1) rolls that many cells side by side within
        # the wave budget; after a failed stack the CLI starts no other (its WorkGraph skips the
        # rest), so a bad revision stops at the first cell it breaks (config.wave_plan).
        if deployment.scaler is not None:
            stack.add_stack_dependency(deployment.scaler)
        after = config.wave_plan.cell_after(cell)
        if after is not None:
            stack.add_stack_dependency(deployment.cells[after])
        deployment.cells.append(stack)


def _front(app: cdk.App, deployment: Deployment, common: StackSettings) -> FrontStack:
    config, network, discovery = deployment.config, deployment.network, deployment.discovery
    router = config.router
    return FrontStack(
        app,
        "Front",
        FrontProps(
            vpc=network.vpc,
            alb_security_group=discovery.alb_security_group,
            certificate_arn=config.certificate_arn,
            live_target_group=router.live_target_group,
            internet_facing=config.front.scheme == "internet-facing",
            deployment_name=config.deployment_name,
            waf_requests_per_5_min=config.front.waf_requests_per_5_min,
            waf_blocked_body_rules=config.front.waf_blocked_body_rules,
            waf_log_retention=retention(config.node.log_retention_days),
            privatelink_principals=config.front.privatelink_principals,
            privatelink_private_dns_name=config.front.privatelink_private_dns_name,
        ),
        **common("Front"),
    )


def _observability(
    app: cdk.App, config: FlotillaConfig, front: FrontStack, common: StackSettings
) -> ObservabilityStack:
    return ObservabilityStack(
        app,
        "Observability",
        ObservabilityProps(
            load_balancer=front.load_balancer,
            target_groups=[front.blue_target_group, front.green_target_group],
            # With the scaler, a cell is expected to keep only its share of the floor ready.
            units_per_cell=floor_per_cell(config)
            if config.scaling is not None
            else {contract.cell_id(c): len(config.units_in_cell(c)) for c in range(config.cells)},
            scaler=config.scaling is not None,
            # The per-cell ready-units alarms allow what a rollout of these settings takes out.
            unit_rollout=config.unit_rollout,
            wave_in_cell=config.wave_plan.wave_in_cell,
            alarm_email=config.alarm_email,
        ),
        **common("Observability"),
    )


def _router(
    app: cdk.App,
    deployment: Deployment,
    front: FrontStack,
    observability: ObservabilityStack,
    common: StackSettings,
) -> RouterStack:
    config, network, discovery, router = (
        deployment.config,
        deployment.network,
        deployment.discovery,
        deployment.config.router,
    )
    return RouterStack(
        app,
        "Router",
        RouterProps(
            vpc=network.vpc,
            router_security_group=network.router_security_group,
            image_uri=config.image,
            blue_target_group=front.blue_target_group,
            green_target_group=front.green_target_group,
            production_rule=front.production_rule,
            deployment_alarms=observability.deployment_alarms,
            cloudmap_namespace_name=discovery.namespace_name,
            cloudmap_service_names=discovery.service_names,
            admission_parameter_name=admission.parameter_name(config.deployment_name),
            balance=router.balance,
            desired_count=router.desired_count,
            max_count=router.max_count,
            cpu=router.cpu,
            memory_mib=router.memory_mib,
            bake_time=cdk.Duration.minutes(router.bake_time_minutes),
            api_keys_secret_name=apikeys.secret_name(config.deployment_name) if config.front.api_keys else None,
            api_keys_ttl_s=config.front.api_keys_ttl_s,
            # Each router takes 1/n of every key's limits; n is the router count the tier runs at
            # (its autoscaling minimum): docs/runbooks/api-keys.md states the bound when it scales out.
            limit_routers=router.desired_count,
        ),
        **common("Router"),
    )
