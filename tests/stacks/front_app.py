"""Builds the front-door stacks once per test session on the real Network stack, with settings the
tests choose (certificate or not, live target group) independently of the deployment config.

Every test module imports `front_app()`/`template()`, so each variant is synthesized once
(lru_cache), keeping the suite inside its time budget.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import aws_cdk as cdk
from aws_cdk import aws_logs as logs
from synth_helpers import CERTIFICATE_ARN, cdk_json_context

from contract.admission import parameter_name
from contract.apikeys import secret_name
from stacks.discovery import DiscoveryStack
from stacks.front import FrontProps, FrontStack
from stacks.network import NetworkStack
from stacks.observability import ObservabilityProps, ObservabilityStack
from stacks.router import RouterProps, RouterStack

ROUTER_IMAGE = "public.ecr.aws/docker/library/python:3.11-slim"
NAMESPACE = "flotilla.internal"
ADMISSION_PARAMETER = parameter_name("flotilla")
API_KEYS_SECRET = secret_name("flotilla")
CLIENT_CIDR = "203.0.113.0/24"  # TEST-NET-3: the client range the internet-facing variant admits
UNITS_PER_CELL = {"cell0": 2, "cell1": 1}


@dataclass(frozen=True)
class FrontApp:
    app: cdk.App
    network: NetworkStack
    discovery: DiscoveryStack
    front: FrontStack
    observability: ObservabilityStack
    router: RouterStack


def synthesizer() -> cdk.DefaultStackSynthesizer:
    return cdk.DefaultStackSynthesizer(generate_bootstrap_version_rule=False)


def build(
    *,
    certificate_arn: str | None = CERTIFICATE_ARN,
    live_target_group: str = "blue",
    internet_facing: bool = False,
) -> FrontApp:
    # The built-in CloudFormation validation costs ~6 s per app; cfn-lint covers the same templates
    # as the deployment builds them (test_cfn_lint.py).
    app = cdk.App(builtin_cloud_formation_validation=False, context=cdk_json_context())
    network = NetworkStack(
        app, "Network", availability_zones=(), log_retention=logs.RetentionDays.ONE_MONTH, synthesizer=synthesizer()
    )
    vpc = network.vpc
    discovery = DiscoveryStack(
        app,
        "Discovery",
        vpc=vpc,
        router_security_group=network.router_security_group,
        namespace_name=NAMESPACE,
        cells=tuple(UNITS_PER_CELL),
        internet_facing=internet_facing,
        client_cidrs=(CLIENT_CIDR,) if internet_facing else (),
        synthesizer=synthesizer(),
    )
    front = FrontStack(
        app,
        "Front",
        FrontProps(
            vpc=vpc,
            alb_security_group=discovery.alb_security_group,
            certificate_arn=certificate_arn,
            live_target_group=live_target_group,
            internet_facing=internet_facing,
        ),
        synthesizer=synthesizer(),
    )
    observability = ObservabilityStack(
        app,
        "Observability",
        ObservabilityProps(
            load_balancer=front.load_balancer,
            target_groups=[front.blue_target_group, front.green_target_group],
            units_per_cell=UNITS_PER_CELL,
            unit_rollout="surge",
            wave_in_cell=1,
            alarm_email="oncall@example.com",
        ),
        synthesizer=synthesizer(),
    )
    router = RouterStack(
        app,
        "Router",
        RouterProps(
            vpc=vpc,
            router_security_group=network.router_security_group,
            image_uri=ROUTER_IMAGE,
            blue_target_group=front.blue_target_group,
            green_target_group=front.green_target_group,
            production_rule=front.production_rule,
            deployment_alarms=observability.deployment_alarms,
            cloudmap_namespace_name=discovery.namespace_name,
            cloudmap_service_names=discovery.service_names,
            admission_parameter_name=ADMISSION_PARAMETER,
            api_keys_secret_name=API_KEYS_SECRET,
            limit_routers=2,
        ),
        synthesizer=synthesizer(),
    )
    return FrontApp(app, network, discovery, front, observability, router)


@functools.lru_cache(maxsize=None)
def front_app(
    *, certificate_arn: str | None = CERTIFICATE_ARN, live_target_group: str = "blue", internet_facing: bool = False
) -> FrontApp:
    return build(certificate_arn=certificate_arn, live_target_group=live_target_group, internet_facing=internet_facing)


@functools.lru_cache(maxsize=None)
def template(stack_name: str, **kwargs) -> dict:
    fa = front_app(**kwargs)
    stack = {
        "Network": fa.network,
        "Discovery": fa.discovery,
        "Front": fa.front,
        "Observability": fa.observability,
        "Router": fa.router,
    }[stack_name]
    return fa.app.synth().get_stack_by_name(stack.stack_name).template
