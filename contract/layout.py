"""Whether a unit can serve a model: the one layout-and-memory check. The node runs it at start (before
any weights move), `python -m runtime plan` runs it, and synth runs it on the deployment config, so a
layout the node would refuse never reaches a deploy.

Standard library only. A refusal is a contract.bad_input line naming the input in the caller's own
words (a flag, an environment variable, a config key: `Names`), the model, and the layouts that work.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from contract import Engine
from contract.bad_input import BadInput
from contract.llama import LlamaShape
from contract.sizing import DEFAULT_HBM_RESERVE, EAGLE_FC_INPUTS, CoreMemory, core_memory
from contract.trainium import GIB, INSTANCES

AUTO = "auto"
# What a neuron unit serves at unless told otherwise: prompt + output tokens (vLLM --max-model-len)
# and sequences decoded together (vLLM --max-num-seqs). The node's FLOTILLA_NEURON_SEQ_LEN /
# FLOTILLA_NEURON_BATCH_SIZE default to these, and synth checks a config at the values the node will use.
DEFAULT_SEQ_LEN = 4096
DEFAULT_BATCH_SIZE = 8
# Unit sizes the check offers as alternatives (the config allows up to 64 nodes per unit).
MAX_NODES = 64

# How each caller names the inputs in its refusals. The runtime's are the flags `python -m runtime plan`
# and the node share (the node also reads them from FLOTILLA_NEURON_*).
Names = Mapping[str, str]
RUNTIME_NAMES: Names = MappingProxyType(
    {
        "instance_type": "--instance-type",
        "nodes": "--nodes",
        "seq_len": "--seq-len",
        "batch_size": "--batch-size",
        "cp_degree": "--cp-degree",
        "attention_dp_degree": "--attention-dp-degree",
        "prefix_caching_block": "--neuron-prefix-caching-block",
    }
)


class LayoutError(BadInput):
    """A layout the engine cannot run. `setting` is the input at fault in the check's own terms
    (nodes, seq_len, ...); str() is the one line with the caller's name for it."""

    def __init__(self, setting: str, value: Any, problem: str, fix: str, *, names: Names) -> None:
        self.setting = setting
        super().__init__(names.get(setting, setting), value, problem, fix, text=True)


@dataclass(frozen=True)
class UnitLayout:
    """A layout the check accepted: the parallel degrees the engine will run with and, on Trainium,
    the memory each NeuronCore holds."""

    engine: str
    instance_type: str
    nodes: int
    seq_len: int
    batch_size: int
    tp_degree: int = 1
    cp_degree: int = 1
    attention_dp_degree: int = 1
    memory: CoreMemory | None = None


def check_layout(
    shape: LlamaShape,
    *,
    engine: str = "neuron",
    instance_type: str,
    nodes: int,
    seq_len: int = DEFAULT_SEQ_LEN,
    batch_size: int = DEFAULT_BATCH_SIZE,
    cp_degree: int | str = AUTO,
    attention_dp_degree: int | str = AUTO,
    prefix_caching_block: int = 0,
    hbm_reserve: float = DEFAULT_HBM_RESERVE,
    model: str = "the model",
    names: Names = RUNTIME_NAMES,
    speculation: str = "none",
    draft: LlamaShape | None = None,
) -> UnitLayout:
    """The layout `nodes` x `instance_type` runs `shape` with, or LayoutError naming the input, the
    model (`model`: how the caller knows it) and the unit sizes that would serve. `speculation` (the
    method, contract/speculation.py): eagle / eagle3 count the EAGLE draft in the memory, `draft` (its
    config.json's shape, the node's) or contract.sizing's estimate (synth's)."""
    unit = _Unit(
        shape=shape,
        engine=engine,
        instance_type=instance_type,
        nodes=nodes,
        seq_len=seq_len,
        batch_size=batch_size,
        reserve=hbm_reserve,
        model=model,
        names=names,
        speculation=speculation,
        draft=draft,
    )
    return unit.check(cp_degree, attention_dp_degree, prefix_caching_block)


def serving_nodes(
    shape: LlamaShape,
    *,
    engine: str = "neuron",
    instance_type: str,
    seq_len: int = DEFAULT_SEQ_LEN,
    batch_size: int = DEFAULT_BATCH_SIZE,
    hbm_reserve: float = DEFAULT_HBM_RESERVE,
    max_nodes: int = MAX_NODES,
) -> tuple[int, ...]:
    """The unit sizes (1..max_nodes) whose layout check passes at these settings (degrees auto)."""
    good = []
    for n in range(1, max_nodes + 1):
        unit = _Unit(
            shape=shape,
            engine=engine,
            instance_type=instance_type,
            nodes=n,
            seq_len=seq_len,
            batch_size=batch_size,
            reserve=hbm_reserve,
            suggest=False,
        )
        try:
            unit.check(AUTO, AUTO, 0)
        except LayoutError:
            continue
        good.append(n)
    return tuple(good)


@dataclass(frozen=True, kw_only=True)
class _Unit:
    """One unit size being checked. `suggest`: a refusal names the unit sizes that would serve (off
    while serving_nodes itself tries each size)."""

    shape: LlamaShape
    engine: str
    instance_type: str
    nodes: int
    seq_len: int
    batch_size: int
    reserve: float
    model: str = "the model"
    names: Names = field(default_factory=lambda: RUNTIME_NAMES)
    suggest: bool = True
    speculation: str = "none"
    draft: LlamaShape | None = None

    def refuse(self, setting: str, value: Any, problem: str, fix: str) -> LayoutError:
        return LayoutError(setting, value, problem, fix, names=self.names)

    def name(self, setting: str) -> str:
        return self.names.get(setting, setting)

    def check(self, cp: int | str, dp: int | str, block: int) -> UnitLayout:
        if self.engine == Engine.NEURON:
            return self._neuron(cp, dp, block)
        if self.engine == Engine.REFERENCE:
            return self._reference()
        return self._accepted()

    def _accepted(self, **parallel: Any) -> UnitLayout:
        return UnitLayout(
            engine=self.engine,
            instance_type=self.instance_type,
            nodes=self.nodes,
            seq_len=self.seq_len,
            batch_size=self.batch_size,
            **parallel,
        )

    def _positive_nodes(self) -> None:
        n = self.nodes
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise self.refuse("nodes", n, "is not a positive integer", "give the nodes of one unit (1 or more)")

    # --- the reference engine ------------------------------------------------------------------------
    def _reference(self) -> UnitLayout:
        """Every rank gets a pipeline stage of at least one layer and a slice of the MLP
        (runtime/engines/layout.py make_plan); heads that do not divide are replicated, not refused."""
        self._positive_nodes()
        most = min(self.shape.num_hidden_layers, self.shape.intermediate_size)
        if self.nodes > most:
            raise self.refuse(
                "nodes",
                self.nodes,
                f"cannot serve {self.model} on the reference engine: every rank needs at least one of its "
                f"{self.shape.num_hidden_layers} layers",
                f"use at most {most} nodes",
            )
        return self._accepted()

    # --- the neuron engine ---------------------------------------------------------------------------
    def _neuron(self, cp: int | str, dp: int | str, block: int) -> UnitLayout:
        shape, nodes = self.shape, self.nodes
        instance = INSTANCES.get(self.instance_type)
        if instance is None:
            raise self.refuse(
                "instance_type",
                self.instance_type,
                "cannot host a Neuron unit",
                f"use one of {', '.join(sorted(INSTANCES))}",
            )
        self._positive_nodes()
        self._sequence()
        cp, dp = self._degree("cp_degree", cp), self._degree("attention_dp_degree", dp)
        if block:
            self._prefix_caching(block)
        local_tp = instance.neuron_cores
        if nodes == 1:
            tp = local_tp
            where = f"1 x {self.instance_type} (tp_degree={tp})"
            cp, dp = self._auto_degrees(tp, cp, dp, where)
        else:
            # NxD Inference's multi-node mode: tp_degree is the whole unit's NeuronCores and each node
            # loads its own range of ranks (runtime/engines/neuron/launch.py MULTI_NODE_SOURCES), so the
            # heads and the MLP must split over every core of the unit.
            tp = local_tp * nodes
            where = f"{nodes} x {self.instance_type} (tp_degree={tp} = {local_tp} NeuronCores x {nodes} nodes)"
            if not splits(shape, tp):
                raise self.refuse(
                    "nodes",
                    nodes,
                    f"cannot serve {self.model} on {self.instance_type}: tp_degree={tp} ({nodes} x {local_tp} "
                    f"NeuronCores) does not split num_attention_heads={shape.num_attention_heads} "
                    f"(num_key_value_heads={shape.num_key_value_heads}, "
                    f"intermediate_size={shape.intermediate_size}) evenly",
                    self._nodes_fix(),
                )
            for setting, value in (("cp_degree", cp), ("attention_dp_degree", dp)):
                if value not in (AUTO, 1):
                    raise self.refuse(
                        setting,
                        value,
                        "applies to single-node units only: across nodes flotilla runs NxD Inference's documented "
                        "multi-node layout (tensor parallel over every NeuronCore of the unit, cp_degree=1, "
                        "attention_dp_degree=1)",
                        f"leave {self.name(setting)} auto or use 1 node",
                    )
            cp, dp = 1, 1
        self._validate_degrees(tp, int(cp), int(dp), where, tunable=nodes == 1)
        memory = core_memory(
            shape,
            instance,
            nodes=nodes,
            batch=self.batch_size,
            seq_len=self.seq_len,
            hbm_reserve=self.reserve,
            speculation=self.speculation,
            draft=self.draft,
        )
        if not memory.fits:
            self._too_big(memory)
        return self._accepted(tp_degree=tp, cp_degree=int(cp), attention_dp_degree=int(dp), memory=memory)

    def _too_big(self, memory: CoreMemory) -> None:
        setting: str = "nodes"
        value: Any = self.nodes  # or the speculation method's name
        fix = f"{self._nodes_fix()}, or lower {self.name('batch_size')} or {self.name('seq_len')}"
        if self.speculation in EAGLE_FC_INPUTS:  # one node only (contract.speculation): more nodes are no fix
            fix = f"lower {self.name('batch_size')} or {self.name('seq_len')}, or set {self.name('speculation')} none"
            if memory.total - memory.draft <= memory.usable:  # the draft is what does not fit
                setting, value = "speculation", self.speculation
        raise self.refuse(
            setting,
            value,
            f"cannot hold {self.model} on {self.instance_type}: "
            f"{describe_memory(memory, self.batch_size, self.seq_len)} > {memory.usable / GIB:.2f} GiB usable "
            f"per NeuronCore ({memory.hbm / GIB:.0f} GiB HBM less {self.reserve:.0%} for the runtime)",
            fix,
        )

    def _nodes_fix(self) -> str:
        if not self.suggest:
            return ""
        good = serving_nodes(
            self.shape,
            instance_type=self.instance_type,
            seq_len=self.seq_len,
            batch_size=self.batch_size,
            hbm_reserve=self.reserve,
        )
        if not good:
            return "use another instance type"
        return f"use {self.name('nodes')} {' or '.join(map(str, good[:4]))}"

    def _sequence(self) -> None:
        seq_len, batch_size, positions = self.seq_len, self.batch_size, self.shape.max_position_embeddings
        if not isinstance(seq_len, int) or isinstance(seq_len, bool) or seq_len < 1:
            raise self.refuse("seq_len", seq_len, "is not a positive integer", "give the tokens of prompt + output")
        if seq_len > positions:
            raise self.refuse(
                "seq_len",
                seq_len,
                f"exceeds the max_position_embeddings={positions} of {self.model}",
                f"give at most {positions}",
            )
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise self.refuse(
                "batch_size", batch_size, "is not a positive integer", "give the sequences decoded together"
            )

    def _degree(self, setting: str, value: int | str) -> int | str:
        if value == AUTO:
            return value
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise self.refuse(setting, value, "is not a degree", "give a positive integer or 'auto'")
        return value

    def _prefix_caching(self, block: int) -> None:
        if self.nodes > 1:
            raise self.refuse(
                "prefix_caching_block",
                block,
                "applies to single-node units only: flotilla's multi-node loop runs NxD Inference's contiguous KV "
                "layout (docs/hardware.md)",
                "set it to 0 or use 1 node",
            )
        if self.batch_size < 2:
            raise self.refuse(
                "prefix_caching_block",
                block,
                f"with batch_size={self.batch_size}: the plugin's prefix caching generates incorrect outputs at "
                "batch size 1 (its known issues)",
                f"raise {self.name('batch_size')} to 2 or more",
            )

    def _auto_degrees(self, tp: int, cp: int | str, dp: int | str, where: str) -> tuple[int, int]:
        """A single node's cp and attention-dp degrees: the smallest that split the heads evenly."""
        shape = self.shape
        if cp == AUTO:
            fits = fitting_degrees(shape, tp, seq_len=self.seq_len)
            if not fits:
                raise self.refuse(
                    "seq_len",
                    self.seq_len,
                    f"leaves no cp_degree that splits prefill attention (num_attention_heads="
                    f"{shape.num_attention_heads}, num_key_value_heads={shape.num_key_value_heads}) evenly on {where}",
                    f"give a {self.name('seq_len')} that divides by one of {fitting_degrees(shape, tp)}",
                )
            cp = fits[0]
        if dp == AUTO:
            allowed = [d for d in fitting_degrees(shape, tp) if cp == 1 or d == 1 or int(cp) % d == 0]
            fits = [d for d in allowed if self.batch_size % d == 0]
            if not fits:
                raise self.refuse(
                    "batch_size",
                    self.batch_size,
                    f"leaves no attention_dp_degree that splits decode attention "
                    f"(num_attention_heads={shape.num_attention_heads}) evenly on {where}",
                    f"raise {self.name('batch_size')} to a multiple of {allowed[0]}"
                    if allowed
                    else "use another instance type",
                )
            dp = fits[0]
        return int(cp), int(dp)

    def _validate_degrees(self, tp: int, cp: int, dp: int, where: str, *, tunable: bool) -> None:
        """tunable: the cp / attention-dp degrees can be changed (one node); across nodes they are 1."""
        shape, batch_size, seq_len = self.shape, self.batch_size, self.seq_len
        # The first four mirror NxD Inference's own NeuronConfig checks (neuronx-distributed-inference
        # v0.7.14366 src/neuronx_distributed_inference/models/config.py:342, 576-583), caught here with a fix.
        if tp % cp:
            raise self.refuse(
                "cp_degree", cp, f"does not divide tp_degree={tp} on {where}", f"use one of {divisors(tp)}"
            )
        if tp % dp:
            raise self.refuse(
                "attention_dp_degree", dp, f"does not divide tp_degree={tp} on {where}", f"use one of {divisors(tp)}"
            )
        if batch_size % dp:
            raise self.refuse(
                "batch_size",
                batch_size,
                f"is not a multiple of attention_dp_degree={dp} (each data-parallel group decodes batch_size/{dp} "
                "sequences)",
                f"raise {self.name('batch_size')} to {dp * -(-batch_size // dp)} or lower "
                f"{self.name('attention_dp_degree')}",
            )
        if cp > 1 and dp > 1 and cp % dp:
            raise self.refuse(
                "attention_dp_degree",
                dp,
                f"does not divide cp_degree={cp} (NxD Inference re-uses the context-parallel groups for decode)",
                f"pick one of {[d for d in divisors(cp) if d > 1]} or set {self.name('cp_degree')} 1",
            )
        # Ours: each context-parallel rank takes an equal slice of the prompt.
        if seq_len % cp:
            raise self.refuse(
                "seq_len",
                seq_len,
                f"is not a multiple of cp_degree={cp}, so the context-parallel ranks would hold unequal slices",
                f"use {self.name('seq_len')} {cp * (seq_len // cp) or cp}",
            )
        for phase, setting, degree in (("prefill", "cp_degree", cp), ("decode", "attention_dp_degree", dp)):
            attention_tp = tp // degree
            if heads_fit(shape, attention_tp):
                continue
            good = fitting_degrees(
                shape,
                tp,
                batch_size=batch_size if phase == "decode" else None,
                seq_len=seq_len if phase == "prefill" else None,
            )
            fix = (
                f"use {self.name(setting)} one of {good}"
                if good and tunable
                else f"this model's heads do not split over {tp} NeuronCores: use another instance type"
                + ("" if tunable else " or a one-node unit")
            )
            raise self.refuse(
                setting,
                degree,
                f"leaves {attention_tp} ranks to share {phase} attention, which does not split "
                f"num_attention_heads={shape.num_attention_heads} / num_key_value_heads="
                f"{shape.num_key_value_heads} evenly on {where} (it would pad heads)",
                fix,
            )
        if shape.intermediate_size % tp:
            raise self.refuse(
                "instance_type",
                self.instance_type,
                f"gives tp_degree={tp}, which does not split intermediate_size={shape.intermediate_size} of "
                f"{self.model} evenly",
                "use another instance type",
            )


def describe_memory(memory: CoreMemory, batch_size: int, seq_len: int) -> str:
    draft = f" + EAGLE draft {memory.draft / GIB:.2f}" if memory.draft else ""
    return (
        f"{memory.total / GIB:.2f} GiB per NeuronCore (weights {memory.weights / GIB:.2f} + KV cache "
        f"{memory.kv_cache / GIB:.2f} for {batch_size} x {seq_len} tokens{draft})"
    )


def splits(shape: LlamaShape, tp: int) -> bool:
    """tp_degree splits the heads and the MLP as NxD Inference shards them: no padded heads."""
    return heads_fit(shape, tp) and shape.intermediate_size % tp == 0


def heads_fit(shape: LlamaShape, attention_tp: int) -> bool:
    """Heads split evenly and KV heads replicate evenly: no padded heads, no MHA fallback."""
    kv = shape.num_key_value_heads
    return shape.num_attention_heads % attention_tp == 0 and (attention_tp % kv == 0 or kv % attention_tp == 0)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def fitting_degrees(
    shape: LlamaShape, tp: int, *, batch_size: int | None = None, seq_len: int | None = None
) -> list[int]:
    """The cp / attention-dp degrees that leave each group a number of ranks the heads split over."""
    out = []
    for d in divisors(tp):
        if not heads_fit(shape, tp // d):
            continue
        if batch_size is not None and batch_size % d:
            continue
        if seq_len is not None and seq_len % d:
            continue
        out.append(d)
    return out
