"""`flotilla plan`: size a unit and the fleet for a model and a traffic target, write the config.

Needs no AWS access: it is arithmetic on the model's shape and the hardware figures in
docs/hardware.md. Every latency it prints is a lower bound, every count a minimum. It says which
Neuron image the unit runs (one node: the V1 plugin; more: NxD Inference under our leader/follower
loop) and why.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

from contract.bad_input import NOT_GIVEN
from contract.declare import Integer, Number
from contract.llama import preset_names, preset_of
from contract.trainium import GIB, INSTANCES
from ops.capacity import (
    Plan,
    PlanError,
    PlanModel,
    PlanSettings,
    Traffic,
    bad_plan_input,
    model_from_config_json,
    model_from_flags,
    model_from_preset,
    plan,
)
from ops.commands import Subparsers
from ops.commands.common import add_deprecated_alias
from ops.deploy_config import config_error
from ops.errors import UsageError, bad_arg, check_arg
from ops.rollout_sim import ROLLOUTS, FleetModel, Recommendation, recommend_wave


def add_parser(sub: Subparsers) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "plan",
        help="capacity planner: nodes per unit, parallel degrees, memory, units, config",
        description="Size a unit (nodes, tp_degree, memory per NeuronCore) and the "
        "fleet (units, cells) for a model and a traffic target; print or --write the "
        "flotilla config. Latencies are roofline lower bounds (docs/hardware.md).",
    )
    m = p.add_argument_group("model (flags override --config-json)")
    m.add_argument("--config-json", metavar="PATH", help="a Hugging Face config.json (Llama family)")
    m.add_argument("--preset", metavar="NAME", help=f"a known model: {', '.join(preset_names())}")
    m.add_argument("--name", help="model name (default: the config.json's folder)")
    m.add_argument("--params", type=float, help="total parameters, e.g. 70e9 (default: counted from the shape)")
    m.add_argument("--layers", type=int)
    m.add_argument("--hidden", type=int)
    m.add_argument("--heads", type=int, help="attention (query) heads")
    m.add_argument("--kv-heads", type=int, help="key/value heads (grouped-query attention)")
    m.add_argument("--head-dim", type=int, help="default: hidden / heads")
    m.add_argument("--intermediate", type=int, help="MLP width")
    m.add_argument("--vocab", type=int, help="vocabulary size")
    m.add_argument("--tied-embeddings", action="store_true", default=None)
    m.add_argument("--context-length", type=int)
    m.add_argument("--dtype", help="weights: bfloat16 (default), float16, float32, fp8, int8")
    t = p.add_argument_group("traffic")
    t.add_argument("--rps", type=float, required=True, help="peak requests per second")
    t.add_argument("--prompt-tokens", type=int, required=True, help="prompt tokens per request")
    t.add_argument("--output-tokens", type=int, required=True, help="output tokens per request")
    s = p.add_argument_group("unit and fleet")
    d = PlanSettings()
    s.add_argument("--instance-type", default=d.instance_type, choices=sorted(INSTANCES))
    s.add_argument(
        "--batch-size",
        type=int,
        default=d.batch,
        help="sequences a unit decodes at once (its max_running; the neuron engine's --batch-size); "
        "default %(default)s",
    )
    add_deprecated_alias(s, "--batch", "--batch-size", dest="batch_size", type=int)
    s.add_argument("--seq-len", type=int, help="KV-cache tokens per sequence (default: prompt + output)")
    s.add_argument("--kv-dtype", help="KV-cache dtype (default: --dtype)")
    s.add_argument(
        "--hbm-reserve",
        type=float,
        default=d.hbm_reserve,
        help="fraction of HBM kept for runtime and activations; default %(default)s",
    )
    s.add_argument("--max-nodes", type=int, default=d.max_nodes, help="largest unit to consider")
    s.add_argument(
        "--efficiency",
        type=float,
        default=d.efficiency,
        help="measured fraction of the roofline a unit reaches (0-1]; default %(default)s",
    )
    s.add_argument(
        "--units-per-cell",
        type=int,
        metavar="N",
        help="units per cell (default: the config's 20; written only when given: it is fixed once deployed)",
    )
    s.add_argument("--availability-zones", help="comma-separated AZs for the config, e.g. us-east-1a,us-east-1b")
    s.add_argument(
        "--pad-heads",
        action="store_true",
        help="allow head counts tp_degree does not divide (NeuronCores get padded heads)",
    )
    r = p.add_argument_group(
        "rollout (a simulated fleet rollout recommends units_per_wave, ops/rollout_sim.py; for a config "
        "you already have: flotilla rollout plan --config PATH)"
    )
    r.add_argument(
        "--rollout", choices=ROLLOUTS, default="surge", help="unit_rollout of the config; default %(default)s"
    )
    r.add_argument(
        "--load-minutes", type=float, default=10.0, help="how long a unit takes to load the model; default %(default)s"
    )
    r.add_argument(
        "--spare-nodes",
        type=int,
        metavar="N",
        help="surge: Trainium instances available beyond the fleet (a rolling unit needs nodes_per_unit more)",
    )
    r.add_argument(
        "--node-failures-per-day",
        type=float,
        default=0.0,
        metavar="RATE",
        help="failures per node per day to simulate during the rollout; default %(default)s",
    )
    o = p.add_argument_group("output")
    o.add_argument(
        "--write",
        metavar="PATH",
        help="write the flotilla config YAML here: a config `make deploy CONFIG=PATH` takes as it is (needs "
        "--model-uri)",
    )
    o.add_argument(
        "--model-uri",
        metavar="S3_URI",
        help="the config's model.s3_uri: where `flotilla publish` put the model (needed with --write)",
    )
    o.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(handler=run)
    return p


def model_from_args(args: argparse.Namespace) -> PlanModel:
    flags = dict(
        layers=args.layers,
        hidden=args.hidden,
        heads=args.heads,
        kv_heads=args.kv_heads,
        head_dim=args.head_dim,
        intermediate=args.intermediate,
        vocab=args.vocab,
        tied_embeddings=args.tied_embeddings,
        context_length=args.context_length,
        dtype=args.dtype,
        params=int(args.params) if args.params is not None else None,
        name=args.name,
    )
    if args.config_json and args.preset:
        raise bad_plan_input("--preset", args.preset, "is given with --config-json", "describe the model with one")
    if args.config_json:
        return model_from_config_json(args.config_json, **flags)
    if args.preset:
        return model_from_preset(args.preset, **flags)
    missing = [f"--{k.replace('_', '-')}" for k in ("layers", "hidden", "heads", "context_length") if flags[k] is None]
    if missing:
        raise bad_plan_input(
            "--config-json",
            NOT_GIVEN,
            f"is not given and neither are {', '.join(missing)}",
            f"describe the model with --config-json PATH, --preset NAME or {', '.join(missing)}",
        )
    return model_from_flags(**{k: v for k, v in flags.items() if v is not None})


def settings_from_args(args: argparse.Namespace) -> PlanSettings:
    azs = tuple(a.strip() for a in args.availability_zones.split(",") if a.strip()) if args.availability_zones else ()
    if azs and not 2 <= len(azs) <= 6:
        raise bad_arg(
            "--availability-zones", args.availability_zones, f"names {len(azs)} AZ(s)", "give 2 to 6 AZs (or none)"
        )
    return PlanSettings(
        instance_type=args.instance_type,
        batch=args.batch_size,
        seq_len=args.seq_len,
        kv_dtype=args.kv_dtype,
        hbm_reserve=args.hbm_reserve,
        max_nodes=args.max_nodes,
        efficiency=args.efficiency,
        units_per_cell=args.units_per_cell,
        availability_zones=azs,
        pad_heads=args.pad_heads,
    )


def config_yaml(p: Plan, rollout: dict[str, Any] | None = None, model_uri: str | None = None) -> str:
    header = (
        f"# flotilla config from `flotilla plan` for {p.model.name}: {p.traffic.requests_per_s:g} req/s, "
        f"{p.traffic.prompt_tokens} prompt + {p.traffic.output_tokens} output tokens.\n"
        "# Units are a roofline minimum at --efficiency "
        f"{p.settings.efficiency:g}; add headroom for failures and rollouts.\n"
        f"# {p.mode} units: with node.engine neuron the image is built from {p.image.dockerfile} "
        f"(FROM {p.image.base_image}).\n"
    )
    doc: dict[str, Any] = {**p.config(), **(rollout or {})}
    if model_uri:
        # The shape too: synth checks the units' layout against it (docs/model-layout.md). A known
        # model's by its preset name, any other's by its config.json fields.
        shape = p.model.shape
        doc["model"] = {"s3_uri": model_uri, "name": p.model.name, "shape": preset_of(shape) or shape.layout_fields()}
    body: str = yaml.safe_dump(doc, sort_keys=False)
    return header + body


def rollout_recommendation(p: Plan, args: argparse.Namespace) -> Recommendation:
    """Simulate the planned fleet rolling at candidate wave sizes; the traffic level is the planned
    rps against the units' capacity (so a fleet sized without headroom cannot roll with `replace`)."""
    check_arg("--load-minutes", args.load_minutes, Number(0))
    check_arg("--node-failures-per-day", args.node_failures_per_day, Number(0))
    if args.spare_nodes is not None:
        check_arg("--spare-nodes", args.spare_nodes, Integer(0))
    capacity = p.units * p.requests_per_s_per_unit
    model = FleetModel(
        units=p.units,
        nodes_per_unit=p.nodes_per_unit,
        units_per_cell=min(p.settings.cell_size, p.units),
        rollout=args.rollout,
        load_s=args.load_minutes * 60.0,
        node_failures_per_node_day=args.node_failures_per_day,
        traffic=p.traffic.requests_per_s / capacity if capacity > 0 else 1.0,
        unit_rps=p.requests_per_s_per_unit,
    )
    return recommend_wave(model, spare_nodes=args.spare_nodes, seeds=range(3))


def render_rollout(rec: Recommendation, console: Console) -> None:
    t = Table(title="Rollout (simulated, ops/rollout_sim.py; worst of 3 seeds)")
    for col in ("units per wave", "rollout", "min units in rotation", "below floor", "requests shed"):
        t.add_column(col, justify="right")
    for s in rec.table:
        mark = " *" if s.units_per_wave == rec.units_per_wave else ""
        t.add_row(
            f"{s.units_per_wave}{mark}",
            f"{s.duration_s / 3600:.1f} h",
            str(s.min_in_rotation),
            f"{s.below_floor_s / 60:.0f} min",
            f"{s.shed_share:.2%}",
        )
    console.print(t)
    console.print(f"units_per_wave {rec.units_per_wave} (*): {rec.why}")


def neuron_layout(p: Plan) -> str:
    """What a neuron unit of this size really runs in each phase (runtime/engines/neuron/launch.py):
    NxD Inference's context encoding (prefill) and token generation (decode) are both tensor parallel
    over every NeuronCore of the unit, and the bounds below model exactly that."""
    if p.nodes_per_unit == 1:
        return (
            f"prefill and decode tensor parallel over {p.tp_degree} NeuronCores; cp_degree / attention_dp_degree "
            "per phase where the heads need them (`python -m runtime plan --engine neuron` prints them)"
        )
    return (
        f"prefill (context encoding) and decode (token generation) both tensor parallel, tp_degree={p.tp_degree}, "
        f"cp_degree=1, attention_dp_degree=1; node k holds NeuronCore ranks "
        f"{p.instance.neuron_cores}k..{p.instance.neuron_cores}(k+1)-1"
    )


def plan_dict(p: Plan) -> dict[str, Any]:
    return {
        "model": {
            "name": p.model.name,
            "params": p.model.total_params,
            "layers": p.model.shape.num_hidden_layers,
            "hidden": p.model.shape.hidden_size,
            "heads": p.model.shape.num_attention_heads,
            "kv_heads": p.model.shape.num_key_value_heads,
            "head_dim": p.model.shape.head_dim,
            "dtype": p.model.shape.dtype,
        },
        "nodes_per_unit": p.nodes_per_unit,
        "mode": p.mode,
        "image": {
            "dockerfile": p.image.dockerfile,
            "base_image": p.image.base_image,
            "vllm": p.image.vllm,
            "server": p.image.server,
        },
        "why": p.why,
        "tp_degree": p.tp_degree,
        "neuron_layout": neuron_layout(p),
        "q_heads_per_core": p.q_heads_per_core,
        "kv_heads_per_core": p.kv_heads_per_core,
        "seq_len": p.seq_len,
        "batch": p.settings.batch,
        "memory_per_core_bytes": {
            "weights": p.memory.weights,
            "kv_cache": p.memory.kv_cache,
            "total": p.memory.total,
            "usable": p.memory.usable,
            "hbm": p.memory.hbm,
        },
        "decode_step_s": p.decode_step_s,
        "decode_hbm_s": p.decode_hbm_s,
        "decode_efa_s": p.decode_efa_s,
        "decode_tokens_per_s_per_unit": p.decode_tokens_per_s,
        "prefill_unit_s": p.prefill_unit_s,
        "prefill_compute_s": p.prefill_compute_s,
        "prefill_efa_s": p.prefill_efa_s,
        "ttft_s": p.ttft_s,
        "requests_per_s_per_unit": p.requests_per_s_per_unit,
        "units": p.units,
        "cells": p.cells,
        "total_nodes": p.total_nodes,
        "skipped": list(p.skipped),
        "config": p.config(),
    }


def rollout_dict(rec: Recommendation) -> dict[str, Any]:
    return {
        "units_per_wave": rec.units_per_wave,
        "why": rec.why,
        "simulated": [
            {
                "units_per_wave": s.units_per_wave,
                "duration_s": s.duration_s,
                "min_in_rotation": s.min_in_rotation,
                "below_floor_s": s.below_floor_s,
                "shed_share": s.shed_share,
            }
            for s in rec.table
        ],
    }


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.2f} ms"


def render(p: Plan, console: Console) -> None:
    unit = Table(title=f"Unit for {p.model.name} on {p.instance.instance_type}", show_header=False)
    unit.add_row("nodes per unit", f"{p.nodes_per_unit} ({p.mode})")
    unit.add_row("image", f"{p.image.dockerfile} (FROM {p.image.base_image})")
    unit.add_row("why", p.why)
    unit.add_row("tp_degree", f"{p.tp_degree} (= {p.instance.neuron_cores} NeuronCores x {p.nodes_per_unit})")
    unit.add_row("neuron launch", neuron_layout(p))
    replicated = " (KV heads replicated)" if p.model.shape.num_key_value_heads < p.tp_degree else ""
    unit.add_row("heads per NeuronCore", f"{p.q_heads_per_core} query, {p.kv_heads_per_core} KV{replicated}")
    for why in p.skipped:
        unit.add_row("not smaller because", why)
    console.print(unit)

    mem = Table(title="Memory per NeuronCore", show_header=True)
    for col in ("weights", f"KV cache ({p.settings.batch} x {p.seq_len} tokens)", "total", "usable", "HBM"):
        mem.add_column(col, justify="right")
    mem.add_row(
        *(
            f"{b / GIB:.2f} GiB"
            for b in (p.memory.weights, p.memory.kv_cache, p.memory.total, p.memory.usable, p.memory.hbm)
        )
    )
    console.print(mem)

    bounds = Table(title="Lower bounds (roofline; docs/hardware.md)", show_header=False)
    bounds.add_row("decode step", f"{_ms(p.decode_step_s)} = HBM {_ms(p.decode_hbm_s)} + EFA {_ms(p.decode_efa_s)}")
    bounds.add_row("decode tokens/s per unit", f"{p.decode_tokens_per_s:,.0f} (batch {p.settings.batch})")
    bounds.add_row(
        "prefill per request",
        f"{_ms(p.prefill_unit_s)} of unit time = compute {_ms(p.prefill_compute_s)} + EFA {_ms(p.prefill_efa_s)}",
    )
    bounds.add_row("time to first token", _ms(p.ttft_s))
    bounds.add_row("requests/s per unit", f"{p.requests_per_s_per_unit:,.3f} (efficiency {p.settings.efficiency:g})")
    console.print(bounds)

    fleet = Table(title=f"Fleet for {p.traffic.requests_per_s:g} req/s", show_header=False)
    fleet.add_row("units", str(p.units))
    fleet.add_row("cells", f"{p.cells} (<= {p.settings.cell_size} units each)")
    fleet.add_row("nodes", f"{p.total_nodes} {p.instance.instance_type}")
    fleet.add_row("Trainium chips", str(p.total_nodes * p.instance.chips))
    console.print(fleet)


def check_deployable(args: argparse.Namespace, text: str) -> None:
    """--write writes only a config the CDK app takes as it is: validated by its own loader first."""
    if not args.model_uri:
        raise bad_arg(
            "--model-uri",
            NOT_GIVEN,
            "is needed with --write",
            "give the s3://bucket/prefix/ `flotilla publish` put the model at, so the written config serves it",
        )
    problem = config_error(text)
    if problem is not None:
        raise bad_arg("--write", args.write, f"would write a config `cdk synth` refuses ({problem})", "fix that input")


def run(args: argparse.Namespace, console: Console) -> int:
    try:
        result = plan(
            model_from_args(args),
            Traffic(requests_per_s=args.rps, prompt_tokens=args.prompt_tokens, output_tokens=args.output_tokens),
            settings_from_args(args),
        )
        rec = rollout_recommendation(result, args)
    except PlanError as err:
        raise UsageError(str(err)) from None
    rollout = {"unit_rollout": args.rollout, "units_per_wave": rec.units_per_wave}
    text = config_yaml(result, rollout, args.model_uri)
    if args.write:
        check_deployable(args, text)
    if args.json:
        doc = plan_dict(result)
        doc["config"].update(rollout)
        doc["rollout"] = rollout_dict(rec)
        console.print_json(json.dumps(doc))
    else:
        render(result, console)
        render_rollout(rec, console)
        console.print("flotilla config:", style="bold")
        console.print(text, markup=False, highlight=False)
    if args.write:
        Path(args.write).write_text(text)
        if not args.json:
            console.print(f"wrote {args.write}")
    return 0
