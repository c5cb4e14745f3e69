"""Capacity planner: from a model's shape and a traffic target to nodes per unit, parallel degrees,
memory per NeuronCore, units needed, the Neuron image the unit runs, and the flotilla config.

Every figure is a roofline bound (HBM bandwidth, peak FLOPS, EFA bandwidth; docs/hardware.md), so
latencies are lower bounds and unit counts are minimums; `efficiency` derates them to measurements.
A unit is one node whenever the model and its KV cache fit one; only when they do not does it span
nodes, running NxD Inference split over every node's NeuronCores (contract/neuron.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from contract import MAX_UNITS_PER_CELL
from contract.bad_input import NOT_GIVEN, BadInput
from contract.declare import Number, Rule, checked, rule_of
from contract.layout import heads_fit
from contract.llama import DTYPE_BYTES, LlamaShape, ShapeError, load_config_json, preset, preset_names
from contract.neuron import NeuronImage, image_for, mode_for
from contract.sizing import CoreMemory, core_memory
from contract.trainium import GIB, TrainiumInstance
from ops.errors import arg_line
from ops.hardware import instance_spec


class PlanError(ValueError):
    """Input the planner cannot satisfy; the message names the input and the fix."""


def bad_plan_input(flag: str, value: Any, problem: str, fix: str) -> PlanError:
    """A `flotilla plan` argument the planner cannot use, worded as every CLI argument error."""
    return PlanError(arg_line(flag, value, problem, fix))


def dtype_bytes(dtype: str, *, what: str = "--dtype") -> int:
    try:
        return DTYPE_BYTES[dtype.lower()]
    except KeyError:
        raise bad_plan_input(what, dtype, "is not known", f"use one of {', '.join(DTYPE_BYTES)}") from None


def _check(flag: str, value: Any, rule: Rule) -> None:
    """Refuse a value `rule` (contract.declare) does not take, in its words, as a PlanError."""
    try:
        checked(flag, value, rule)
    except BadInput as err:
        raise bad_plan_input(flag, value, err.problem, err.fix) from None


POSITIVE = Number(0, above=True)


def _config_rule(key: str) -> Rule:
    """The deployment config's rule for `key` (stacks/config.py), for a flag that plans that key."""
    from stacks.config import FlotillaConfig  # noqa: PLC0415 - stacks/ only when such a flag is given

    rule = rule_of(FlotillaConfig.model_fields[key].metadata)
    if rule is None:
        raise TypeError(f"config key {key} declares no contract.declare rule")
    return rule


def _positive(name: str, value: float | int | None) -> None:
    if value is None:
        raise bad_plan_input(name, NOT_GIVEN, "is not given", f"give {POSITIVE.allowed}")
    _check(name, value, POSITIVE)


@dataclass(frozen=True, kw_only=True)
class PlanModel:
    """The model `flotilla plan` sizes: its shape (contract/llama.py, the declaration the node and synth
    check), the name the operator knows it by, and its parameter count when told one."""

    shape: LlamaShape
    name: str = "model"
    params: int | None = None  # replaces the count from the shape (e.g. a model with extra parts)

    @property
    def total_params(self) -> int:
        return self.params if self.params is not None else self.shape.params

    @property
    def context_length(self) -> int:
        return self.shape.max_position_embeddings


def model_from_flags(
    *,
    layers: int | None,
    hidden: int | None,
    heads: int | None,
    kv_heads: int | None = None,
    context_length: int | None,
    intermediate: int | None = None,
    vocab: int | None = None,
    head_dim: int | None = None,
    tied_embeddings: bool = False,
    dtype: str = "bfloat16",
    params: int | None = None,
    name: str = "model",
) -> PlanModel:
    """The model described flag by flag; every refusal names the flag to fix."""
    for flag, value in (
        ("--layers", layers),
        ("--hidden", hidden),
        ("--heads", heads),
        ("--context-length", context_length),
    ):
        _positive(flag, value)
    assert layers and hidden and heads and context_length  # _positive refused None and <= 0
    kv_heads = heads if kv_heads is None else kv_heads
    _positive("--kv-heads", kv_heads)
    dtype_bytes(dtype)
    if heads % kv_heads:
        raise bad_plan_input(
            "--heads",
            heads,
            f"is not a multiple of --kv-heads {kv_heads} (grouped-query attention shares each KV "
            "head among a whole number of query heads)",
            "give a --kv-heads that divides --heads",
        )
    if head_dim is None and hidden % heads:
        raise bad_plan_input("--hidden", hidden, f"is not divisible by --heads {heads}", "give --head-dim explicitly")
    if intermediate is None or vocab is None:
        missing = "--intermediate" if intermediate is None else "--vocab"
        raise bad_plan_input(
            missing,
            NOT_GIVEN,
            "is not given: the layout check needs the MLP width and the vocabulary",
            "give --intermediate and --vocab, or describe the model with --config-json PATH or --preset",
        )
    _positive("--intermediate", intermediate)
    _positive("--vocab", vocab)
    if params is not None:
        _positive("--params", params)
    shape = LlamaShape(
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        hidden_size=hidden,
        intermediate_size=intermediate,
        vocab_size=vocab,
        max_position_embeddings=context_length,
        head_dim=head_dim or 0,
        tie_word_embeddings=tied_embeddings,
        dtype=dtype,
    )
    return PlanModel(shape=shape, name=name, params=params)


def model_from_config_json(path: str | Path, **overrides: Any) -> PlanModel:
    """A Hugging Face config.json (Llama family); flags given in `overrides` win."""
    p = Path(path)
    if not p.is_file():
        raise bad_plan_input("--config-json", str(p), "is not a file", "give the path of the model's config.json")
    try:
        shape = load_config_json(p)
    except ShapeError as err:
        raise bad_plan_input("--config-json", str(p), f"is not a usable config.json ({err})", "fix the file") from None
    return override_model(PlanModel(shape=shape, name=p.parent.name or "model"), **overrides)


def model_from_preset(preset_name: str, **overrides: Any) -> PlanModel:
    shape = preset(preset_name)
    if shape is None:
        raise bad_plan_input("--preset", preset_name, "is not a known model", f"use one of {', '.join(preset_names())}")
    return override_model(PlanModel(shape=shape, name=preset_name), **overrides)


# Flags that may override a shape read from a file or a preset, and the config.json field each sets.
_OVERRIDES = {
    "layers": "num_hidden_layers",
    "hidden": "hidden_size",
    "heads": "num_attention_heads",
    "kv_heads": "num_key_value_heads",
    "head_dim": "head_dim",
    "intermediate": "intermediate_size",
    "vocab": "vocab_size",
    "tied_embeddings": "tie_word_embeddings",
    "context_length": "max_position_embeddings",
    "dtype": "dtype",
}


def override_model(model: PlanModel, **overrides: Any) -> PlanModel:
    given = {k: v for k, v in overrides.items() if v is not None}
    fields = {_OVERRIDES[k]: v for k, v in given.items() if k in _OVERRIDES}
    raw = {**model.shape.as_dict(), **fields}
    if "dtype" in fields:
        dtype_bytes(str(fields["dtype"]))
    shape = model.shape
    if fields:
        try:
            shape = LlamaShape.from_config(raw, source="the model flags")
        except ShapeError as err:
            raise bad_plan_input("--config-json", NOT_GIVEN, f"with these flags: {err}", "fix the flags") from None
    return replace(model, shape=shape, name=given.get("name", model.name), params=given.get("params", model.params))


@dataclass(frozen=True, kw_only=True)
class Traffic:
    requests_per_s: float
    prompt_tokens: int
    output_tokens: int

    def __post_init__(self) -> None:
        _positive("--rps", self.requests_per_s)
        _positive("--prompt-tokens", self.prompt_tokens)
        _positive("--output-tokens", self.output_tokens)


@dataclass(frozen=True, kw_only=True)
class PlanSettings:
    instance_type: str = "trn1.32xlarge"
    batch: int = 16  # sequences a unit decodes at once (its max_running)
    seq_len: int | None = None  # KV-cache length per sequence; prompt + output when None
    kv_dtype: str | None = None  # the model's dtype when None
    hbm_reserve: float = 0.10  # HBM kept back for the runtime, activations, scratch
    max_nodes: int = 8
    efficiency: float = 1.0  # measured fraction of the roofline a unit reaches
    # None: the config's default (20). Fixed once deployed (a new value moves units to other cells), so
    # a written config carries it only when asked for.
    units_per_cell: int | None = None
    availability_zones: tuple[str, ...] = ()
    pad_heads: bool = False  # allow head counts tp_degree does not divide (padded heads)

    @property
    def cell_size(self) -> int:
        """Units per cell the fleet is laid out with."""
        return self.units_per_cell or MAX_UNITS_PER_CELL

    def __post_init__(self) -> None:
        try:
            instance_spec(self.instance_type)
        except ValueError as err:  # its message says which types are supported and why
            problem, _, fix = str(err).removeprefix(f"instance type {self.instance_type!r} ").partition(": ")
            raise bad_plan_input("--instance-type", self.instance_type, problem, fix) from None
        _positive("--batch-size", self.batch)
        _positive("--max-nodes", self.max_nodes)
        if self.seq_len is not None:
            _positive("--seq-len", self.seq_len)
        if self.kv_dtype is not None:
            dtype_bytes(self.kv_dtype, what="--kv-dtype")
        _check("--hbm-reserve", self.hbm_reserve, Number(0, 1, "a fraction", below=True))
        _check("--efficiency", self.efficiency, Number(0, 1, "a fraction", above=True))
        if self.units_per_cell is not None:
            _check("--units-per-cell", self.units_per_cell, _config_rule("units_per_cell"))


@dataclass(frozen=True)
class Plan:
    model: PlanModel
    traffic: Traffic
    settings: PlanSettings
    instance: TrainiumInstance
    nodes_per_unit: int
    # Prefill (NxD Inference's context encoding) and decode (token generation) both tensor parallel
    # over every NeuronCore of the unit, as the neuron launch configures them across nodes.
    tp_degree: int
    q_heads_per_core: int
    kv_heads_per_core: int  # 1 when KV heads are replicated (kv_heads < tp_degree)
    seq_len: int
    memory: CoreMemory
    decode_hbm_s: float  # one decode step: bytes each NeuronCore reads / its HBM bandwidth
    decode_efa_s: float  # one decode step: inter-node all-reduce traffic / EFA bandwidth
    prefill_compute_s: float  # unit time one prompt costs at peak FLOPS over all nodes
    prefill_efa_s: float  # one prompt: context encoding's inter-node all-reduce traffic / EFA
    units: int
    skipped: tuple[str, ...] = field(default=())  # node counts tried and why they do not work

    @property
    def mode(self) -> str:
        """single-node or multi-node: which Neuron image (contract/neuron.py) the unit runs."""
        return mode_for(self.nodes_per_unit)

    @property
    def image(self) -> NeuronImage:
        return image_for(self.nodes_per_unit)

    @property
    def why(self) -> str:
        """Why this unit size and image, in one sentence an operator can check."""
        m = self.memory
        need = (
            f"{m.total / GIB:.2f} GiB per NeuronCore (weights {m.weights / GIB:.2f} + KV cache "
            f"{m.kv_cache / GIB:.2f} for {self.settings.batch} x {self.seq_len} tokens) <= {m.usable / GIB:.2f} "
            "GiB usable"
        )
        if self.nodes_per_unit == 1:
            return (
                f"fits one {self.instance.instance_type}: {need}; single-node units run {self.image.base_image} "
                f"({self.image.vllm}) with the OpenAI server"
            )
        return (
            f"does not fit one {self.instance.instance_type} ({self.skipped[0].split(': ', 1)[1]}); "
            f"{self.nodes_per_unit} nodes: {need} with the weights sharded over all {self.tp_degree} NeuronCores "
            f"(NxD Inference tp_degree={self.tp_degree}, one start_rank_id per node); multi-node units run "
            f"{self.image.base_image} ({self.image.vllm})"
        )

    @property
    def decode_step_s(self) -> float:
        # Each layer's all-reduce gates the next layer, so the two bounds add up.
        return self.decode_hbm_s + self.decode_efa_s

    @property
    def decode_tokens_per_s(self) -> float:
        return self.settings.batch / self.decode_step_s

    @property
    def prefill_unit_s(self) -> float:
        # As in decode, each layer's all-reduce gates the next layer: compute and EFA add up.
        return self.prefill_compute_s + self.prefill_efa_s

    @property
    def ttft_s(self) -> float:
        """First-token lower bound for one prompt: every node works on it at once (tensor parallel),
        and context encoding writes the KV cache in the layout decode reads, so nothing moves between."""
        return self.prefill_unit_s + self.decode_step_s

    @property
    def request_unit_s(self) -> float:
        """Unit time one request costs: its prefill plus its share of the batched decode steps."""
        return self.prefill_unit_s + self.traffic.output_tokens * self.decode_step_s / self.settings.batch

    @property
    def requests_per_s_per_unit(self) -> float:
        return self.settings.efficiency / self.request_unit_s

    @property
    def cells(self) -> int:
        return math.ceil(self.units / self.settings.cell_size)

    @property
    def total_nodes(self) -> int:
        return self.units * self.nodes_per_unit

    def config(self) -> dict[str, Any]:
        """The flotilla deployment config (stacks/config.py keys) this plan asks for."""
        cfg: dict[str, Any] = {
            "instance_type": self.instance.instance_type,
            "nodes_per_unit": self.nodes_per_unit,
            "units": self.units,
        }
        if self.settings.units_per_cell is not None:
            cfg["units_per_cell"] = self.settings.units_per_cell
        if self.settings.availability_zones:
            cfg["availability_zones"] = list(self.settings.availability_zones)
        # The sequence and batch the memory was sized at: synth checks the units' layout at these too
        # (docs/model-layout.md), and the nodes serve with them.
        cfg["node"] = {"neuron_seq_len": self.seq_len, "neuron_batch_size": self.settings.batch}
        return cfg


def plan(model: PlanModel, traffic: Traffic, settings: PlanSettings) -> Plan:
    """The smallest unit (1..max_nodes nodes) whose NeuronCores hold the model and the batch's KV
    cache, and how many such units the traffic needs; PlanError when none fits."""
    inst = instance_spec(settings.instance_type)
    w_bytes = dtype_bytes(model.shape.dtype)
    kv_bytes = dtype_bytes(settings.kv_dtype or model.shape.dtype, what="--kv-dtype")
    seq_len = _seq_len(model, traffic, settings)
    usable = inst.hbm_bytes_per_core * (1 - settings.hbm_reserve)
    skipped: list[str] = []
    smallest_need: CoreMemory | None = None
    for nodes in range(1, settings.max_nodes + 1):
        split_fails = _split_fails(model.shape, inst.neuron_cores * nodes, settings)
        if split_fails:
            skipped.append(f"{nodes} nodes: {split_fails}")
            continue
        # The one rule the runtime's planner and the layout check use too (contract/sizing.py).
        memory = core_memory(
            model.shape,
            inst,
            nodes=nodes,
            batch=settings.batch,
            seq_len=seq_len,
            hbm_reserve=settings.hbm_reserve,
            kv_dtype=settings.kv_dtype,
            params=model.params,
        )
        if smallest_need is None or memory.total < smallest_need.total:
            smallest_need = memory
        if not memory.fits:
            skipped.append(
                f"{nodes} nodes: {memory.total / GIB:.2f} GiB per NeuronCore > {usable / GIB:.2f} GiB usable"
            )
            continue
        one_unit = _one_unit(
            model,
            traffic,
            settings,
            inst,
            nodes=nodes,
            seq_len=seq_len,
            memory=memory,
            w_bytes=w_bytes,
            kv_bytes=kv_bytes,
        )
        units = max(1, math.ceil(traffic.requests_per_s / one_unit.requests_per_s_per_unit - 1e-9))
        return replace(one_unit, units=units, skipped=tuple(skipped))
    raise _no_unit_fits(model, settings, inst, skipped, smallest_need)


def _seq_len(model: PlanModel, traffic: Traffic, settings: PlanSettings) -> int:
    """The KV-cache length per sequence the plan sizes memory for: --seq-len, or a whole request."""
    seq_len = settings.seq_len or traffic.prompt_tokens + traffic.output_tokens
    if traffic.prompt_tokens + traffic.output_tokens > model.context_length:
        raise bad_plan_input(
            "--prompt-tokens",
            traffic.prompt_tokens,
            f"with --output-tokens {traffic.output_tokens} exceeds the model's context length {model.context_length}",
            "shorten the requests",
        )
    if seq_len > model.context_length:
        raise bad_plan_input(
            "--seq-len",
            seq_len,
            f"exceeds the model's context length {model.context_length}",
            f"give at most {model.context_length}, or drop it",
        )
    if seq_len < traffic.prompt_tokens + traffic.output_tokens:
        raise bad_plan_input(
            "--seq-len",
            seq_len,
            f"is shorter than a request ({traffic.prompt_tokens} prompt + {traffic.output_tokens} output tokens)",
            "raise --seq-len or drop it",
        )
    return seq_len


def _split_fails(shape: LlamaShape, tp: int, settings: PlanSettings) -> str | None:
    """Why tensor parallelism over tp NeuronCores cannot split the model, or None when it can: the
    node's own test of a split (contract/layout.py), with the padded-heads escape the planner offers."""
    if settings.pad_heads:
        return None
    if not heads_fit(shape, tp):
        heads_ok = shape.num_attention_heads % tp == 0
        why = f"{shape.num_attention_heads} heads" if not heads_ok else f"{shape.num_key_value_heads} KV heads"
        return f"tp_degree {tp} does not divide {why}"
    if shape.intermediate_size % tp:
        return f"tp_degree {tp} does not divide intermediate_size {shape.intermediate_size}"
    return None


def _one_unit(
    model: PlanModel,
    traffic: Traffic,
    settings: PlanSettings,
    inst: TrainiumInstance,
    *,
    nodes: int,
    seq_len: int,
    memory: CoreMemory,
    w_bytes: int,
    kv_bytes: int,
) -> Plan:
    """A one-unit plan of `nodes` nodes whose memory fits: its decode and prefill times, bounded by
    HBM bandwidth, FLOPS and EFA."""
    shape = model.shape
    tp = inst.neuron_cores * nodes
    q_per_core = math.ceil(shape.num_attention_heads / tp)
    kv_per_core = math.ceil(shape.num_key_value_heads / tp)
    kv_per_token = shape.num_hidden_layers * 2 * kv_per_core * shape.head_dim * kv_bytes
    # Decode: every NeuronCore reads its weights and its KV cache once per step.
    avg_context = traffic.prompt_tokens + traffic.output_tokens / 2
    step_bytes = memory.weights + settings.batch * avg_context * kv_per_token
    decode_hbm_s = step_bytes / inst.hbm_bytes_per_s_per_core
    # Two all-reduces per layer (attention out, MLP out) of batch x hidden activations; across
    # nodes a ring moves 2 (N-1)/N of the message through each node's EFA.
    message = settings.batch * shape.hidden_size * w_bytes
    inter_node = 2 * (nodes - 1) / nodes * message
    decode_efa_s = shape.num_hidden_layers * 2 * inter_node / inst.efa_bytes_per_s
    # Prefill: 2 FLOPs per parameter per prompt token (attention's quadratic term left out: a
    # lower bound), every node at once. Context encoding is tensor parallel over the same cores
    # as decode (cp_degree 1 across nodes, runtime/engines/neuron/launch.py): the same two
    # all-reduces per layer, of prompt x hidden activations, through each node's EFA.
    prefill_compute_s = 2 * model.total_params * traffic.prompt_tokens / (nodes * inst.bf16_flops)
    prompt_message = traffic.prompt_tokens * shape.hidden_size * w_bytes
    prefill_efa_s = shape.num_hidden_layers * 2 * (2 * (nodes - 1) / nodes * prompt_message) / inst.efa_bytes_per_s
    return Plan(
        model=model,
        traffic=traffic,
        settings=settings,
        instance=inst,
        nodes_per_unit=nodes,
        tp_degree=tp,
        q_heads_per_core=q_per_core,
        kv_heads_per_core=kv_per_core,
        seq_len=seq_len,
        memory=memory,
        decode_hbm_s=decode_hbm_s,
        decode_efa_s=decode_efa_s,
        prefill_compute_s=prefill_compute_s,
        prefill_efa_s=prefill_efa_s,
        units=1,
    )


def _no_unit_fits(
    model: PlanModel,
    settings: PlanSettings,
    inst: TrainiumInstance,
    skipped: list[str],
    smallest_need: CoreMemory | None,
) -> PlanError:
    """The error when no unit size works: no tensor-parallel degree splits the heads, or none fits."""
    shape = model.shape
    fits = f"fits no unit of {model.name} on 1..{settings.max_nodes} {inst.instance_type} nodes"
    if smallest_need is None:
        cores = inst.neuron_cores
        return bad_plan_input(
            "--heads",
            shape.num_attention_heads,
            f"{fits}: no tp_degree in {cores}..{cores * settings.max_nodes} ({cores} NeuronCores x "
            f"1..{settings.max_nodes} nodes) splits {shape.num_attention_heads} heads and "
            f"{shape.num_key_value_heads} KV heads evenly",
            f"use --pad-heads to plan with padded heads, or a model whose head count is a multiple of {cores} x nodes",
        )
    return bad_plan_input(
        "--max-nodes",
        settings.max_nodes,
        f"{fits} ({'; '.join(skipped)})",
        f"the least it needs is {smallest_need.total / GIB:.2f} GiB per NeuronCore; raise --max-nodes, lower "
        "--batch-size or --seq-len, or use a smaller --kv-dtype",
    )
