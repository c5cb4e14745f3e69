"""A discrete-event model (SimPy) of a whole fleet rolling to a new revision under load.

Units x nodes, waves laid out as the stacks lay them out (contract/rollout.py), surge or replace,
a model-load time distribution, node failures during the roll and a traffic level; it reports the
rollout's duration, the fewest units in rotation, the time spent below the floor and the requests
shed. `flotilla plan` uses it to recommend a wave size; docs/benchmarks.md has its table.

Where each step's time comes from (StepTimes): the ECS timers are the templates' (health-check
interval 30 s, stop timeout 120 s, drain 100 s); the order of the steps, and that a unit's old
tasks stop only once its new ones pass their container health check, are what the ECS rehearsal
(ops/rehearsal, emulating the documented scheduler rules) shows; hardware times (instance start,
image start, model load) are inputs, because nothing here runs on Trainium.
"""

from __future__ import annotations

import math
import random
from collections.abc import Generator, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import simpy

from contract import MAX_UNITS_PER_CELL
from contract.rollout import WavePlan, default_units_per_wave, plan_waves

ROLLOUTS = ("surge", "replace")


@dataclass(frozen=True)
class StepTimes:
    """Seconds each step of one unit's rollout takes on AWS (the sources are on each field)."""

    # Surge only: the capacity provider scales the unit's ASG out for the new tasks. trn1 instance
    # launch and ECS registration: not measurable here; take yours from the ASG's activity history.
    instance_start_s: float = 240.0
    # Task start: image pull (GBs for the Neuron image, cached after the first pull on an instance)
    # and container start. An input for the same reason.
    task_start_s: float = 60.0
    # From ready to the first passing container check: the node's settle (FLOTILLA_READY_SETTLE_S,
    # 2 s) plus the wait for the next check, uniform within the interval (template: 30 s; Docker
    # runs a check every interval, the rehearsal's "HEALTHY" events land that way).
    settle_s: float = 2.0
    check_interval_s: float = 30.0
    # The old unit's drain: in-flight requests finish (node.drain_timeout_s = 100 s bounds it, the
    # stop timeout 120 s kills after it). A typical request's length, not the bound.
    drain_s: float = 20.0
    # CloudFormation noticing a service is steady and starting the services that depend on it.
    # Not documented; the rehearsal has none. An input.
    cfn_step_s: float = 30.0


@dataclass(frozen=True)
class FleetModel:
    units: int
    nodes_per_unit: int
    units_per_cell: int = MAX_UNITS_PER_CELL
    rollout: str = "surge"
    units_per_wave: int | None = None  # None: the stacks' default (about 10 %)
    concurrency: int | None = None  # cdk deploy --concurrency; None: the plan's parallel cells
    load_s: float = 600.0  # mean model-load time of a unit
    load_spread: float = 0.2  # load times are uniform in mean x (1 +/- spread)
    node_failures_per_node_day: float = 0.0  # how often a node fails (Poisson), fleet-wide during the roll
    traffic: float = 0.8  # demand as a share of the whole fleet's capacity (0..1+)
    unit_rps: float = 1.0  # requests/s one unit serves
    steps: StepTimes = field(default_factory=StepTimes)

    def __post_init__(self) -> None:
        if self.rollout not in ROLLOUTS:
            raise ValueError(f"rollout={self.rollout!r}: use one of {', '.join(ROLLOUTS)}")
        if self.units < 1 or self.nodes_per_unit < 1:
            raise ValueError(f"units={self.units}, nodes_per_unit={self.nodes_per_unit}: both at least 1")
        if self.load_s < 0 or not 0 <= self.load_spread < 1:
            raise ValueError(f"load_s={self.load_s}, load_spread={self.load_spread}: load_s >= 0, spread in [0, 1)")

    @property
    def waves(self) -> WavePlan:
        return plan_waves(self.units, self.units_per_cell, self.units_per_wave)

    @property
    def floor(self) -> int:
        """Units a failure-free rollout keeps in rotation: all (surge) or all but one wave (replace)."""
        return self.units if self.rollout == "surge" else self.units - self.waves.most_units_at_once


@dataclass(frozen=True)
class Result:
    duration_s: float
    min_in_rotation: int
    below_floor_s: float
    shed_requests: float
    demand_requests: float  # requests that arrived during the rollout
    node_failures: int
    units_per_wave: int

    @property
    def shed_share(self) -> float:
        return self.shed_requests / self.demand_requests if self.demand_requests else 0.0


class _Fleet:
    """Units in rotation over time, and the demand it fails to meet."""

    def __init__(self, env: simpy.Environment, model: FleetModel) -> None:
        self.env, self.m = env, model
        self.in_rotation = model.units
        self.min_in_rotation = model.units
        self.below_floor_s = 0.0
        self.shed = 0.0
        self._since = 0.0

    def _account(self) -> None:
        dt = self.env.now - self._since
        self._since = self.env.now
        if self.in_rotation < self.m.floor:
            self.below_floor_s += dt
        demand = self.m.traffic * self.m.units * self.m.unit_rps
        self.shed += max(0.0, demand - self.in_rotation * self.m.unit_rps) * dt

    def change(self, delta: int) -> None:
        self._account()
        self.in_rotation += delta
        self.min_in_rotation = min(self.min_in_rotation, self.in_rotation)


@dataclass
class _Unit:
    name: str
    loading_until: float = 0.0  # when a formation in progress becomes ready (failures push it)
    failed_until: float = 0.0  # an old unit out of rotation after a node failure


def _load_time(m: FleetModel, rng: random.Random) -> float:
    return m.load_s * (1 + rng.uniform(-m.load_spread, m.load_spread))


def _unit_rollout(
    env: simpy.Environment, m: FleetModel, fleet: _Fleet, unit: _Unit, rng: random.Random
) -> Generator[simpy.Event, Any, None]:
    s = m.steps
    if m.rollout == "replace":
        # minimum healthy 0 %: every old task stops first; the unit leaves rotation at once.
        fleet.change(-1)
        yield env.timeout(s.drain_s)
        start = s.task_start_s
    else:
        start = s.instance_start_s + s.task_start_s
    unit.loading_until = env.now + start + _load_time(m, rng)
    while env.now < unit.loading_until:  # a node failure during loading pushes loading_until
        yield env.timeout(unit.loading_until - env.now)
    unit.loading_until = 0.0
    fleet.change(+1)  # the new formation is ready: the router routes to it (surge: beside the old one)
    # The first passing container check: settle, then the next check inside the interval.
    yield env.timeout(s.settle_s + rng.uniform(0, s.check_interval_s))
    if m.rollout == "surge":
        fleet.change(-1)  # ECS stops the old tasks now: the old unit drains out of rotation
        yield env.timeout(s.drain_s)


def _node_failures(
    env: simpy.Environment, m: FleetModel, fleet: _Fleet, units: list[_Unit], rng: random.Random, count: list[int]
) -> Generator[simpy.Event, Any, None]:
    rate = m.node_failures_per_node_day * m.units * m.nodes_per_unit / 86400.0
    while rate > 0:
        yield env.timeout(rng.expovariate(rate))
        count[0] += 1
        unit = rng.choice(units)
        # The unit re-forms with a replacement node: a new instance, then the model loads again.
        outage = m.steps.instance_start_s + m.steps.task_start_s + _load_time(m, rng)
        if unit.loading_until > env.now:
            unit.loading_until = env.now + outage  # a formation in progress starts over
        elif unit.failed_until <= env.now:
            unit.failed_until = env.now + outage
            fleet.change(-1)
            env.process(_recover(env, fleet, unit))


def _recover(env: simpy.Environment, fleet: _Fleet, unit: _Unit) -> Generator[simpy.Event, Any, None]:
    yield env.timeout(unit.failed_until - env.now)
    fleet.change(+1)


def _cells(m: FleetModel) -> list[list[list[int]]]:
    """Per cell, its in-cell waves of global unit indexes."""
    plan = m.waves
    out: list[list[list[int]]] = []
    for cell in range(plan.cells):
        first = cell * m.units_per_cell
        units = list(range(first, first + plan.units_in_cell(cell)))
        out.append([units[i : i + plan.wave_in_cell] for i in range(0, len(units), plan.wave_in_cell)])
    return out


def simulate(model: FleetModel, *, seed: int = 0) -> Result:
    """One rollout of the whole fleet; deterministic for a seed."""
    rng = random.Random(seed)
    env = simpy.Environment()
    fleet = _Fleet(env, model)
    units = [_Unit(f"unit{i}") for i in range(model.units)]
    plan = model.waves
    lanes = model.concurrency or plan.parallel_cells
    stack_slots = simpy.Resource(env, capacity=lanes)
    cells = _cells(model)
    cell_done = [env.event() for _ in cells]
    failures = [0]

    def cell_stack(c: int) -> Generator[simpy.Event, Any, None]:
        after = plan.cell_after(c)
        if after is not None:
            yield cell_done[after]
        with stack_slots.request() as slot:  # cdk deploy --concurrency
            yield slot
            for wave in cells[c]:
                yield env.all_of([env.process(_unit_rollout(env, model, fleet, units[u], rng)) for u in wave])
                yield env.timeout(model.steps.cfn_step_s)
        cell_done[c].succeed()

    env.process(_node_failures(env, model, fleet, units, rng, failures))
    done = env.all_of([env.process(cell_stack(c)) for c in range(len(cells))])
    env.run(until=done)
    fleet.change(0)  # account up to the end
    return Result(
        duration_s=env.now,
        min_in_rotation=fleet.min_in_rotation,
        below_floor_s=fleet.below_floor_s,
        shed_requests=fleet.shed,
        demand_requests=model.traffic * model.units * model.unit_rps * env.now,
        node_failures=failures[0],
        units_per_wave=plan.units_per_wave,
    )


@dataclass(frozen=True)
class Summary:
    """Several seeds of one model: the mean duration, the worst of the rest."""

    model: FleetModel
    runs: int
    duration_s: float
    min_in_rotation: int
    below_floor_s: float
    shed_requests: float
    shed_share: float
    node_failures: float  # mean per rollout

    @property
    def units_per_wave(self) -> int:
        return self.model.waves.units_per_wave


def summarize(model: FleetModel, seeds: Iterable[int] = range(5)) -> Summary:
    results = [simulate(model, seed=s) for s in seeds]
    return Summary(
        model=model,
        runs=len(results),
        duration_s=sum(r.duration_s for r in results) / len(results),
        min_in_rotation=min(r.min_in_rotation for r in results),
        below_floor_s=max(r.below_floor_s for r in results),
        shed_requests=max(r.shed_requests for r in results),
        shed_share=max(r.shed_share for r in results),
        node_failures=sum(r.node_failures for r in results) / len(results),
    )


def candidate_waves(units: int) -> list[int]:
    """Wave sizes worth comparing: one unit, the default, and steps around it."""
    default = default_units_per_wave(units)
    out = {1, default, max(1, default // 2), min(units, default * 2), min(units, math.ceil(units * 0.2))}
    return sorted(out)


@dataclass(frozen=True)
class Recommendation:
    units_per_wave: int
    why: str
    table: tuple[Summary, ...]


def recommend_wave(
    model: FleetModel,
    *,
    spare_nodes: int | None = None,
    seeds: Iterable[int] = range(5),
    also: Iterable[int] = (),
) -> Recommendation:
    """The largest candidate wave (the fastest rollout) that sheds no request in any seed, keeps
    surge's extra instances within spare_nodes, and is no larger than the default (about 10 %):
    a revision that serves wrong answers reaches one wave before anyone can stop it. `also`: wave
    sizes simulated beside the candidates (a config's current setting), and eligible like them."""
    seeds = list(seeds)
    waves = sorted(set(candidate_waves(model.units)) | {w for w in also if 1 <= w <= model.units})
    table = tuple(summarize(replace(model, units_per_wave=w), seeds) for w in waves)
    cap = default_units_per_wave(model.units)
    fits = [
        s
        for s in table
        if s.shed_requests == 0
        and s.units_per_wave <= cap
        and (model.rollout != "surge" or spare_nodes is None or s.units_per_wave * model.nodes_per_unit <= spare_nodes)
    ]
    if fits:
        best = max(fits, key=lambda s: s.units_per_wave)
        why = f"the largest wave up to the default ({cap}) that shed no request in {len(seeds)} simulated rollouts" + (
            f" within {spare_nodes} spare nodes" if model.rollout == "surge" and spare_nodes is not None else ""
        )
        return Recommendation(best.units_per_wave, why, table)
    least = min(table, key=lambda s: (s.shed_requests, -s.units_per_wave))
    return Recommendation(
        least.units_per_wave,
        "every wave size sheds requests at this traffic level: add units (headroom) or use surge; "
        "this one sheds the fewest",
        table,
    )


@dataclass(frozen=True)
class Calibration:
    """What a rehearsal measured of the steps this model times by ECS's timers (emulated seconds)."""

    handovers: int  # surge units whose new formation entered rotation before the old one left
    check_phase_s: tuple[float, ...]  # per handover: old left - new entered - settle
    interval_s: float  # the templates' health-check interval the phase is drawn from

    @property
    def mean_check_phase_s(self) -> float:
        return sum(self.check_phase_s) / len(self.check_phase_s) if self.check_phase_s else 0.0


def calibrate(rotation: list[tuple[float, int]], *, settle_s: float, interval_s: float) -> Calibration:
    """From a rehearsal's rotation timeline (emulated s, units in rotation per change) of a surge
    rollout one unit at a time: each rise (the new unit ready) followed by a fall (ECS stopped the
    old unit after the new one's first passing check). The model draws that delay as settle +
    uniform(0, interval); the measured phases (delay - settle) should lie in [0, interval] with a
    mean near interval / 2. settle_s: the rehearsal's settle in emulated seconds (real / scale)."""
    phases = [
        t_down - t_up - settle_s
        for (_, before), (t_up, up), (t_down, down) in zip(rotation, rotation[1:], rotation[2:])
        if up == before + 1 and down == up - 1
    ]
    return Calibration(handovers=len(phases), check_phase_s=tuple(phases), interval_s=interval_s)
