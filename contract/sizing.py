"""Memory per NeuronCore of a Llama-family model sharded over a unit: the one rule both planners use.

`flotilla plan` (ops/) and `python -m runtime plan --engine neuron` (runtime/) decide single-node vs
multi-node with it, so they cannot disagree. Standard library only; the formulas are in
docs/hardware.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from contract.trainium import TrainiumInstance

# HBM kept back for the Neuron runtime, activations and scratch: a planner assumption, not an AWS
# figure (docs/hardware.md).
DEFAULT_HBM_RESERVE = 0.10


@dataclass(frozen=True, kw_only=True)
class LlamaDims:
    """What decides memory: the model's shape and the bytes per weight and per KV-cache element."""

    params: int
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    weight_bytes: int = 2  # bfloat16
    kv_bytes: int = 2


def llama_params(
    *, layers: int, hidden: int, heads: int, kv_heads: int, head_dim: int, intermediate: int, vocab: int, tied: bool
) -> int:
    """Parameters of a Llama decoder: attention, gated MLP, two norms per layer, embeddings, final norm."""
    per_layer = (
        hidden * heads * head_dim  # q_proj
        + 2 * hidden * kv_heads * head_dim  # k_proj, v_proj
        + heads * head_dim * hidden  # o_proj
        + 3 * hidden * intermediate  # gate, up, down
        + 2 * hidden  # two RMSNorms
    )
    return layers * per_layer + vocab * hidden * (1 if tied else 2) + hidden


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


def kv_heads_per_core(dims: LlamaDims, tp_degree: int) -> int:
    # KV heads are replicated, one per core, once there are more cores than KV heads.
    return math.ceil(dims.kv_heads / tp_degree)


def kv_bytes_per_token(dims: LlamaDims, tp_degree: int) -> int:
    return dims.layers * 2 * kv_heads_per_core(dims, tp_degree) * dims.head_dim * dims.kv_bytes


def core_memory(
    dims: LlamaDims,
    instance: TrainiumInstance,
    *,
    nodes: int,
    batch: int,
    seq_len: int,
    hbm_reserve: float = DEFAULT_HBM_RESERVE,
) -> CoreMemory:
    """Weights + KV cache per NeuronCore with every core of `nodes` nodes in one tensor-parallel group."""
    tp = instance.neuron_cores * nodes
    kv_projection = dims.layers * 2 * dims.hidden * dims.kv_heads * dims.head_dim
    # k/v projections are replicated, not sharded, once tp exceeds the KV heads.
    weight_params = math.ceil((dims.params - kv_projection) / tp) + dims.layers * 2 * dims.hidden * dims.head_dim * (
        kv_heads_per_core(dims, tp)
    )
    return CoreMemory(
        tp_degree=tp,
        weights=weight_params * dims.weight_bytes,
        kv_cache=batch * seq_len * kv_bytes_per_token(dims, tp),
        usable=instance.hbm_bytes_per_core * (1 - hbm_reserve),
        hbm=instance.hbm_bytes_per_core,
    )
