"""docs/benchmarks.md's rollout table: the 160-unit example fleet (examples/fleet-20k-chips.yaml)
simulated rolling at 5, 10 and 30 minutes of model load, one unit at a time vs the default waves,
in both modes (ops/rollout_sim.py; step times and their sources in StepTimes). Prints Markdown.

    .venv/bin/python bench/rollout/table.py
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


def main() -> int:
    base = FleetModel(
        units=160,
        nodes_per_unit=8,
        units_per_cell=20,
        traffic=TRAFFIC,
        node_failures_per_node_day=FAILURES_PER_NODE_DAY,
    )
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
