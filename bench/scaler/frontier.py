"""`python -m bench.scaler.frontier`: what the unannounced spike costs flotilla's scaler, as a frontier.
For each cold start and each target occupancy (the headroom the scaler keeps), the minutes whose p99
time to first token misses the target inside a window around the spike (default 16:30-18:00, which
holds every minute the full day misses), the unit-hours paid in the window, and the same for the
oracle at that cold start. `--full-day` adds, for each target at the first cold start, the whole
day's unit-hours and missed minutes beside the oracle's. Deterministic (seeded), like run.py.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
from bench.scaler.day import Day, requests  # noqa: E402 - after the path to this checkout is known
from bench.scaler.fleet_model import UnitModel, mean_service_s, required_units  # noqa: E402
from bench.scaler.run import booked_units, simulate  # noqa: E402
from contract.scaling import SCALE_IN_OCCUPANCY, TARGET_OCCUPANCY, ScalingPolicy, ScheduledMinimum  # noqa: E402


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def sweep(day: Day, cold_starts: list[float], targets: list[float], floor: int, ceiling: int) -> list[dict]:
    """One row per (cold start, target): flotilla's missed minutes and unit-hours, and the oracle's."""
    reqs = requests(day)
    rows = []
    for cold in cold_starts:
        model = UnitModel(cold_start_s=cold)
        mean_s = mean_service_s(reqs, model)
        lo, hi = day.surge
        booked = booked_units(day, model, mean_s, TARGET_OCCUPANCY)
        base = ScalingPolicy(
            floor=floor,
            ceiling=ceiling,
            cold_start_s=cold,
            schedule=(ScheduledMinimum("announced surge", lo, hi, min(booked, ceiling)),),
        )
        required = required_units(reqs, model, TARGET_OCCUPANCY, day.start_s, day.end_s)
        oracle = simulate("oracle", day, model, base, reqs, required)
        for target in targets:
            policy = replace(
                base,
                target_occupancy=target,
                scale_in_occupancy=round(target * SCALE_IN_OCCUPANCY / TARGET_OCCUPANCY, 4),
            )
            t0 = time.monotonic()
            r = simulate("flotilla", day, model, policy, reqs, required)
            row = {
                "cold_start_s": cold,
                "target_occupancy": target,
                "missed": r["minutes"] - r["minutes_within"],
                "minutes": r["minutes"],
                "unit_hours": round(r["unit_hours"], 1),
                "oracle_unit_hours": round(oracle["unit_hours"], 1),
                "oracle_missed": oracle["minutes"] - oracle["minutes_within"],
                "refused_429": r["refused_429"],
                "dropped_by_scale_in": r["dropped_by_scale_in"],
                "reversals": r["reversals"],
                "peak_units": r["peak_units"],
            }
            rows.append(row)
            print(f"  {json.dumps(row)} ({time.monotonic() - t0:.0f} s)", flush=True)
    return rows


def table(rows: list[dict]) -> str:
    out = [
        "| cold start | target occupancy | missed minutes | unit-hours | x oracle | 429s | dropped by scale-in "
        "| reversals |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(
            f"| {r['cold_start_s']:g} s | {r['target_occupancy']:.0%} | {r['missed']} of {r['minutes']} | "
            f"{r['unit_hours']:,.0f} | {r['unit_hours'] / r['oracle_unit_hours']:.3f} | {r['refused_429']:,} | "
            f"{r['dropped_by_scale_in']} | {r['reversals']} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.scaler.frontier", description=__doc__.split("\n\n")[0])
    p.add_argument("--start-hour", type=float, default=16.5)
    p.add_argument("--hours", type=float, default=1.5)
    p.add_argument("--cold-starts", default="150,300,450,600", help="seconds, comma-separated")
    p.add_argument("--targets", default="0.75,0.65,0.55,0.5,0.45", help="target occupancies, comma-separated")
    p.add_argument("--floor", type=int, default=10)
    p.add_argument("--ceiling", type=int, default=600)
    p.add_argument("--full-day", action="store_true", help="also each target over the whole day (minutes each)")
    p.add_argument("--out", default=None, help="write the rows here as JSON")
    a = p.parse_args(argv)
    cold_starts, targets = _floats(a.cold_starts), _floats(a.targets)
    window = Day(start_h=a.start_hour, hours=a.hours)
    print(f"window {a.start_hour:g} h + {a.hours:g} h:", flush=True)
    rows = sweep(window, cold_starts, targets, a.floor, a.ceiling)
    doc: dict = {"window": {"start_hour": a.start_hour, "hours": a.hours}, "rows": rows}
    print("\n" + table(rows))
    if a.full_day:
        print(f"\nthe whole day, cold start {cold_starts[0]:g} s:", flush=True)
        doc["full_day"] = sweep(Day(), cold_starts[:1], targets, a.floor, a.ceiling)
        print("\n" + table(doc["full_day"]))
    if a.out:
        Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
