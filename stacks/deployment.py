"""Builds every flotilla stack for one FlotillaConfig: Network, then Cell-0..Cell-n in order.

app.py calls build_deployment once; tests call it too, so what they check is what `make synth`
emits. Later stacks (Front, Observability) are added here, after the cells.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import aws_cdk as cdk

from stacks.cell import CellStack
from stacks.config import FlotillaConfig
from stacks.network import NetworkStack
from stacks.retention import retention


@dataclass
class Deployment:
    """Handles on the built stacks, for app.py and the tests."""

    config: FlotillaConfig
    network: NetworkStack
    cells: list[CellStack] = field(default_factory=list)

    @property
    def stacks(self) -> list[cdk.Stack]:
        return [self.network, *self.cells]


def build_deployment(app: cdk.App, config: FlotillaConfig,
                     synthesizer_factory=None) -> Deployment:
    """All stacks of the deployment. synthesizer_factory() -> IStackSynthesizer lets tests drop
    the bootstrap-version rule (moto has no CDK bootstrap stack)."""
    env = cdk.Environment(account=config.account, region=config.region) \
        if (config.account or config.region) else None

    def common(stack_id: str) -> dict:
        kwargs = dict(env=env, stack_name=f"{config.deployment_name}-{stack_id}",
                      description=f"flotilla {config.deployment_name}: {stack_id}")
        if synthesizer_factory is not None:
            kwargs["synthesizer"] = synthesizer_factory()
        return kwargs

    network = NetworkStack(app, "Network", availability_zones=config.availability_zones,
                           log_retention=retention(config.node.log_retention_days),
                           **common("Network"))
    deployment = Deployment(config=config, network=network)
    for cell in range(config.cells):
        stack = CellStack(app, f"Cell-{cell}", cell=cell, config=config, network=network,
                          **common(f"Cell-{cell}"))
        # Deploy cell after cell: a bad revision stops at the first cell it breaks.
        if deployment.cells:
            stack.add_stack_dependency(deployment.cells[-1])
        deployment.cells.append(stack)
    return deployment
