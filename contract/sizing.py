"""Memory per NeuronCore of a Llama-family model sharded over a unit: the one rule both planners use.

`flotilla plan` (ops/), `python -m runtime plan --engine neuron` (runtime/), the node at start and
synth (contract/layout.py) size a unit with it, so they cannot disagree. Standard library only; the
formulas are in docs/hardware.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from contract.llama import DTYPE_BYTES, LlamaShape
from contract.trainium import TrainiumInstance

# HBM kept back for the Neuron runtime, activations and scratch: a planner assumption, not an AWS
# figure (docs/hardware.md).
DEFAULT_HBM_RESERVE = 0.10


@dataclass(frozen=True)
class CoreMemory:
    """Bytes one NeuronCore holds when the model is tensor parallel over tp_degree cores."""

    tp_degree: int
    weights: int
    kv_cache: int
    usable: float  # HBM per NeuronCore after the reserve
    hbm: int

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache

    @property
    def fits(self) -> bool:
        return self.total <= self.usable


def kv_heads_per_core(shape: LlamaShape, tp_degree: int) -> int:
    # KV heads are replicated, one per core, once there are more cores than KV heads.
    return math.ceil(shape.num_key_value_heads / tp_degree)


def kv_bytes_per_token(shape: LlamaShape, tp_degree: int, kv_bytes: int) -> int:
    return shape.num_hidden_layers * 2 * kv_heads_per_core(shape, tp_degree) * shape.head_dim * kv_bytes


def core_memory(
    shape: LlamaShape,
    instance: TrainiumInstance,
    *,
    nodes: int,
    batch: int,
    seq_len: int,
    hbm_reserve: float = DEFAULT_HBM_RESERVE,
    kv_dtype: str | None = None,
    params: int | None = None,
) -> CoreMemory:
    """Weights + KV cache per NeuronCore with every core of `nodes` nodes in one tensor-parallel group.
    The KV cache is in the weights' dtype unless `kv_dtype` says otherwise; `params` replaces the count
    from the shape (a planner told the total)."""
    tp = instance.neuron_cores * nodes
    layers, hidden, head_dim = shape.num_hidden_layers, shape.hidden_size, shape.head_dim
    kv_projection = layers * 2 * hidden * shape.num_key_value_heads * head_dim
    total = shape.params if params is None else params
    # k/v projections are replicated, not sharded, once tp exceeds the KV heads.
    weight_params = math.ceil((total - kv_projection) / tp) + layers * 2 * hidden * head_dim * (
        kv_heads_per_core(shape, tp)
    )
    kv_bytes = DTYPE_BYTES[kv_dtype.lower()] if kv_dtype else shape.weight_bytes
    return CoreMemory(
        tp_degree=tp,
        weights=weight_params * shape.weight_bytes,
        kv_cache=batch * seq_len * kv_bytes_per_token(shape, tp, kv_bytes),
        usable=instance.hbm_bytes_per_core * (1 - hbm_reserve),
        hbm=instance.hbm_bytes_per_core,
    )
