"""Memory per NeuronCore of a Llama-family model sharded over a unit: the one rule both planners use.

`flotilla plan` (ops/), `python -m runtime plan --engine neuron` (runtime/), the node at start and
synth (contract/layout.py) size a unit with it, so they cannot disagree. Standard library only; the
formulas are in docs/hardware.md.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from contract.llama import DTYPE_BYTES, LlamaShape
from contract.trainium import TrainiumInstance

# HBM kept back for the Neuron runtime, activations and scratch: a planner assumption, not an AWS
# figure (docs/hardware.md).
DEFAULT_HBM_RESERVE = 0.10

# EAGLE speculation (contract/speculation.py) adds a draft model beside the target on the same NeuronCores.
# An EAGLE draft is an FC layer that fuses the target's hidden features with the next token's embedding,
# then one decoder layer (Li et al. 2024, "EAGLE: Speculative Sampling Requires Rethinking Feature
# Uncertainty": the Autoregression Head "consists of an FC layer and a decoder layer"; EAGLE-3, Li et al.
# 2025, fuses three layers' features, so its FC takes 3 x hidden). NxD Inference compiles the draft from its own
# checkpoint, which must carry the target's LM head (contract.speculation.SOURCES "draft holds the LM
# head"), tensor parallel over the target's cores, with a KV cache of its own layers for every sequence
# (contract.speculation.SOURCES "neuron methods"). Inputs to the FC per method:
EAGLE_FC_INPUTS = {"eagle": 2, "eagle3": 3}


@dataclass(frozen=True)
class CoreMemory:
    """Bytes one NeuronCore holds when the model is tensor parallel over tp_degree cores."""

    tp_degree: int
    weights: int
    kv_cache: int
    usable: float  # HBM per NeuronCore after the reserve
    hbm: int
    draft: int = 0  # an EAGLE draft's weights and KV cache (0 without speculation)

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.draft

    @property
    def fits(self) -> bool:
        return self.total <= self.usable


def kv_heads_per_core(shape: LlamaShape, tp_degree: int) -> int:
    # KV heads are replicated, one per core, once there are more cores than KV heads.
    return math.ceil(shape.num_key_value_heads / tp_degree)


def kv_bytes_per_token(shape: LlamaShape, tp_degree: int, kv_bytes: int) -> int:
    return shape.num_hidden_layers * 2 * kv_heads_per_core(shape, tp_degree) * shape.head_dim * kv_bytes


def eagle_draft_shape(target: LlamaShape) -> LlamaShape:
    """The draft the planner assumes while the draft's own config.json is not at hand (at synth): one
    decoder layer of the target's shape with an untied embedding and LM head. An EAGLE-3 draft's smaller
    draft vocabulary is not counted: the estimate errs high."""
    return dataclasses.replace(target, num_hidden_layers=1, tie_word_embeddings=False)


def draft_bytes(
    draft: LlamaShape, method: str, *, tp_degree: int, batch: int, seq_len: int, weight_bytes: int, kv_bytes: int
) -> int:
    """Per NeuronCore: an EAGLE draft's weights (its own parameters and the FC, sharded over tp_degree)
    and its KV cache for batch x seq_len tokens, in the target's weight and KV dtypes."""
    fc = EAGLE_FC_INPUTS[method] * draft.hidden_size * draft.hidden_size
    weights = math.ceil((draft.params + fc) / tp_degree) * weight_bytes
    return weights + batch * seq_len * kv_bytes_per_token(draft, tp_degree, kv_bytes)


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
    speculation: str = "none",
    draft: LlamaShape | None = None,
) -> CoreMemory:
    """Weights + KV cache per NeuronCore with every core of `nodes` nodes in one tensor-parallel group.
    The KV cache is in the weights' dtype unless `kv_dtype` says otherwise; `params` replaces the count
    from the shape (a planner told the total). `speculation` eagle / eagle3 adds the EAGLE draft, `draft`
    (its config.json's shape) or eagle_draft_shape's estimate."""
    tp = instance.neuron_cores * nodes
    layers, hidden, head_dim = shape.num_hidden_layers, shape.hidden_size, shape.head_dim
    kv_projection = layers * 2 * hidden * shape.num_key_value_heads * head_dim
    total = shape.params if params is None else params
    # k/v projections are replicated, not sharded, once tp exceeds the KV heads.
    weight_params = math.ceil((total - kv_projection) / tp) + layers * 2 * hidden * head_dim * (
        kv_heads_per_core(shape, tp)
    )
    kv_bytes = DTYPE_BYTES[kv_dtype.lower()] if kv_dtype else shape.weight_bytes
    extra = 0
    if speculation in EAGLE_FC_INPUTS:
        extra = draft_bytes(
            draft or eagle_draft_shape(shape),
            speculation,
            tp_degree=tp,
            batch=batch,
            seq_len=seq_len,
            weight_bytes=shape.weight_bytes,
            kv_bytes=kv_bytes,
        )
    return CoreMemory(
        tp_degree=tp,
        weights=weight_params * shape.weight_bytes,
        kv_cache=batch * seq_len * kv_bytes_per_token(shape, tp, kv_bytes),
        usable=instance.hbm_bytes_per_core * (1 - hbm_reserve),
        hbm=instance.hbm_bytes_per_core,
        draft=extra,
    )
