"""A SimPy model of N routers in front of M units, each router seeing every unit's load only as of its
last report: which balancing policy keeps queue wait close to one ideal central queue.

Run: `python -m bench.fleet.policy_sim` (part of `make bench-fleet`; --tiny: 2,000 requests); the table goes to
docs/benchmarks.md (Fleet). tests/router/test_router_balance.py runs it small in `make test`.

The model (each choice is a stated assumption, not a measurement of Trainium):
- A unit has `slots` batch slots (the engine's max_running); a request waits in the unit's FIFO queue
  until a slot frees, then holds it for its service time (continuous batching: a sequence's time does
  not depend on how full the batch is). Queue wait = time from reaching the unit to getting a slot.
- Service times are lognormal with mean `service_mean_s` and coefficient of variation `service_cv`
  (LLM generations vary with output length). Arrivals are Poisson at `load` x total slots / mean
  service time; the ALB hands each to one of the routers uniformly at random.
- Each router learns each unit's requests in flight (queue + batch) as of its last report and knows
  its own in-flight requests exactly (`outstanding`). A report reaches the router at most `report_s`
  after the change (the watch checks every `report_s`, at its own phase per stream): 0.05 s is the
  shipped watch (--change-report), 0.25 s a report only per poll interval, as the old polling had.
- The ideal: one FIFO queue in front of all units x slots (what no set of independent routers can
  beat). Every policy sees the same arrivals and service times.
Policies: `p4c` (shipped: runtime/router/balance.py, the least loaded of four random units, estimated
load = last report plus own requests since), `p2c` (the same with two), `least_loaded` (the former
router: the minimum of last report plus own outstanding over every unit), `least_loaded_corrected`
(the minimum of the shipped estimate over every unit), `p2c_own` (two choices on own outstanding
only, no reports), `random`.
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import simpy

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
from bench.measure import results_file, tiny_mode  # noqa: E402 - after the path to this checkout is known
from runtime.router import balance  # noqa: E402

LOADS_DEFAULT = "0.5,0.7,0.8,0.9"
POLICIES = ("p4c", "p2c", "least_loaded", "least_loaded_corrected", "p2c_own", "random")


@dataclass(frozen=True)
class Params:
    routers: int = 10
    units: int = 100
    slots: int = 8
    load: float = 0.8
    service_mean_s: float = 2.0
    service_cv: float = 1.0
    report_s: float = 0.05
    requests: int = 100_000
    warmup_fraction: float = 0.1  # the first arrivals fill the system; their waits are not counted
    seed: int = 1


class _History:
    """A step function of time: the value in force at any t (unit load, a router's outstanding)."""

    __slots__ = ("times", "values")

    def __init__(self, value: tuple[int, ...] | int) -> None:
        self.times = [0.0]
        self.values = [value]

    def set(self, t: float, value: tuple[int, ...] | int) -> None:
        if self.times[-1] == t:
            self.values[-1] = value
        else:
            self.times.append(t)
            self.values.append(value)

    def at(self, t: float) -> tuple[int, ...] | int:
        return self.values[bisect.bisect_right(self.times, t) - 1]


class _View:
    """One router's knowledge of one unit, in the shape runtime/router/balance.py reads."""

    __slots__ = (
        "in_flight",
        "queue_depth",
        "running",
        "kv_cache_used",
        "outstanding",
        "outstanding_at_report",
        "index",
    )

    def __init__(self, index: int) -> None:
        self.index = index
        self.in_flight = 0
        self.queue_depth = 0
        self.running = 0
        self.kv_cache_used = 0.0
        self.outstanding = 0
        self.outstanding_at_report = 0


def workload(p: Params) -> tuple[list[float], list[float], list[int]]:
    """Arrival times, service times and the router each arrival reaches: the same for every policy."""
    rng = random.Random(p.seed)
    rate = p.load * p.units * p.slots / p.service_mean_s
    sigma = math.sqrt(math.log(1 + p.service_cv**2))
    mu = math.log(p.service_mean_s) - sigma**2 / 2
    t, arrivals, services, routers = 0.0, [], [], []
    for _ in range(p.requests):
        t += rng.expovariate(rate)
        arrivals.append(t)
        services.append(rng.lognormvariate(mu, sigma))
        routers.append(rng.randrange(p.routers))
    return arrivals, services, routers


def _percentiles(waits: list[float]) -> dict[str, float]:
    waits = sorted(waits)
    n = len(waits)

    def q(x: float) -> float:
        return waits[min(n - 1, int(n * x))]

    return {
        "mean_s": sum(waits) / n,
        "p50_s": q(0.50),
        "p90_s": q(0.90),
        "p99_s": q(0.99),
        "p999_s": q(0.999),
        "waited": sum(1 for w in waits if w > 0) / n,
    }


def central_queue(p: Params, work: tuple[list[float], list[float], list[int]]) -> dict[str, float]:
    env = simpy.Environment()
    servers = simpy.Resource(env, capacity=p.units * p.slots)
    arrivals, services, _ = work
    waits: list[float] = []
    skip = int(p.requests * p.warmup_fraction)

    def request(i: int):
        with servers.request() as slot:
            yield slot
            if i >= skip:
                waits.append(env.now - arrivals[i])
            yield env.timeout(services[i])

    def source():
        for i, at in enumerate(arrivals):
            yield env.timeout(at - env.now)
            env.process(request(i))

    env.process(source())
    env.run()
    return _percentiles(waits)


def distributed(p: Params, policy: str, work: tuple[list[float], list[float], list[int]]) -> dict[str, float]:
    if policy not in POLICIES:
        raise ValueError(f"policy {policy!r}: one of {', '.join(POLICIES)}")
    env = simpy.Environment()
    rng = random.Random(p.seed + 7)
    units = [simpy.Resource(env, capacity=p.slots) for _ in range(p.units)]
    load = [_History((0, 0)) for _ in range(p.units)]  # (queue_depth, running) over time
    views = [[_View(u) for u in range(p.units)] for _ in range(p.routers)]
    mine = [[_History(0) for _ in range(p.units)] for _ in range(p.routers)]  # own outstanding
    phase = [[rng.random() * p.report_s for _ in range(p.units)] for _ in range(p.routers)]
    arrivals, services, routers = work
    waits: list[float] = []
    skip = int(p.requests * p.warmup_fraction)

    def refresh(r: int, v: _View) -> None:
        """What router r knows of unit v.index now: the report of its last watch tick."""
        u = v.index
        last = env.now - ((env.now - phase[r][u]) % p.report_s) if env.now >= phase[r][u] else -1.0
        if last < 0:
            v.in_flight = v.queue_depth = v.running = v.outstanding_at_report = 0
            return
        v.queue_depth, v.running = load[u].at(last)  # type: ignore[misc]
        v.in_flight = v.queue_depth + v.running
        v.outstanding_at_report = mine[r][u].at(last)  # type: ignore[assignment]

    def note(u: int) -> None:
        res = units[u]
        load[u].set(env.now, (len(res.queue), res.count))

    def pick(r: int) -> int:
        vs = views[r]
        if policy == "random":
            return rng.randrange(p.units)
        if policy == "p2c_own":
            a, b = rng.sample(vs, 2)
            return (a if a.outstanding <= b.outstanding else b).index
        if policy in ("p4c", "p2c"):
            # the router samples first, then reads the reports it holds for those units
            def usable(v: _View) -> bool:
                refresh(r, v)
                return True

            chosen = balance.sample_choices(vs, usable, rng, choices=4 if policy == "p4c" else 2)
            assert chosen is not None
            return chosen.index
        for v in vs:
            refresh(r, v)
        if policy == "least_loaded_corrected":
            chosen = balance.least_loaded(vs, lambda v: True, rng)
            assert chosen is not None
            return chosen.index
        # least_loaded: the former router's key, reported + own outstanding (counted twice when the
        # report already includes them), then KV use, then chance
        return min(vs, key=lambda v: (v.queue_depth + v.running + v.outstanding, rng.random())).index

    def request(i: int, r: int, u: int):
        res = units[u]
        with res.request() as slot:
            note(u)
            arrived = env.now
            yield slot
            note(u)
            if i >= skip:
                waits.append(env.now - arrived)
            yield env.timeout(services[i])
        note(u)
        v = views[r][u]
        v.outstanding -= 1
        mine[r][u].set(env.now, v.outstanding)

    def source():
        for i, at in enumerate(arrivals):
            yield env.timeout(at - env.now)
            r = routers[i]
            u = pick(r)
            v = views[r][u]
            v.outstanding += 1
            mine[r][u].set(env.now, v.outstanding)
            env.process(request(i, r, u))

    env.process(source())
    env.run()
    return _percentiles(waits)


def compare(p: Params, policies: tuple[str, ...] = POLICIES) -> dict[str, dict[str, float]]:
    work = workload(p)
    out = {"central": central_queue(p, work)}
    for policy in policies:
        out[policy] = distributed(p, policy, work)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--routers", type=int, default=10)
    ap.add_argument("--units", type=int, default=100)
    ap.add_argument("--slots", type=int, default=None, help="batch slots per unit (default 8; overload: 16)")
    ap.add_argument("--loads", default=LOADS_DEFAULT, help="offered load / capacity (overload: default 1.2,1.5)")
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--service-mean", type=float, default=None, help="seconds (default 2; overload: 20)")
    ap.add_argument("--service-cv", type=float, default=1.0)
    ap.add_argument("--reports", default="0.05,0.25", help="seconds from a change of load to a router knowing it")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--label", default="")
    ap.add_argument("--out", default=None, help="results file (default bench/results/<scenario>_sim.json)")
    ap.add_argument(
        "--scenario",
        choices=("balance", "overload"),
        default="balance",
        help="balance: the policies against one central queue; overload: offered load past capacity, "
        "shedding against ejecting (bench/fleet/overload_sim.py)",
    )
    ap.add_argument(
        "--durations", default="60,300", help="overload: seconds the overload lasts, one run each (comma-separated)"
    )
    tiny = tiny_mode(ap, argv, units=20, requests=2000, reports="0.05", durations="5")
    args = ap.parse_args(argv)
    args.out = args.out or str(results_file(f"{'policy' if args.scenario == 'balance' else 'overload'}_sim.json", tiny))
    if args.scenario == "overload":
        return _overload_main(args)
    runs = []
    policies = tuple(args.policies.split(","))
    for report, load in ((float(r), float(x)) for r in args.reports.split(",") for x in args.loads.split(",")):
        p = Params(
            routers=args.routers,
            units=args.units,
            slots=args.slots or 8,
            load=load,
            service_mean_s=args.service_mean or 2.0,
            service_cv=args.service_cv,
            report_s=report,
            requests=args.requests,
            seed=args.seed,
        )
        started = time.monotonic()
        result = compare(p, policies)
        ideal = result["central"]["p99_s"]
        for name, r in result.items():
            ratio = r["p99_s"] / ideal if ideal > 0 else (1.0 if r["p99_s"] == 0 else math.inf)
            print(
                f"report {report:.2f} s load {load:.2f} {name:24s} p50 {1000 * r['p50_s']:8.1f} ms  "
                f"p99 {1000 * r['p99_s']:8.1f} ms  "
                f"p99.9 {1000 * r['p999_s']:8.1f} ms  waited {100 * r['waited']:5.1f} %  p99/ideal {ratio:6.2f}",
                flush=True,
            )
        runs.append({"params": asdict(p), "results": result, "seconds": time.monotonic() - started})
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    previous = json.loads(out.read_text()) if out.exists() else []
    previous.append({"label": args.label, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "runs": runs})
    out.write_text(json.dumps(previous, indent=1) + "\n")
    return 0


def _overload_main(args: argparse.Namespace) -> int:
    """--scenario overload: each duration x load (--loads, default 1.2,1.5 here), shed and eject, one table."""
    from bench.fleet import overload_sim  # noqa: PLC0415 - only this scenario needs it

    loads = "1.2,1.5" if args.loads == LOADS_DEFAULT else args.loads
    rows = []
    runs = [(float(d), float(x)) for d in args.durations.split(",") for x in loads.split(",")]
    for duration, load in runs:
        for behaviour in overload_sim.BEHAVIOURS:
            defaults = overload_sim.OverloadParams()
            p = overload_sim.OverloadParams(
                routers=args.routers,
                units=args.units,
                slots=args.slots or defaults.slots,
                load=load,
                service_mean_s=args.service_mean or defaults.service_mean_s,
                service_cv=args.service_cv,
                report_s=float(args.reports.split(",")[0]),
                duration_s=duration,
                seed=args.seed,
            )
            started = time.monotonic()
            result = overload_sim.run(p, behaviour)
            rows.append({"behaviour": behaviour, "params": asdict(p), "result": result})
            took = time.monotonic() - started
            print(f"{duration:g} s at {load:.2f}: {behaviour} {json.dumps(result)} ({took:.0f} s)", flush=True)
    print(overload_sim.table(rows))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    previous = json.loads(out.read_text()) if out.exists() else []
    previous.append({"label": args.label, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "runs": rows})
    out.write_text(json.dumps(previous, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
