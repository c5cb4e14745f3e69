"""The scaler in AWS: a Lambda function that EventBridge runs once a minute (stacks/scaler.py), with
reserved concurrency 1 so two passes never act at once. Each run is one pass: it reads the units'
ECS services, their load and the traffic (aws_signals.py), calls decide(), and starts or drains whole
units by their ECS services' desired count (all of a unit's nodes or none: one service per unit).

- Draining is ECS's own: desired count 0 makes ECS send SIGTERM to every task of the unit, its
  leader hands its streams over through the routers (docs/node.md), and the capacity provider
  releases the instances once no task runs on them (managed scaling and termination protection).
- A unit that does not serve within `start_timeout` of being started (EC2 had no capacity, a quota,
  a task that never forms) is given back whole: desired count 0, reported with the service's last
  event, and not started again for GIVEN_BACK_S.
- Units below the configured floor have their desired count stated in the template and are never
  changed here. Every other unit's count is mirrored, per cell, into an SSM StringList parameter
  the cell stack reads as its desired counts, so a `cdk deploy` writes back what the scaler set
  rather than resetting it (docs/scaling.md, "Deploys do not fight the scaler").
- What a pass remembers (when it last added and removed, units starting and given back) is in an
  SSM parameter, so a new Lambda environment picks up where the last one stopped.
Each pass writes one JSON log line (event scaler_decision) with EMF metrics for the dashboard.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

import contract
from contract import scaling
from contract.scaling import ScalingError, ScalingPolicy, TemporaryFloor
from runtime import emf
from runtime.scaler import aws_signals
from runtime.scaler.decide import Decision, ScalerMemory, decide
from runtime.scaler.signals import FleetSignals, UnitLoad

GIVEN_BACK_S = 900.0  # a unit given back is not started again for this long
ENV_CELLS = "FLOTILLA_CELLS"
ENV_UNITS_PER_CELL = "FLOTILLA_UNITS_PER_CELL"
ENV_FIXED_UNITS = "FLOTILLA_FIXED_UNITS"  # comma-separated: the floor's units and the config's drained ones
ENV_START_TIMEOUT = "FLOTILLA_START_TIMEOUT_S"


@dataclass(frozen=True)
class Settings:
    deployment: str
    cells: int
    units_per_cell: int
    nodes_per_unit: int
    fixed: frozenset[str]  # units whose count the template states: never started or drained here
    policy: ScalingPolicy
    start_timeout_s: float

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        policy = ScalingPolicy.loads(env[scaling.ENV_SCALING_POLICY])
        return cls(
            deployment=env[scaling.ENV_DEPLOYMENT],
            cells=int(env[ENV_CELLS]),
            units_per_cell=int(env[ENV_UNITS_PER_CELL]),
            nodes_per_unit=int(env[scaling.ENV_NODES_PER_UNIT]),
            fixed=frozenset(u for u in env.get(ENV_FIXED_UNITS, "").split(",") if u),
            policy=policy,
            start_timeout_s=float(env.get(ENV_START_TIMEOUT) or 3 * policy.cold_start_s),
        )

    @property
    def state_parameter(self) -> str:
        return f"{scaling.PARAMETER_PREFIX}{self.deployment}/scaler-state"

    def counts_parameter(self, cell: int) -> str:
        return counts_parameter(self.deployment, cell)


def counts_parameter(deployment: str, cell: int) -> str:
    """The cell's desired counts (StringList, one entry per unit slot of the cell), which its stack
    reads through a CloudFormation parameter of type AWS::SSM::Parameter::Value<List<String>>."""
    return f"{scaling.PARAMETER_PREFIX}{deployment}/{contract.cell_id(cell)}/desired-counts"


@dataclass
class State:
    memory: ScalerMemory = field(default_factory=ScalerMemory)
    starting: dict[str, float] = field(default_factory=dict)  # unit -> when this scaler started it
    given_back: dict[str, dict[str, Any]] = field(default_factory=dict)  # unit -> {at, why}

    def dumps(self) -> str:
        return json.dumps(
            {"memory": self.memory.to_json(), "starting": self.starting, "given_back": self.given_back},
            separators=(",", ":"),
        )

    @classmethod
    def loads(cls, text: str | None) -> State:
        try:
            doc = json.loads(text) if text else {}
        except ValueError:
            doc = {}
        return cls(
            memory=ScalerMemory.from_json(doc.get("memory")),
            starting={k: float(v) for k, v in (doc.get("starting") or {}).items()},
            given_back=dict(doc.get("given_back") or {}),
        )


def _parameter(ssm: Any, name: str) -> str | None:
    try:
        return str(ssm.get_parameter(Name=name)["Parameter"]["Value"])
    except ssm.exceptions.ParameterNotFound:
        return None


def temporary_floor(ssm: Any, deployment: str) -> TemporaryFloor | None:
    """`flotilla scale floor`'s value; one that does not parse is ignored (and said in the log)."""
    text = _parameter(ssm, scaling.parameter_name(deployment))
    if not text:
        return None
    try:
        return TemporaryFloor.loads(text)
    except ScalingError as err:
        print(json.dumps({"event": "scaler_floor_unreadable", "error": str(err)}), flush=True)
        return None


@dataclass
class Fleet:
    """The units as this pass sees them."""

    services: dict[str, aws_signals.UnitService]
    loads: list[UnitLoad] = field(default_factory=list)
    active: list[str] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    draining: list[str] = field(default_factory=list)
    unreported: list[str] = field(default_factory=list)
    off: list[str] = field(default_factory=list)
    give_back: dict[str, str] = field(default_factory=dict)  # unit -> why


def classify(
    services: dict[str, aws_signals.UnitService], reports: Mapping[str, Mapping[str, Any]], state: State,
    settings: Settings, now: float,
) -> Fleet:  # fmt: skip
    fleet = Fleet(services)
    for unit_id, svc in sorted(services.items(), key=lambda kv: kv[1].order):
        report = reports.get(unit_id)
        if svc.desired == 0:
            (fleet.draining if svc.running else fleet.off).append(unit_id)
        elif report is not None and report.get("routable"):
            fleet.active.append(unit_id)
            fleet.loads.append(UnitLoad.from_report(unit_id, report))
            state.starting.pop(unit_id, None)
        elif unit_id in state.starting and now - state.starting[unit_id] > settings.start_timeout_s:
            why = svc.event or f"{svc.running} of {svc.desired} tasks running"
            fleet.give_back[unit_id] = f"not serving {now - state.starting[unit_id]:.0f} s after it started: {why}"
        elif report is None and svc.running >= svc.desired and unit_id not in state.starting:
            fleet.unreported.append(unit_id)  # serving before, no router says so now
        else:
            fleet.pending.append(unit_id)
    return fleet


def signals(fleet: Fleet, traffic: Any, state: State, now: float) -> FleetSignals:
    recent = sum(1 for g in state.given_back.values() if now - float(g.get("at", 0)) < GIVEN_BACK_S)
    return FleetSignals(
        now_s=now,
        active=tuple(fleet.loads),
        pending=len(fleet.pending),
        draining=len(fleet.draining),
        traffic=traffic,
        unavailable=recent,
        unreported=len(fleet.unreported),
    )


def plan(d: Decision, fleet: Fleet, state: State, settings: Settings, now: float) -> dict[str, int]:
    """Desired counts to set: the units to start (lowest first, none of the fixed or recently given
    back), the units to drain (the least loaded of those the scaler may drain), the units given back."""
    changes: dict[str, int] = {u: 0 for u in fleet.give_back}
    blocked = {u for u, g in state.given_back.items() if now - float(g.get("at", 0)) < GIVEN_BACK_S}
    startable = [u for u in fleet.off if u not in settings.fixed and u not in blocked]
    for unit_id in startable[: d.add]:
        changes[unit_id] = settings.nodes_per_unit
    loads = {u.unit: u.running + u.queue_depth for u in fleet.loads}
    drainable = sorted((u for u in fleet.active if u not in settings.fixed), key=lambda u: (loads.get(u, 0), u))
    for unit_id in drainable[: len(d.remove)]:
        changes[unit_id] = 0
    return changes


def apply(clients: Any, changes: dict[str, int], fleet: Fleet, state: State, now: float) -> None:
    for unit_id, count in changes.items():
        svc = fleet.services[unit_id]
        clients.ecs.update_service(cluster=svc.cluster, service=svc.arn, desiredCount=count)
        if unit_id in fleet.give_back:
            state.given_back[unit_id] = {"at": now, "why": fleet.give_back[unit_id][:300]}
            state.starting.pop(unit_id, None)
            print(json.dumps({"event": "unit_given_back", "unit": unit_id, "why": fleet.give_back[unit_id]}))
        elif count:
            state.starting[unit_id] = now
    state.given_back = {u: g for u, g in state.given_back.items() if now - float(g.get("at", 0)) < GIVEN_BACK_S}


def mirror(clients: Any, settings: Settings, services: dict[str, aws_signals.UnitService], changes: dict) -> None:
    """Each cell's desired counts as they now are, into its SSM parameter, when they changed."""
    for cell in range(settings.cells):
        counts = ["0"] * settings.units_per_cell
        for unit_id, svc in services.items():
            c, index = svc.order
            if c == cell and index < settings.units_per_cell:
                counts[index] = str(changes.get(unit_id, svc.desired))
        name, value = settings.counts_parameter(cell), ",".join(counts)
        if _parameter(clients.ssm, name) != value:
            clients.ssm.put_parameter(Name=name, Value=value, Type="StringList", Overwrite=True)


def record(d: Decision, changes: dict[str, int], fleet: Fleet, policy: ScalingPolicy) -> str:
    """The pass as one log line: the decision, what was changed, the range it worked in (what
    `flotilla scale show` prints), and the scaler's metrics (EMF)."""
    metrics = {
        scaling.METRIC_TARGET_UNITS: (d.target, emf.COUNT),
        scaling.METRIC_ACTIVE_UNITS: (d.active, emf.COUNT),
        scaling.METRIC_PENDING_UNITS: (d.pending, emf.COUNT),
        scaling.METRIC_DRAINING_UNITS: (d.draining, emf.COUNT),
        scaling.METRIC_UNMET_UNITS: (d.unmet, emf.COUNT),
    }
    doc = d.record()
    properties = {
        "event": scaling.DECISION_EVENT,
        **{k: doc[k] for k in ("rule", "reason", "direction", "wanted", "minimum", "add", "remove")},
        "changed": changes,
        "given_back": fleet.give_back,
        "floor": policy.floor,
        "ceiling": policy.ceiling,
        "scheduled": [e.to_json() for e in policy.schedule],
        "temporary_floor": json.loads(policy.temporary_floor.dumps()) if policy.temporary_floor else None,
    }
    return emf.emf_line(metrics, timestamp_s=d.now_s, properties=properties)


class Clients:
    """The boto3 clients a pass uses (created on first use; tests pass moto's)."""

    def __init__(self, **clients: Any) -> None:
        self._made = dict(clients)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name not in self._made:
            import boto3  # noqa: PLC0415 - the Lambda runtime provides it; the decision code needs none

            self._made[name] = boto3.client(name)
        return self._made[name]


def run_pass(clients: Any, settings: Settings, now: float | None = None) -> Decision:
    now = time.time() if now is None else now
    state = State.loads(_parameter(clients.ssm, settings.state_parameter))
    services = aws_signals.unit_services(clients.ecs, settings.deployment, settings.cells)
    group = aws_signals.router_log_group(clients.logs, settings.deployment)
    reports = aws_signals.unit_reports(clients.logs, group, now) if group else {}
    traffic = aws_signals.traffic(clients.cloudwatch, now, settings.policy.predict_window_s)
    fleet = classify(services, reports, state, settings, now)
    policy = settings.policy.with_temporary_floor(temporary_floor(clients.ssm, settings.deployment))
    d = decide(signals(fleet, traffic, state, now), policy, state.memory)
    changes = plan(d, fleet, state, settings, now)
    apply(clients, changes, fleet, state, now)
    mirror(clients, settings, services, changes)
    state.memory = d.memory
    clients.ssm.put_parameter(Name=settings.state_parameter, Value=state.dumps(), Type="String", Overwrite=True)
    print(record(d, changes, fleet, policy), flush=True)
    return d


def handler(event: Any, context: Any) -> dict[str, Any]:  # noqa: ARG001 - the Lambda signature
    d = run_pass(Clients(), Settings.from_env(os.environ))
    return {"rule": d.rule, "target": d.target, "add": d.add, "remove": len(d.remove), "unmet": d.unmet}
