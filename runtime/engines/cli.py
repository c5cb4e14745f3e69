"""`python -m runtime plan --model smollm2 --nodes 2`: print the unit's parallel plan.

`--engine neuron` prints the trn1 plan instead: every rank's environment, command and NxD Inference
config (runtime.engines.neuron.cli), as JSON.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="print the parallel plan (layer ranges, tensor slices) of a unit")
    p.add_argument(
        "--model", default="smollm2", help="tiny, smollm2, or a checkpoint directory (config.json is enough here)"
    )
    p.add_argument("--nodes", type=int, default=2, help="ranks in the unit (world_size)")
    p.add_argument("--prefill", default="pipeline", choices=("pipeline", "tensor"))
    p.add_argument("--decode", default="tensor", choices=("pipeline", "tensor"))
    p.add_argument(
        "--engine",
        default="reference",
        choices=("reference", "neuron"),
        help="reference (default): layer ranges and tensor slices; neuron: the trn1 "
        "environment, command and NxD Inference config of every rank",
    )
    from runtime.engines.neuron.cli import add_neuron_plan_arguments  # noqa: PLC0415 - imported where used, so other subcommands and roles load less

    add_neuron_plan_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.engine == "neuron":
        from runtime.engines.neuron.cli import run_neuron_plan  # noqa: PLC0415 - imported where used, so other subcommands and roles load less

        return run_neuron_plan(args)
    from runtime.engines.layout import make_plan  # noqa: PLC0415 - imported where used, so other subcommands and roles load less
    from runtime.models.registry import TINY_SHAPE, LlamaShape  # noqa: PLC0415 - imported where used, so other subcommands and roles load less
    from runtime.models.smollm2 import smollm2_shape  # noqa: PLC0415 - imported where used, so other subcommands and roles load less

    # The plan needs only the shape: never convert weights just to print it.
    if args.model == "tiny":
        shape = TINY_SHAPE
    elif args.model == "smollm2":
        shape = smollm2_shape()
    else:
        config = Path(args.model) / "config.json"
        if not config.is_file():
            raise SystemExit(
                f"--model {args.model!r}: expected tiny, smollm2 or a checkpoint directory containing config.json"
            )
        shape = LlamaShape.from_config(json.loads(config.read_text()), source=str(config))
    try:
        plan = make_plan(shape, args.nodes, prefill=args.prefill, decode=args.decode)
    except ValueError as e:
        raise SystemExit(f"--nodes {args.nodes}: {e}")
    print(f"plan for model {args.model}")
    print(plan.describe())
    return 0
