"""`make bench-scaler`: one simulated day of a fleet of hundreds of units under four ways of sizing it
(static for the peak, a threshold autoscaler in the style of llm-d's WVA, flotilla's scaler, an
oracle that knows the future and pays the same cold start), with the goals of docs/benchmarks.md
("Scaling, simulated"): p99 time to first token within the target in >= 99.5 % of minutes; unit-hours
<= 1.15 x the oracle's (<= 1.05 x over the announced surge); no reversal within twice the cold start;
no request dropped by scale-in. Deterministic (seeded): the figures do not depend on the machine.

`--tiny` runs two hours of a small fleet around the surge in seconds (its figures in .cache/bench-tiny/).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

import simpy

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
from bench.measure import append_run, results_file, tiny_mode  # noqa: E402 - after the path to this checkout is known
from bench.scaler import controllers  # noqa: E402
from bench.scaler.day import Day, requests  # noqa: E402
from bench.scaler.fleet_model import (  # noqa: E402
    Controller,
    Fleet,
    UnitModel,
    mean_service_s,
    minutes_within,
    required_units,
    reversals,
    unit_hours,
)
from contract.scaling import SCALE_IN_OCCUPANCY, TARGET_OCCUPANCY, ScalingPolicy, ScheduledMinimum  # noqa: E402

RESULTS = "scaler_sim.json"
POLICIES = ("static", "threshold", "flotilla", "oracle")
GOAL_MINUTES, GOAL_HOURS, GOAL_SURGE_HOURS = 0.995, 1.15, 1.05


def booked_units(day: Day, model: UnitModel, mean_s: float, occupancy: float) -> int:
    """What an operator books for the announced surge: the announced rate (the surge factor times the
    day's highest rate inside the window) x mean service time, at the target occupancy of the slots."""
    lo, hi = day.surge
    rate = max(day.rate(t) for t in range(int(lo), int(hi), 60))
    return math.ceil(rate * mean_s / (model.slots * occupancy))


def simulate(name: str, day: Day, model: UnitModel, policy: ScalingPolicy, reqs, required) -> dict:
    env = simpy.Environment(initial_time=day.start_s)
    fleet = Fleet(env, model, mean_service_s(reqs, model), seed=day.seed + 11)
    factories: dict[str, Callable[[], Controller]] = {
        "static": controllers.Static,
        "threshold": lambda: controllers.Threshold(policy, model.slots),
        "flotilla": lambda: controllers.Flotilla(policy, model.slots),
        "oracle": lambda: controllers.Oracle(
            required, day.start_s, model.cold_start_s, model.pass_s, policy.floor, model.slots
        ),
    }
    controller = factories[name]()
    warm = int(required.max()) if name == "static" else max(policy.floor, int(required[0]))
    for _ in range(warm):
        fleet.start_unit(warm=True)
    env.process(fleet.arrivals(reqs))
    env.process(fleet.control(controller, day.end_s))
    # Past the end, so the last minutes' requests reach their first tokens; no arrivals come.
    env.run(until=day.end_s + 120)
    out = fleet.out
    good, total = minutes_within(out, policy.ttft_target_s, day.start_s, day.end_s)
    lo, hi = day.surge
    arrived = sum(out.arrived_by_minute.values())
    refused = sum(out.refused_by_minute.values())
    counts = [a + p + d for _, a, p, d in out.timeline]
    result = {
        "policy": name,
        "label": controller.name,
        "unit_hours": unit_hours(out.units, day.start_s, day.end_s),
        "surge_unit_hours": unit_hours(out.units, max(lo, day.start_s), min(hi, day.end_s)),
        "minutes_within": good,
        "minutes": total,
        "requests": arrived,
        "refused_429": refused,
        "moved_by_scale_in": out.moved,
        "dropped_by_scale_in": out.dropped_by_scale_in,
        "reversals": reversals(out.directions, 2 * model.cold_start_s),
        "passes_that_changed": len(out.directions),
        "peak_units": max(counts, default=warm),
        "least_units": min(counts, default=warm),
    }
    if isinstance(controller, controllers.Flotilla):
        result["rules"] = dict(sorted(controller.rules.items()))
        result["changes"] = controller.changes
    return result


def table(results: list[dict], day: Day) -> str:
    oracle = next((r for r in results if r["policy"] == "oracle"), None)
    surge = day.surge[0] < day.end_s and day.surge[1] > day.start_s
    head = (
        "| sizing | unit-hours | x oracle | surge x oracle | minutes p99 TTFT within target | 429s | "
        "moved by scale-in | dropped by scale-in | reversals within 2x cold start | units (least-most) |"
    )
    rows = [head, "|" + "---|" * 10]
    for r in results:
        ratio = r["unit_hours"] / oracle["unit_hours"] if oracle else float("nan")
        surge_ratio = r["surge_unit_hours"] / oracle["surge_unit_hours"] if oracle and surge else float("nan")
        share = r["minutes_within"] / r["minutes"] if r["minutes"] else float("nan")
        rows.append(
            f"| {r['label']} | {r['unit_hours']:,.0f} | {ratio:.3f} | {surge_ratio:.3f} | {100 * share:.2f} % "
            f"({r['minutes'] - r['minutes_within']} missed) | {r['refused_429']:,} "
            f"({100 * r['refused_429'] / max(r['requests'], 1):.2f} %) | {r['moved_by_scale_in']:,} | "
            f"{r['dropped_by_scale_in']} | {r['reversals']} | {r['least_units']}-{r['peak_units']} |"
        )
    return "\n".join(rows)


def goals(results: list[dict]) -> list[str]:
    oracle = next(r for r in results if r["policy"] == "oracle")
    r = next(r for r in results if r["policy"] == "flotilla")
    met = [
        ("p99 TTFT within target in >= 99.5 % of minutes", r["minutes_within"] >= GOAL_MINUTES * r["minutes"]),
        ("unit-hours <= 1.15 x the oracle's", r["unit_hours"] <= GOAL_HOURS * oracle["unit_hours"]),
        (
            "unit-hours over the announced surge <= 1.05 x the oracle's",
            r["surge_unit_hours"] <= GOAL_SURGE_HOURS * oracle["surge_unit_hours"],
        ),
        ("no reversal within twice the cold start", r["reversals"] == 0),
        ("0 requests dropped by scale-in", r["dropped_by_scale_in"] == 0),
    ]
    return [f"{'met' if ok else 'NOT met'}: {what}" for what, ok in met]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.scaler.run", description=__doc__.split("\n\n")[0])
    p.add_argument("--peak-rate", type=float, default=120.0, help="requests/s at the diurnal peak (default 120)")
    p.add_argument("--start-hour", type=float, default=0.0, help="hour of the day the run starts (default 0)")
    p.add_argument("--hours", type=float, default=24.0, help="hours simulated (default 24)")
    p.add_argument("--cold-start", type=float, default=600.0, help="seconds from start to serving (default 600)")
    p.add_argument("--ttft-target", type=float, default=2.0, help="p99 time to first token target, s (default 2)")
    p.add_argument(
        "--target-occupancy",
        type=float,
        default=TARGET_OCCUPANCY,
        help=f"share of the slots the scalers fill before adding a unit: the headroom (default {TARGET_OCCUPANCY}); "
        "the oracle, static and the booked surge stay sized at the default",
    )
    p.add_argument(
        "--scale-in-occupancy",
        type=float,
        default=None,
        help="share the survivors may fill after a scale-in "
        f"(default: the target x {SCALE_IN_OCCUPANCY / TARGET_OCCUPANCY:g})",
    )
    p.add_argument("--floor", type=int, default=10, help="units always serving (default 10)")
    p.add_argument("--ceiling", type=int, default=600, help="most units (default 600)")
    p.add_argument("--policies", default=",".join(POLICIES), help=f"comma-separated, of {', '.join(POLICIES)}")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--label", default="", help="stored with the results")
    p.add_argument("--out", default=None, help="results file (appended; default bench/results/scaler_sim.json)")
    # Tiny: two hours of a small fleet around the surge, seconds (after the flags: its defaults win).
    tiny_mode(p, argv, peak_rate=12.0, start_hour=10.5, hours=2.0, floor=2)
    a = p.parse_args(argv)
    unknown = sorted(set(a.policies.split(",")) - set(POLICIES))
    if unknown:
        p.error(f"--policies={','.join(unknown)} is not known: use some of {','.join(POLICIES)}")
    if a.cold_start <= 0 or a.ttft_target <= 0 or a.floor < 1 or a.ceiling < a.floor or a.hours <= 0:
        p.error("--cold-start, --ttft-target and --hours must be positive and 1 <= --floor <= --ceiling")
    if a.scale_in_occupancy is None:
        a.scale_in_occupancy = round(a.target_occupancy * SCALE_IN_OCCUPANCY / TARGET_OCCUPANCY, 4)
    if not 0 < a.scale_in_occupancy < a.target_occupancy <= 1:
        p.error(
            f"--scale-in-occupancy={a.scale_in_occupancy} and --target-occupancy={a.target_occupancy}: give "
            "0 < scale-in < target <= 1 (the gap stops flapping)"
        )
    a.out = a.out or str(results_file(RESULTS, a.tiny))
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    model = UnitModel(cold_start_s=a.cold_start)
    day = Day(seed=a.seed, peak_rate=a.peak_rate, start_h=a.start_hour, hours=a.hours)
    started = time.monotonic()
    reqs = requests(day)
    mean_s = mean_service_s(reqs, model)
    base = ScalingPolicy(floor=a.floor, ceiling=a.ceiling, cold_start_s=a.cold_start, ttft_target_s=a.ttft_target)
    lo, hi = day.surge
    # The yardsticks (the oracle, static for its peak, the booking of the announced surge) stay sized at
    # the default occupancy: a scaler given more headroom pays for it against the same oracle.
    booked = booked_units(day, model, mean_s, TARGET_OCCUPANCY)
    policy = replace(
        base,
        target_occupancy=a.target_occupancy,
        scale_in_occupancy=a.scale_in_occupancy,
        schedule=(ScheduledMinimum("announced surge", lo, hi, min(booked, a.ceiling)),),
    )
    required = required_units(reqs, model, TARGET_OCCUPANCY, day.start_s, day.end_s)
    print(
        f"{len(reqs):,} requests over {day.hours:g} h (mean service {mean_s:.1f} s); the oracle needs "
        f"{int(required.min())}-{int(required.max())} units; the surge is booked at {booked} units",
        flush=True,
    )
    results = []
    for name in a.policies.split(","):
        t0 = time.monotonic()
        results.append(simulate(name, day, model, policy, reqs, required))
        print(f"  {name}: {json.dumps(results[-1])} ({time.monotonic() - t0:.0f} s)", flush=True)
    print()
    print(table(results, day))
    if {"oracle", "flotilla"} <= {r["policy"] for r in results}:
        print("\n" + "\n".join(goals(results)))
    # Simulated time: the figures do not depend on the machine, so no CPU is recorded with them.
    append_run(
        a.out,
        {
            "label": a.label,
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "day": asdict(day),
            "unit": asdict(model),
            "policy": policy.to_json(),
            "requests": len(reqs),
            "booked_units": booked,
            "results": results,
            "seconds": round(time.monotonic() - started),
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
