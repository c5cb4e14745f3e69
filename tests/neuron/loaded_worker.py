"""A follower's worker that stops where the real one joins the unit: runtime/engines/neuron/spmd.py's
load half (build_model over the NxD Inference stand-in, its progress lines on stdout, then `join`),
and exit 0 instead of waiting for the other nodes. Started as `python loaded_worker.py spmd.py --flags...`
through the engine's test-only launcher, so it receives exactly the plan's flags."""

from __future__ import annotations

import argparse
import json
import os
import sys

from runtime.engines.neuron import spmd


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--compiled-model-path", required=True)
    p.add_argument("--neuron-config", required=True)
    args, _ = p.parse_known_args(sys.argv[1:])

    def progress(phase: str) -> None:
        print(json.dumps({"event": "progress", "phase": phase}), flush=True)

    spmd.build_model(args.model, args.compiled_model_path, json.loads(args.neuron_config), progress)
    progress(spmd.PHASE_JOIN)
    # Then what the real loop writes as the leader's broadcasts reach it: a Following line each, as many
    # as FOLLOWING_LINES says (one broadcast a second on this clock, so none is held back).
    n = int(os.environ.get("FOLLOWING_LINES", "0"))
    seconds = iter(range(n))
    heard = spmd._following(sys.stdout, clock=lambda: float(next(seconds)))
    for _ in range(n):
        heard()
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
