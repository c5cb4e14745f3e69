"""docs/benchmarks.md's rollout table: the 160-unit example fleet (examples/fleet-20k-chips.yaml)
simulated rolling at 5, 10 and 30 minutes of model load, one unit at a time vs the default waves,
in both modes (ops/rollout_sim.py; step times and their sources in StepTimes). Prints Markdown.
`--drains` prints the drain table instead: the same fleet with a unit's drain waiting for its
answers (the 100 s bound, a typical 20 s) against handing its streams over (5 s).

    .venv/bin/python -m bench.rollout.table [--drains]
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from ops.rollout_sim import FleetModel, summarize  # noqa: E402 - after the path to this checkout is known

SEEDS = range(5)
FAILURES_PER_NODE_DAY = 0.002  # an assumption (no trn1 fleet data here): ~2.6 node failures a day over 1,280 nodes
TRAFFIC = 0.8  # demand as a share of the whole fleet's capacity


# A unit's drain, seconds: waiting for answers up to the default bound (long answers in flight), a
# typical answer's length (StepTimes.drain_s), and handing each stream over to the router, which
# takes one decode step plus the node's exit: 5.4 s in bench/failover's short run on a loaded 2-core
# machine (docs/benchmarks.md, Failover), rounded to 5.
DRAINS = (
    (100.0, "waits for answers, bound (100 s)"),
    (20.0, "waits for answers, typical (20 s)"),
    (5.0, "hands streams over (5 s)"),
)


def drains(base: FleetModel) -> None:
    print("| model load | mode | drain | rollout (default waves) | rollout (one at a time) |")
    print("|---|---|---|---|---|")
    for minutes in (5, 10):
        for mode in ("surge", "replace"):
            for drain_s, label in DRAINS:
                steps = replace(base.steps, drain_s=drain_s)
                model = replace(base, load_s=minutes * 60.0, rollout=mode, steps=steps)
                waves = summarize(model, SEEDS)
                single = summarize(replace(model, units_per_wave=1), SEEDS)
                print(
                    f"| {minutes} min | {mode} | {label} | {waves.duration_s / 3600:.2f} h | "
                    f"{single.duration_s / 3600:.1f} h |"
                )


def main() -> int:
    base = FleetModel(
        units=160,
        nodes_per_unit=8,
        units_per_cell=20,
        traffic=TRAFFIC,
        node_failures_per_node_day=FAILURES_PER_NODE_DAY,
    )
    if "--drains" in sys.argv[1:]:
        drains(base)
        return 0
    columns = (
        "model load",
        "mode",
        "units per wave",
        "rollout",
        "fewest units in rotation",
        "below the floor",
        f"shed at {TRAFFIC:.0%} load",
        "shed at 95 % load",
    )
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for minutes in (5, 10, 30):
        for mode in ("surge", "replace"):
            for wave in (1, None):
                model = replace(base, load_s=minutes * 60.0, rollout=mode, units_per_wave=wave)
                s = summarize(model, SEEDS)
                busy = summarize(replace(model, traffic=0.95), SEEDS)
                label = "1 (one at a time)" if wave == 1 else f"{s.units_per_wave} (default, 10 %)"
                print(
                    f"| {minutes} min | {mode} | {label} | {s.duration_s / 3600:.1f} h | {s.min_in_rotation} "
                    f"(floor {s.model.floor}) | {s.below_floor_s / 60:.0f} min | {s.shed_share:.2%} | "
                    f"{busy.shed_share:.2%} |"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
