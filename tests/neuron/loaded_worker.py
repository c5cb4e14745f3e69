"""A follower's worker that stops where the real one joins the unit: runtime/engines/neuron/spmd.py's
load half (build_model over the NxD Inference stand-in, its progress lines on stdout, then `join`),
and exit 0 instead of waiting for the other nodes. Started as `python loaded_worker.py spmd.py --flags...`
through the engine's test-only launcher, so it receives exactly the plan's flags."""

from __future__ import annotations

import argparse
import json
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
