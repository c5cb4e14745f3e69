"""What the rehearsal takes from a synthesized cloud assembly (cdk.out): each unit's ECS service and
task definition, the DependsOn order between services and the dependencies between stacks.

Only unit services (task environment FLOTILLA_ROLE=node) are rehearsed; the router's blue/green
service is a different deployment controller. Values ECS would default are defaulted here with
the API reference's words.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import contract
from ops.rehearsal import ecs_rules

# Defaults when the template leaves a field out (API_HealthCheck.html / API_ContainerDefinition.html):
# interval "The default value is 30 seconds."; timeout "The default value is 5."; retries "The
# default value is 3."; startPeriod "By default, the startPeriod is off."; stopTimeout "If neither
# ... are set, then the default values of 30 seconds for Linux containers ... are used."
DEFAULT_INTERVAL_S, DEFAULT_TIMEOUT_S, DEFAULT_RETRIES, DEFAULT_START_PERIOD_S = 30.0, 5.0, 3, 0.0
DEFAULT_STOP_TIMEOUT_S = 30.0
# ECS defaults for a service without a DeploymentConfiguration (API_DeploymentConfiguration.html:
# maximumPercent "the default value ... is 200%"; minimumHealthyPercent "the default value ... is 100%").
DEFAULT_MAX_PERCENT, DEFAULT_MIN_HEALTHY_PERCENT = 200, 100

# The health check must be an HTTP GET of a node path on 127.0.0.1:<node port>: the rehearsal does
# that GET itself against the local member's port instead of starting python3 for every check.
_HEALTH_URL = re.compile(r"http://127\.0\.0\.1:(\d+)(/[A-Za-z0-9/_.-]*)")


class TemplateError(ValueError):
    """The cloud assembly cannot be rehearsed; the message names the file or resource and the fix."""


@dataclass(frozen=True)
class HealthCheck:
    command: tuple[str, ...]
    path: str  # the node path the command GETs
    interval_s: float
    timeout_s: float
    retries: int
    start_period_s: float


@dataclass(frozen=True)
class UnitService:
    """One unit's AWS::ECS::Service with its task definition, as ECS will run it."""

    stack: str
    logical_id: str
    unit_id: str
    cell_id: str
    revision: str
    desired_count: int
    min_healthy_percent: int
    max_percent: int
    circuit_breaker: bool
    rollback: bool
    grace_s: float
    depends_on: tuple[str, ...]  # logical ids of unit services of the same stack
    health: HealthCheck
    stop_timeout_s: float
    environment: Mapping[str, str]

    @property
    def drain_timeout_s(self) -> float:
        return float(self.environment.get(contract.ENV_DRAIN_TIMEOUT, "30"))

    @property
    def model_name(self) -> str:
        return self.environment.get(contract.ENV_MODEL_NAME, "model")

    @property
    def max_tasks(self) -> int:
        """Upper bound of RUNNING + PENDING tasks during a deployment."""
        return ecs_rules.max_tasks(self.desired_count, self.max_percent)

    @property
    def min_healthy_tasks(self) -> int:
        """Lower bound of healthy tasks during a deployment."""
        return ecs_rules.min_healthy_tasks(self.desired_count, self.min_healthy_percent)

    @property
    def keeps_serving(self) -> bool:
        """A unit stays in rotation through its rollout only if no old task may stop before the
        new ones are healthy (minimum healthy 100 %); `replace` (0 %) takes it out."""
        return self.min_healthy_tasks >= self.desired_count


@dataclass(frozen=True)
class CellStack:
    name: str
    depends_on: tuple[str, ...]  # other unit stacks this one waits for (directly or through others)
    services: tuple[UnitService, ...]


@dataclass(frozen=True)
class SynthesizedFleet:
    """The fleet as the synthesized templates describe it (cdk.out), not as it runs."""

    source: Path
    stacks: tuple[CellStack, ...] = field(default_factory=tuple)  # each after those it depends on

    @property
    def services(self) -> tuple[UnitService, ...]:
        return tuple(s for stack in self.stacks for s in stack.services)


def _depends(resource: Mapping[str, Any]) -> tuple[str, ...]:
    raw = resource.get("DependsOn", [])
    return (raw,) if isinstance(raw, str) else tuple(raw)


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)) or not str(value).isdigit():
        raise TemplateError(f"{where}={value!r}: expected a literal number (an intrinsic function cannot be rehearsed)")
    return int(value)


def _health(container: Mapping[str, Any], where: str) -> HealthCheck:
    check = container.get("HealthCheck")
    if not check:
        raise TemplateError(f"{where}: the node container has no HealthCheck; the rehearsal needs one to emulate")
    command = tuple(str(c) for c in check.get("Command", ()))
    url = _HEALTH_URL.search(" ".join(command))
    if url is None or int(url.group(1)) != contract.NODE_API_PORT:
        raise TemplateError(
            f"{where}: HealthCheck.Command {list(command)!r} is not an HTTP GET of "
            f"http://127.0.0.1:{contract.NODE_API_PORT}/<path>, which is what the rehearsal can emulate"
        )
    return HealthCheck(
        command=command,
        path=url.group(2),
        interval_s=float(check.get("Interval", DEFAULT_INTERVAL_S)),
        timeout_s=float(check.get("Timeout", DEFAULT_TIMEOUT_S)),
        retries=_int(check.get("Retries", DEFAULT_RETRIES), f"{where}.HealthCheck.Retries"),
        start_period_s=float(check.get("StartPeriod", DEFAULT_START_PERIOD_S)),
    )


def _unit_services(stack: str, template: Mapping[str, Any]) -> tuple[UnitService, ...]:
    resources: Mapping[str, Any] = template.get("Resources", {})
    found: dict[str, UnitService] = {}
    for logical, res in resources.items():
        if res.get("Type") != "AWS::ECS::Service":
            continue
        props = res.get("Properties", {})
        task_ref = props.get("TaskDefinition", {})
        task = resources.get(task_ref.get("Ref", "")) if isinstance(task_ref, dict) else None
        if task is None:
            continue
        containers = task.get("Properties", {}).get("ContainerDefinitions", [])
        node = next((c for c in containers if c.get("Essential", True)), None)
        if node is None:
            continue
        env = {e["Name"]: str(e["Value"]) for e in node.get("Environment", []) if isinstance(e.get("Value"), str)}
        if env.get(contract.ENV_ROLE) != "node":
            continue
        where = f"{stack}/{logical}"
        deploy = props.get("DeploymentConfiguration", {})
        breaker = deploy.get("DeploymentCircuitBreaker", {})
        found[logical] = UnitService(
            stack=stack,
            logical_id=logical,
            unit_id=env.get(contract.ENV_UNIT_ID, logical),
            cell_id=env.get(contract.ENV_CELL_ID, ""),
            revision=env.get(contract.ENV_REVISION, "1"),
            desired_count=_int(props.get("DesiredCount", 1), f"{where}.DesiredCount"),
            min_healthy_percent=_int(
                deploy.get("MinimumHealthyPercent", DEFAULT_MIN_HEALTHY_PERCENT), f"{where}.MinimumHealthyPercent"
            ),
            max_percent=_int(deploy.get("MaximumPercent", DEFAULT_MAX_PERCENT), f"{where}.MaximumPercent"),
            circuit_breaker=bool(breaker.get("Enable", False)),
            rollback=bool(breaker.get("Rollback", False)),
            grace_s=float(props.get("HealthCheckGracePeriodSeconds", 0)),
            depends_on=_depends(res),
            health=_health(node, where),
            stop_timeout_s=float(node.get("StopTimeout", DEFAULT_STOP_TIMEOUT_S)),
            environment=env,
        )
    # Keep only DependsOn between unit services: the rest (cluster, roles) exist before any update.
    return tuple(replace(s, depends_on=tuple(d for d in s.depends_on if d in found)) for s in found.values())


def read_fleet(cdk_out: Path) -> SynthesizedFleet:
    """Every stack with unit services in the cloud assembly at cdk_out, in dependency order."""
    manifest_path = cdk_out / "manifest.json"
    if not manifest_path.is_file():
        raise TemplateError(f"{manifest_path} does not exist: run `make synth` (or cdk synth) first")
    manifest = json.loads(manifest_path.read_text())
    artifacts: Mapping[str, Any] = manifest.get("artifacts", {})
    stacks = {k: v for k, v in artifacts.items() if v.get("type") == "aws:cloudformation:stack"}
    services: dict[str, tuple[UnitService, ...]] = {}
    for artifact_id, art in stacks.items():
        template = json.loads((cdk_out / art["properties"]["templateFile"]).read_text())
        found = _unit_services(artifact_id, template)
        if found:
            services[artifact_id] = found
    if not services:
        raise TemplateError(f"{cdk_out}: no stack has a unit service (an ECS service whose task runs the node)")

    def upstream(artifact_id: str, seen: set[str]) -> set[str]:
        """Unit stacks this stack waits for, through stacks without units too."""
        out: set[str] = set()
        for dep in stacks.get(artifact_id, {}).get("dependencies", []):
            if dep in stacks and dep not in seen:
                seen.add(dep)
                if dep in services:
                    out.add(dep)
                out |= upstream(dep, seen)
        return out

    ordered: list[CellStack] = []
    placed: set[str] = set()
    pending = {sid: upstream(sid, set()) for sid in services}
    while pending:
        ready = sorted(sid for sid, deps in pending.items() if deps <= placed)
        if not ready:
            raise TemplateError(f"{manifest_path}: the unit stacks depend on each other in a cycle: {sorted(pending)}")
        for sid in ready:
            ordered.append(CellStack(name=sid, depends_on=tuple(sorted(pending.pop(sid))), services=services[sid]))
            placed.add(sid)
    return SynthesizedFleet(source=cdk_out, stacks=tuple(ordered))
