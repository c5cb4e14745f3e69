"""`python -m runtime plan --engine neuron ...`: print every rank's environment, command and config.

The `plan` subcommand's dispatcher owns --engine, --model and --nodes; this module adds the
Neuron-only flags and renders the plan as JSON (one document, stable key order), with the unit size
the planner recommends for the model at this batch and sequence length, and why.
"""

from __future__ import annotations

import argparse
import json
import sys

from contract.layout import AUTO, LayoutError
from contract.llama import ShapeError, load_config_json
from contract.trainium import INSTANCES
from runtime.engines.neuron.launch import (
    DEFAULT_COMPILED_DIR,
    NeuronOptions,
    Recommendation,
    plan_unit,
    recommend,
)


def _degree(text: str) -> int | str:
    if text == AUTO:
        return AUTO
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer or 'auto'") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def add_neuron_plan_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("neuron engine")
    group.add_argument(
        "--instance-type",
        default="trn1.32xlarge",
        help=f"one of {', '.join(sorted(INSTANCES))} (default trn1.32xlarge)",
    )
    group.add_argument(
        "--leader-host",
        default="LEADER_HOST",
        help="leader's address as rendezvous will report it (default: the placeholder LEADER_HOST)",
    )
    group.add_argument(
        "--seq-len",
        type=int,
        default=NeuronOptions.seq_len,
        help="max model length, prompt + output (default %(default)s)",
    )
    group.add_argument(
        "--batch-size",
        type=int,
        default=NeuronOptions.batch_size,
        help="sequences decoded together (default %(default)s)",
    )
    group.add_argument(
        "--cp-degree", type=_degree, default=AUTO, help="context-parallel degree for prefill, or 'auto' (default)"
    )
    group.add_argument(
        "--attention-dp-degree",
        type=_degree,
        default=AUTO,
        help="attention data-parallel degree for decode, or 'auto' (default)",
    )
    group.add_argument(
        "--served-model-name", default=None, help="name clients pass as 'model' (default: the --model path)"
    )
    group.add_argument(
        "--compiled-dir", default=DEFAULT_COMPILED_DIR, help="where NxD Inference keeps compiled artifacts on the node"
    )


def run_neuron_plan(args: argparse.Namespace, out=None, err=None) -> int:
    """Print the plan; on bad input print one error line naming the input and the fix, exit 2."""
    out, err = out or sys.stdout, err or sys.stderr
    try:
        shape = load_config_json(args.model)
        plan = plan_unit(
            leader_host=args.leader_host,
            nodes=args.nodes,
            instance_type=args.instance_type,
            model=shape,
            model_dir=str(args.model),
            options=NeuronOptions(
                seq_len=args.seq_len,
                batch_size=args.batch_size,
                cp_degree=args.cp_degree,
                attention_dp_degree=args.attention_dp_degree,
                served_model_name=args.served_model_name,
                compiled_artifacts_dir=args.compiled_dir,
            ),
        )
    except (ShapeError, LayoutError) as exc:
        print(f"error: {exc}", file=err)
        return 2
    rec = recommend(shape, args.instance_type, seq_len=args.seq_len, batch_size=args.batch_size)
    doc = plan.to_dict()
    doc["recommendation"] = recommendation_dict(rec)
    json.dump(doc, out, indent=2)
    out.write("\n")
    if rec.nodes != args.nodes:
        print(f"note: --nodes {args.nodes}: the planner recommends {_nodes(rec)}: {rec.why}", file=err)
    return 0


def _nodes(rec: Recommendation) -> str:
    return f"--nodes {rec.nodes} ({rec.mode})" if rec.nodes else "no unit size"


def recommendation_dict(rec: Recommendation) -> dict:
    gib = 2**30
    return {
        "nodes": rec.nodes,
        "mode": rec.mode,
        "base_image": rec.image.base_image if rec.image else None,
        "dockerfile": rec.image.dockerfile if rec.image else None,
        "memory_per_core_gib": {
            "weights": round(rec.memory.weights / gib, 2),
            "kv_cache": round(rec.memory.kv_cache / gib, 2),
            "usable": round(rec.memory.usable / gib, 2),
        },
        "why": rec.why,
    }
