"""Overload at fleet scale: N routers in front of M units offered more than they can serve, with the
shipped policy (a full unit refuses at once with 429 and stays in rotation) against the former one (a
full unit held a request for its queue timeout, answered 503, and every router that saw the 503
took the unit out of rotation).

Run: `python -m bench.fleet.policy_sim --scenario overload` (the table goes to docs/benchmarks.md,
Overload); tests/router/test_router_overload_sim.py runs it small in `make test`.

The model runs the code the fleet runs: the router's unit choice (runtime/router/balance.py), its
"full" test and Retry-After (runtime/router/overload.py), and the leader's wait estimate
(runtime/node/queue_wait.py). Each choice below is a stated assumption, not a measurement:
- A unit has `slots` batch slots; a request waits in the unit's FIFO queue for a slot, then holds it
  for its service time. Service times are lognormal (mean `service_mean_s`, coefficient of variation
  `service_cv`), cut into decode steps of `step_s`; a request's max_tokens is its real length times a
  uniform factor in [1, `max_tokens_slack`] (clients ask for more than they get). Arrivals are Poisson
  at `load` x capacity (units x slots / mean service time) for `duration_s`; each reaches one of the
  routers at random. Network hops take no time.
- A router knows each unit's load as of its last watch line (at most `report_s` old) plus its own
  requests since; it tries up to `max_attempts` units while nothing has reached the client.
- `behaviour="shed"` (shipped): the leader refuses at once (429) a request whose expected wait is past
  `queue_timeout_s` and reports that wait; routers skip full units and answer 429 at once when all are.
  A request the estimate let in that still waits out the timeout gets 429 then. No unit leaves rotation.
- `behaviour="eject"` (former): the leader admits everything; past `queue_timeout_s` in its queue a
  request gets 503, and the router that got it marks the unit unroutable. The unit's watch then sends
  only load lines (its state never changed), so the mark stays: for the rest of the run here. A router
  with no routable unit answers 503 no_unit_ready.
Refused requests are not retried by their clients: the offered load stays as stated.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import simpy

from runtime.node.queue_wait import QueueWait
from runtime.router import balance, overload
from runtime.router.settings import RouterSettings

BEHAVIOURS = ("shed", "eject")
_DEFAULTS = RouterSettings.model_fields


@dataclass(frozen=True)
class OverloadParams:
    routers: int = 10
    units: int = 100
    slots: int = 16  # the node's default --max-running
    load: float = 1.2
    service_mean_s: float = 20.0  # a 600-token answer at 30 tokens/s
    service_cv: float = 1.0
    step_s: float = 1 / 30
    max_tokens_slack: float = 2.0
    report_s: float = 0.05
    base_load: float = 0.9  # offered for ramp_s before the overload, so it starts from a busy fleet
    ramp_s: float = 120.0
    duration_s: float = 60.0  # seconds of overload
    queue_timeout_s: float = 25.0  # the node's default (FLOTILLA_QUEUE_TIMEOUT_S)
    max_attempts: int = int(_DEFAULTS["max_attempts"].default)
    max_queue_depth: int = int(_DEFAULTS["max_queue_depth"].default)
    max_outstanding_per_unit: int = int(_DEFAULTS["max_outstanding_per_unit"].default)
    seed: int = 1


class _View:
    """One router's view of one unit: the report it last read plus its own requests in flight."""

    __slots__ = (
        "index",
        "in_flight",
        "queue_depth",
        "running",
        "kv_cache_used",
        "wait_s",
        "queue_timeout_s",
        "outstanding",
        "outstanding_at_report",
        "routable",
        "read_at",
    )

    def __init__(self, index: int) -> None:
        self.index = index
        self.in_flight = self.queue_depth = self.running = 0
        self.kv_cache_used = self.wait_s = self.queue_timeout_s = 0.0
        self.outstanding = self.outstanding_at_report = 0
        self.routable = True
        self.read_at = -1.0


class _Unit:
    __slots__ = ("slots", "wait", "history")

    def __init__(self, env: simpy.Environment, p: OverloadParams) -> None:
        self.slots = simpy.Resource(env, capacity=p.slots)
        self.wait = QueueWait()  # the leader's own estimate, fed as the API layer feeds it
        # (time, queue_depth, running, wait_s) after each change: what a watch line said then
        self.history: list[tuple[float, int, int, float]] = [(0.0, 0, 0, 0.0)]


def run(p: OverloadParams, behaviour: str) -> dict[str, float]:
    if behaviour not in BEHAVIOURS:
        raise ValueError(f"behaviour {behaviour!r}: one of {', '.join(BEHAVIOURS)}")
    shed = behaviour == "shed"
    env = simpy.Environment()
    rng = random.Random(p.seed)
    pick_rng = random.Random(p.seed + 7)
    units = [_Unit(env, p) for _ in range(p.units)]
    views = [[_View(u) for u in range(p.units)] for _ in range(p.routers)]
    phase = [[rng.random() * p.report_s for _ in range(p.units)] for _ in range(p.routers)]
    served_slot_s = 0.0
    told: list[float] = []  # seconds from arrival to a refusal
    waits: list[float] = []  # queue waits of served requests
    counts = {"served": 0, "refused_429": 0, "refused_503": 0, "no_unit_ready": 0}  # arrivals in the overload
    overload_end = p.ramp_s + p.duration_s
    in_rotation_at_end: list[int] = []

    def sample_rotation():
        yield env.timeout(overload_end)
        in_rotation_at_end.extend(sum(v.routable for v in vs) for vs in views)

    def note(u: int) -> None:
        unit = units[u]
        res = unit.slots
        wait = unit.wait.expected_wait(p.slots, env.now) if shed else 0.0
        unit.history.append((env.now, len(res.queue), res.count, wait or 0.0))

    def refresh(r: int, v: _View) -> None:
        """Router r's view of unit v.index: the load of its last watch tick."""
        u, now = v.index, env.now
        last = now - ((now - phase[r][u]) % p.report_s) if now >= phase[r][u] else -1.0
        if last == v.read_at:
            return
        v.read_at = last
        hist = units[u].history
        i = len(hist) - 1
        while i > 0 and hist[i][0] > last:
            i -= 1
        _, v.queue_depth, v.running, v.wait_s = hist[i]
        v.in_flight = v.queue_depth + v.running
        v.queue_timeout_s = p.queue_timeout_s if shed else 0.0
        v.outstanding_at_report = v.outstanding  # approximation: own requests count from the report on

    def saturated(v: _View) -> bool:
        # runtime/router/fleet.py Fleet.saturated, with the shipped "full" test only when shedding
        if v.outstanding >= p.max_outstanding_per_unit or v.queue_depth >= p.max_queue_depth:
            return True
        return shed and overload.full(v)

    def pick(r: int, tried: set[int]) -> tuple[_View | None, str]:
        vs = views[r]

        def usable(v: _View) -> bool:
            if v.index in tried or not v.routable:
                return False
            refresh(r, v)
            return not saturated(v)

        best = balance.sample_choices(vs, usable, pick_rng)
        if best is None:
            best = balance.least_loaded(vs, usable, pick_rng)
        if best is not None:
            return best, "ok"
        return None, "saturated" if any(v.routable and v.index not in tried for v in vs) else "no_unit"

    def serve(i: int, u: int, steps: int, max_steps: int, arrived: float):
        """At the unit: a slot within the queue timeout, else a refusal. Returns True when served."""
        unit = units[u]
        rid = str(i)
        unit.wait.submitted(rid, max_steps)
        with unit.slots.request() as slot:
            note(u)
            got = yield slot | env.timeout(p.queue_timeout_s)
            if slot not in got:
                unit.wait.finished(rid, env.now)
                note(u)
                return False
            start = env.now
            waits.append(start - arrived)
            unit.wait.token(rid, start)
            note(u)
            yield env.timeout(steps * p.step_s)
            unit.wait.finished(rid, env.now, steps)
        note(u)
        nonlocal served_slot_s
        served_slot_s += max(0.0, min(env.now, overload_end) - max(start, p.ramp_s))
        return True

    def request(i: int, r: int, steps: int, max_steps: int):
        arrived = env.now
        tried: set[int] = set()
        refusal = ""
        for _ in range(p.max_attempts):
            v, why = pick(r, tried)
            if v is None:
                if not refusal:
                    refusal = "refused_429" if why == "saturated" else "no_unit_ready"
                break
            u = v.index
            if shed:
                wait = units[u].wait.expected_wait(p.slots, env.now)
                if wait is not None and wait > p.queue_timeout_s:
                    tried.add(u)  # 429 unit_busy at once; the unit stays routable
                    refusal = "refused_429"
                    continue
            v.outstanding += 1
            ok = yield env.process(serve(i, u, steps, max_steps, arrived))
            v.outstanding -= 1
            if ok:
                counts["served"] += arrived >= p.ramp_s
                return
            tried.add(u)
            if shed:
                refusal = "refused_429"  # 429 queue_timeout: busy, still routable
            else:
                v.routable = False  # the former router: any 503 from a unit ejected it
                refusal = "refused_503"
        if arrived >= p.ramp_s:
            counts[refusal or "no_unit_ready"] += 1
            told.append(env.now - arrived)

    def source():
        capacity = p.units * p.slots / p.service_mean_s  # requests a second the fleet can serve
        sigma = math.sqrt(math.log(1 + p.service_cv**2))
        mu = math.log(p.service_mean_s) - sigma**2 / 2
        i = 0
        while True:
            rate = capacity * (p.base_load if env.now < p.ramp_s else p.load)
            gap = rng.expovariate(rate)
            if env.now + gap > overload_end:
                return
            yield env.timeout(gap)
            steps = max(1, round(rng.lognormvariate(mu, sigma) / p.step_s))
            max_steps = math.ceil(steps * rng.uniform(1.0, p.max_tokens_slack))
            env.process(request(i, rng.randrange(p.routers), steps, max_steps))
            i += 1

    env.process(source())
    env.process(sample_rotation())
    env.run()
    offered = sum(counts.values())
    refused = len(told)
    capacity_slot_s = p.units * p.slots * p.duration_s
    in_rotation = in_rotation_at_end
    waits.sort()
    return {
        "offered": offered,
        "served": counts["served"],
        "refused_429": counts["refused_429"],
        "refused_503": counts["refused_503"],
        "no_unit_ready": counts["no_unit_ready"],
        "goodput": served_slot_s / capacity_slot_s,
        "told_within_1s": (sum(1 for t in told if t <= 1.0) / refused) if refused else 1.0,
        "told_p99_s": sorted(told)[min(refused - 1, int(refused * 0.99))] if refused else 0.0,
        "in_rotation_min": min(in_rotation),
        "in_rotation_mean": sum(in_rotation) / len(in_rotation),
        "wait_p99_s": waits[min(len(waits) - 1, int(len(waits) * 0.99))] if waits else 0.0,
    }


def table(rows: list[dict]) -> str:
    """The docs/benchmarks.md table of a set of runs."""
    out = [
        "| overload | offered load | policy | served | goodput (slot time used) | refused 429 | refused 503 | "
        "no_unit_ready | refusals told within 1 s | refusal p99 | units in rotation at the end (min over routers) | "
        "queue wait p99 (served) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        p, r = row["params"], row["result"]
        policy = "429, stays in rotation" if row["behaviour"] == "shed" else "503, ejected"
        out.append(
            f"| {p['duration_s']:g} s | {100 * p['load']:.0f} % | {policy} | "
            f"{r['served']:,} of {r['offered']:,} | {100 * r['goodput']:.1f} % | {r['refused_429']:,} | "
            f"{r['refused_503']:,} | {r['no_unit_ready']:,} | {100 * r['told_within_1s']:.1f} % | "
            f"{r['told_p99_s']:.2f} s | {r['in_rotation_min']} of {p['units']} | {r['wait_p99_s']:.1f} s |"
        )
    return "\n".join(out)
