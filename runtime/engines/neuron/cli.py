"""`python -m runtime plan --engine neuron ...`: print every rank's environment, command and config.

The `plan` subcommand's dispatcher owns --engine, --model and --nodes; this module adds the
Neuron-only flags and renders the plan as JSON (one document, stable key order).
"""

from __future__ import annotations

import argparse
import json
import sys

from contract.trainium import INSTANCES
from runtime.engines.neuron.launch import AUTO, DEFAULT_COMPILED_DIR, NeuronOptions, NeuronPlanError, plan_unit
from runtime.engines.neuron.model import ModelConfigError, load_model_shape


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
        shape = load_model_shape(args.model)
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
    except (ModelConfigError, NeuronPlanError) as exc:
        print(f"error: {exc}", file=err)
        return 2
    json.dump(plan.to_dict(), out, indent=2)
    out.write("\n")
    return 0
