"""Calibrate the fleet rollout simulation (ops/rollout_sim.py) against the ECS rehearsal.

Runs `flotilla rehearse`'s engine on a synthesized cloud assembly (a surge fleet, one unit per wave:
`make synth CONFIG=examples/rehearsal.yaml`) a few times and measures, per unit handover, how long
after the new formation entered the router's rotation the old one left it. The simulation draws
that delay as the node's settle plus uniform(0, health-check interval); this prints the measured
phases beside that model and the rehearsal's per-unit rollout times. Not part of `make test`.

    .venv/bin/python -m bench.rollout.calibrate --cdk-out cdk.out --runs 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from ops.rehearsal.run import Options, rehearse  # noqa: E402 - after the path to this checkout is known
from ops.rehearsal.template import read_fleet  # noqa: E402
from ops.rollout_sim import calibrate  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cdk-out", default="cdk.out")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--time-scale", type=float, default=0.01)
    a = p.parse_args()
    fleet = read_fleet(Path(a.cdk_out))
    interval = fleet.services[0].health.interval_s
    options = Options(scale=a.time_scale)
    phases: list[float] = []
    per_unit: list[float] = []
    for _ in range(a.runs):
        report = asyncio.run(rehearse(fleet, options))
        cal = calibrate(report.rotation, settle_s=options.ready_settle_s / a.time_scale, interval_s=interval)
        phases += cal.check_phase_s
        per_unit.append(report.rollout_s / report.units)
    out = {
        "load_average": os.getloadavg(),
        "time_scale": a.time_scale,
        "interval_s": interval,
        "handovers": len(phases),
        "check_phase_s": {
            "min": min(phases, default=0),
            "mean": sum(phases) / len(phases) if phases else 0,
            "max": max(phases, default=0),
        },
        "model": {"check_phase": f"uniform(0, {interval:g}): mean {interval / 2:g}"},
        "rehearsal_unit_rollout_emulated_s": per_unit,
    }
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
