"""`python -m runtime plan --model smollm2 --nodes 2`: print the unit's parallel plan.

`--calibrate` also forms the unit on this host (one process per rank, 127.0.0.1) and prints the
timings the formation would choose the strategies from. `--engine neuron` prints the trn1 plan
instead: every rank's environment, command and NxD Inference config (runtime.engines.neuron.cli),
as JSON.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import contract
from contract import Engine
from contract.llama import PRESETS

STRATEGY_CHOICES = contract.STRATEGY_CHOICES


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="print the parallel plan (layer ranges, tensor slices) of a unit")
    p.add_argument(
        "--model", default="smollm2", help="tiny, smollm2, or a checkpoint directory (config.json is enough here)"
    )
    p.add_argument("--nodes", type=int, default=2, help="ranks in the unit (world_size)")
    p.add_argument(
        "--prefill",
        default="auto",
        choices=STRATEGY_CHOICES,
        help="auto (default): timed at formation, see --calibrate; pipeline or tensor pins it",
    )
    p.add_argument("--decode", default="auto", choices=STRATEGY_CHOICES, help="as --prefill")
    p.add_argument(
        "--collectives",
        default="gloo",
        choices=("gloo", "shm"),
        help="the ranks' transport: gloo (default; ranks on different hosts) or shm (one host): "
        "over shm, heads that do not divide by the ranks are split unevenly instead of replicated",
    )
    p.add_argument(
        "--calibrate",
        action="store_true",
        help="form the unit on this host (reference engine, 1 torch thread per rank) and print the "
        "timings of every candidate prefill/decode pair and the pair chosen (converts the model)",
    )
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
    if args.engine == Engine.NEURON:
        from runtime.engines.neuron.cli import run_neuron_plan  # noqa: PLC0415 - imported where used, so other subcommands and roles load less

        return run_neuron_plan(args)
    from runtime.engines.calibrate import loading_pair  # noqa: PLC0415 - imported where used, so other subcommands and roles load less
    from runtime.engines.layout import make_plan  # noqa: PLC0415 - imported where used, so other subcommands and roles load less
    from runtime.models.registry import BUILTIN_MODELS, reference_shape  # noqa: PLC0415 - imported where used, so other subcommands and roles load less

    # The plan needs only the shape: never convert weights just to print it.
    if args.model in BUILTIN_MODELS:
        shape = PRESETS[args.model]
    else:
        config = Path(args.model) / "config.json"
        if not config.is_file():
            raise SystemExit(
                f"--model {args.model!r}: expected tiny, smollm2 or a checkpoint directory containing config.json"
            )
        shape = reference_shape(json.loads(config.read_text()), source=str(config))
    prefill, decode = loading_pair(args.prefill, args.decode)
    try:
        plan = make_plan(
            shape, args.nodes, prefill=prefill, decode=decode, split_uneven_heads=args.collectives == "shm"
        )
    except ValueError as e:
        raise SystemExit(f"--nodes {args.nodes}: {e}")
    print(f"plan for model {args.model}")
    print(plan.describe())
    if "auto" in (args.prefill, args.decode):
        print(
            f"strategies requested: prefill={args.prefill}, decode={args.decode}: every rank loads both "
            "layouts, the leader times each candidate pair when the unit forms and keeps the one with "
            "the lowest latency for one request; the other layout's weights are dropped"
        )
    if args.calibrate:
        return _calibrate_here(args)
    return 0


def _calibrate_here(args: argparse.Namespace) -> int:
    """Form the unit with every rank on this host and print the formation's timings."""
    import asyncio  # noqa: PLC0415 - only --calibrate runs an engine
    import os  # noqa: PLC0415
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    from runtime.engines.reference import ReferenceEngine  # noqa: PLC0415 - imports torch
    from runtime.membership import Membership  # noqa: PLC0415
    from runtime.ports import free_port  # noqa: PLC0415

    port = free_port()
    follower = (
        "import sys; from runtime.engines.reference import run_worker; from runtime.membership import Membership; "
        "rank, port, n, model, prefill, decode = sys.argv[1:7]; "
        "run_worker(Membership(unit_id='plan', revision='plan', rank=int(rank), world_size=int(n), "
        "dist_host='127.0.0.1', dist_port=int(port)), model=model, prefill=prefill, decode=decode, threads=1)"
    )
    repo = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=repo)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", follower, str(r), str(port), str(args.nodes), args.model, args.prefill, args.decode],
            env=env,
            cwd=repo,
        )
        for r in range(1, args.nodes)
    ]

    async def lead() -> str:
        m = Membership(
            unit_id="plan", revision="plan", rank=0, world_size=args.nodes, dist_host="127.0.0.1", dist_port=port
        )
        engine = ReferenceEngine(m, model=args.model, prefill=args.prefill, decode=args.decode, threads=1)
        await engine.start()
        try:
            assert engine.calibration is not None
            return engine.calibration.describe()
        finally:
            await engine.shutdown()

    try:
        print(asyncio.run(lead()))
    finally:
        for p in procs:
            p.wait(timeout=60)
    return 0
