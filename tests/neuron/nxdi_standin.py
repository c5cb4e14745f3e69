"""A stand-in for the NxD Inference calls the multi-node loop makes, backed by the torch reference model.

Same signatures as the pinned source, NXDI =
aws-neuron/neuronx-distributed-inference@cd3abf30558fe1a14dadfb1397c2118e3fcfcc11 (SDK 2.28.0):
- NeuronConfig(**kwargs): models/config.py:84, the fields at :361-389;
- LlamaInferenceConfig(neuron_config, load_config=...): models/config.py:812-819;
- NeuronLlamaForCausalLM(model_path, config): models/application_base.py:73-78;
- compile(compiled_model_path, debug, pre_shard_weights_hook, dry_run): application_base.py:292;
- load(compiled_model_path, start_rank_id, local_ranks_size, skip_warmup): application_base.py:317-318;
- warmup(): application_base.py:348 (load runs it unless skip_warmup, here or in NeuronConfig: :339-340, config.py:575);
- forward(input_ids, seq_ids, attention_mask, position_ids, ..., sampling_params): models/model_base.py:3355-3379,
  whose outputs carry `logits` (None when sampling on device) and `tokens` (model_base.py:3863-3876).

Sharded as NxD shards: a node holds global ranks start_rank_id .. start_rank_id + local_ranks_size - 1
(aws-neuron/neuronx-distributed@73ab227d:src/neuronx_distributed/trace/model_builder.py:837) and global rank r
holds tensor partition r % tp_degree (trace/trace.py:801). Partition p holds query heads and MLP columns p of
tp_degree, and one KV head when there are fewer KV heads than partitions (replicated, as NxD Inference's GQA
sharding does). Ranks r with the same r // tp_degree form one tensor-parallel group and all-reduce together.

Where a real unit would hang, this one raises: every forward first compares, across all nodes, how many
forwards each node has run and a digest of its inputs. Each node has `DEVICE_BYTES_PER_NODE` of device
memory: a node whose partitions do not fit fails at load, as the Neuron runtime does. Embedding, LM head and
norms are counted whole on every node (NxD shards the first two; the difference is small and on the safe side).
"""

from __future__ import annotations

import json
import os
import time
import zlib
from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from runtime.engines.llama import LayerWeights, _rotate, rope_tables
from runtime.models.registry import TINY_SHAPE, LlamaShape, SeededWeights

COMPILED_MODEL_FILE_NAME = "model.pt"  # NXDI models/application_base.py:47
DEVICE_BYTES_PER_NODE: int | None = None  # set by the test: one node's device memory
# The tiny model with 8 query heads (2 KV heads) and a wider MLP, so tp_degree 4 and 8 split it and the
# layers, not the embeddings, hold most of the bytes. Vocabulary 64 (STANDIN_NXDI_VOCAB overrides it).
SHAPE = replace(TINY_SHAPE, vocab_size=64, num_attention_heads=8, head_dim=8, intermediate_size=256)
SEED = 7


def cores_per_partition() -> int:
    """A real trn1 unit has 32 NeuronCores a node; the tiny model splits 4 or 8 ways. With
    STANDIN_NXDI_CORES_PER_PARTITION=k every k consecutive global ranks act as one (rank // k), so a
    plan for 2 x 32 cores runs here as 2 x 2 partitions, sharded by the same rule."""
    return int(os.environ.get("STANDIN_NXDI_CORES_PER_PARTITION", "1"))


def load_pretrained_config(model_path: str):
    """NXDI utils/hf_adapter.py:36: here the tiny model's shape and seed, whatever the checkpoint says."""
    vocab = int(os.environ.get("STANDIN_NXDI_VOCAB", SHAPE.vocab_size))
    return replace(SHAPE, vocab_size=vocab), SEED


class NeuronConfig:
    """NXDI models/config.py:84: the fields the loop sets, with NxD Inference's defaults (:361-389)."""

    def __init__(self, **kwargs: Any) -> None:
        self.tp_degree = kwargs.pop("tp_degree", 1)
        self.batch_size = kwargs.pop("batch_size", 1)
        self.seq_len = kwargs.pop("seq_len", 128)
        self.max_context_length = kwargs.pop("max_context_length", self.seq_len)
        self.is_continuous_batching = kwargs.pop("is_continuous_batching", False)
        self.on_device_sampling_config = kwargs.pop("on_device_sampling_config", None)
        self.world_size = kwargs.pop("world_size", None) or self.tp_degree
        self.start_rank_id = kwargs.pop("start_rank_id", 0)
        self.local_ranks_size = kwargs.pop("local_ranks_size", None) or self.world_size
        self.skip_warmup = kwargs.pop("skip_warmup", False)
        if kwargs:
            raise TypeError(f"the stand-in does not model NeuronConfig fields {sorted(kwargs)}")


class LlamaInferenceConfig:
    """NXDI models/llama/modeling_llama.py:312; load_config here carries the tiny model's shape and seed."""

    def __init__(self, neuron_config: NeuronConfig, fused_spec_config=None, load_config=None, metadata=None):
        self.neuron_config = neuron_config
        self.shape, self.seed = load_config


@dataclass
class _Partition:
    index: int
    layers: list[LayerWeights]
    n_q: int
    n_kv: int


class NeuronLlamaForCausalLM:
    def __init__(self, model_path: str, config: LlamaInferenceConfig | None = None, neuron_config=None) -> None:
        self.model_path = model_path
        self.config = config
        self.neuron_config = config.neuron_config
        self.shape: LlamaShape = config.shape
        self.weights = SeededWeights(self.shape, config.seed)
        self.partitions: list[_Partition] = []
        self.calls = 0
        self.warmed_up = False
        self.loaded_bytes = 0

    # -- compile and load ------------------------------------------------------------------------
    def _key(self) -> dict:
        nc = self.neuron_config
        return {"tp_degree": nc.tp_degree, "batch_size": nc.batch_size, "seq_len": nc.seq_len}

    def compile(self, compiled_model_path, debug=False, pre_shard_weights_hook=None, dry_run=False) -> None:
        os.makedirs(compiled_model_path, exist_ok=True)
        with open(os.path.join(compiled_model_path, COMPILED_MODEL_FILE_NAME), "w") as f:
            json.dump(self._key(), f)

    def warmup(self) -> None:
        """A real warm-up runs one forward per compiled model on every node; STANDIN_NXDI_WARMUP_S makes
        it last long enough for a test to see the node report it."""
        time.sleep(float(os.environ.get("STANDIN_NXDI_WARMUP_S", "0")))
        self.warmed_up = True

    def load(self, compiled_model_path, start_rank_id=None, local_ranks_size=None, skip_warmup=False) -> None:
        with open(os.path.join(compiled_model_path, COMPILED_MODEL_FILE_NAME)) as f:
            compiled = json.load(f)
        if compiled != self._key():
            raise RuntimeError(f"compiled for {compiled}, loaded with {self._key()}: recompile")
        nc, s = self.neuron_config, self.shape
        start = nc.start_rank_id if start_rank_id is None else start_rank_id
        local = nc.local_ranks_size if local_ranks_size is None else local_ranks_size
        k = cores_per_partition()
        start, local, tp = start // k, local // k, nc.tp_degree // k
        self.tp = tp
        if (
            s.num_attention_heads % tp
            or s.intermediate_size % tp
            or (s.num_key_value_heads % tp and tp % s.num_key_value_heads)
        ):
            raise RuntimeError(f"tp_degree={tp} does not split heads {s.num_attention_heads}/{s.num_key_value_heads}")
        self.group = start // tp  # the tensor-parallel group this node's ranks belong to
        self.local = local
        self.partitions = [self._partition(r % tp) for r in range(start, start + local)]
        whole = sum(self.weights.get(n).numel() for n in self.weights.keys() if ".layers." not in n)
        held = sum(t.numel() for p in self.partitions for lw in p.layers for t in _tensors(lw))
        self.loaded_bytes = 4 * (whole + held)
        budget = DEVICE_BYTES_PER_NODE or int(os.environ.get("STANDIN_NXDI_DEVICE_BYTES", "0")) or None
        if budget is not None and self.loaded_bytes > budget:
            raise RuntimeError(
                f"out of device memory: ranks {start}..{start + local - 1} hold {self.loaded_bytes} bytes, "
                f"the node has {budget}"
            )
        self.embed = self.weights.get("model.embed_tokens.weight")
        self.final_norm = self.weights.get("model.norm.weight")
        self.lm_head = self.embed if s.tie_word_embeddings else self.weights.get("lm_head.weight")
        slots = nc.batch_size
        self.kv = {
            (p.index, n): (
                torch.zeros(slots, p.n_kv, nc.seq_len, s.head_dim),
                torch.zeros(slots, p.n_kv, nc.seq_len, s.head_dim),
            )
            for p in self.partitions
            for n in range(s.num_hidden_layers)
        }
        if not nc.skip_warmup and not skip_warmup:  # application_base.py:339-340
            self.warmup()

    def _partition(self, p: int) -> _Partition:
        s, tp = self.shape, self.tp
        nq, m = s.num_attention_heads // tp, s.intermediate_size // tp
        if s.num_key_value_heads >= tp:
            nkv = s.num_key_value_heads // tp
            kv = (p * nkv, (p + 1) * nkv)
        else:
            nkv, head = 1, p * s.num_key_value_heads // tp
            kv = (head, head + 1)
        layers = []
        for n in range(s.num_hidden_layers):
            lw = LayerWeights.load(
                self.weights, n, q_heads=(p * nq, (p + 1) * nq), kv_heads=kv, mlp=(p * m, (p + 1) * m), shape=s
            )
            # A replicated KV head whose query group starts before this slice: the slice's queries all
            # use that one head, so no padding is needed here.
            lw.q_pad = None
            layers.append(lw)
        return _Partition(p, layers, nq, nkv)

    # -- the step --------------------------------------------------------------------------------
    def _in_step(self, tensors: list[torch.Tensor]) -> None:
        digest = 0
        for t in tensors:
            digest = zlib.crc32(t.contiguous().numpy().tobytes(), digest)
        mine = torch.tensor([self.calls, digest], dtype=torch.int64)
        every = [torch.zeros(2, dtype=torch.int64) for _ in range(dist.get_world_size())]
        dist.all_gather(every, mine)
        if any(not torch.equal(e, every[0]) for e in every):
            seen = ", ".join(f"node {i}: forward #{int(e[0])} inputs {int(e[1]):08x}" for i, e in enumerate(every))
            raise RuntimeError(
                f"nodes called forward out of step or with different inputs ({seen}); on Neuron the "
                "collective would wait forever"
            )
        self.calls += 1

    def _all_reduce(self, partial: torch.Tensor) -> torch.Tensor:
        groups = dist.get_world_size() * self.local // self.tp
        buf = torch.zeros(groups, *partial.shape)
        buf[self.group] = partial
        dist.all_reduce(buf)
        return buf[self.group]

    def forward(
        self,
        input_ids=None,
        seq_ids=None,
        attention_mask=None,
        position_ids=None,
        past_key_values=None,
        inputs_embeds=None,
        sampling_params=None,
        **kwargs,
    ):
        self._in_step([input_ids, seq_ids, position_ids, sampling_params])
        s = self.shape
        B, T = input_ids.shape
        x = self.embed[input_ids]  # [B, T, hidden]
        cos, sin = rope_tables(s, position_ids.reshape(-1))
        for n in range(s.num_hidden_layers):
            h = F.rms_norm(x, (s.hidden_size,), self.partitions[0].layers[n].input_norm, s.rms_norm_eps)
            attn = sum(self._attention(p, n, h, seq_ids, position_ids, cos, sin) for p in self.partitions)
            x = x + self._all_reduce(attn)
            h = F.rms_norm(x, (s.hidden_size,), self.partitions[0].layers[n].post_norm, s.rms_norm_eps)
            mlp = sum(_mlp(p.layers[n], h) for p in self.partitions)
            x = x + self._all_reduce(mlp)
        last = F.rms_norm(x[:, -1:], (s.hidden_size,), self.final_norm, s.rms_norm_eps)
        logits = last @ self.lm_head.T  # [B, 1, vocab]
        if self.neuron_config.on_device_sampling_config is None:
            return SimpleNamespace(logits=logits, tokens=logits)
        return SimpleNamespace(logits=None, tokens=self._sample(logits[:, 0], sampling_params).view(B, 1))

    def _attention(self, p: _Partition, n: int, h, seq_ids, position_ids, cos, sin) -> torch.Tensor:
        s, lw = self.shape, p.layers[n]
        B, T, _ = h.shape
        d = s.head_dim
        q = _rotate((h @ lw.wq.T).reshape(B * T, p.n_q, d), cos, sin).view(B, T, p.n_q, d)
        k = _rotate((h @ lw.wk.T).reshape(B * T, p.n_kv, d), cos, sin).view(B, T, p.n_kv, d)
        v = (h @ lw.wv.T).view(B, T, p.n_kv, d)
        K, V = self.kv[(p.index, n)]
        out = torch.empty(B, T, p.n_q * d)
        for b in range(B):
            slot, pos = int(seq_ids[b]), position_ids[b]
            K[slot, :, pos] = k[b].transpose(0, 1)
            V[slot, :, pos] = v[b].transpose(0, 1)
            end = int(pos.max()) + 1
            keys = K[slot, :, :end].repeat_interleave(p.n_q // p.n_kv, dim=0)  # [nq, end, d]
            vals = V[slot, :, :end].repeat_interleave(p.n_q // p.n_kv, dim=0)
            scores = torch.einsum("tqd,qkd->qtk", q[b], keys) / d**0.5
            causal = torch.arange(end).view(1, end) <= pos.view(T, 1)
            scores = scores.masked_fill(~causal, float("-inf"))
            out[b] = torch.einsum("qtk,qkd->tqd", torch.softmax(scores, dim=-1), vals).reshape(T, p.n_q * d)
        return out @ lw.wo.T

    def _sample(self, logits: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
        """On-device sampling by NxD Inference's rules (NXDI modules/generation/sampling.py): per-row
        parameters only with `dynamic` (models/config.py:1029), else the config's; the same seed on every
        node, as the device's draws agree across ranks."""
        cfg = self.neuron_config.on_device_sampling_config
        global_topk = int(cfg.get("global_topk", 256))  # OnDeviceSamplingConfig default, config.py:1030
        rows = (
            params.float()
            if cfg.get("dynamic", False)
            else torch.tensor([[cfg.get("top_k", 1), cfg.get("top_p", 1.0), cfg.get("temperature", 1.0)]]).expand(
                logits.shape[0], 3
            )
        )
        validate_sampling_params(rows, global_topk)  # model_base.py:3330, before every forward's sampling
        rows = rows.clone()
        rows[rows[:, 2] == 0, :2] = 1.0  # infer_sampling_params, sampling.py:162-182: temperature 0 is greedy
        gen = torch.Generator().manual_seed(1000 + self.calls)
        # _top_k_masked (sampling.py:303-336): the global_topk most likely tokens, sorted, then every one at
        # index >= top_k set to IGNORED_LOGITS_VALUE (-3000, :270-272). top_k 0 or -1 masks them all: uniform.
        # (Here the vocabulary may be smaller than global_topk; a real one is far larger.)
        k = min(global_topk, logits.shape[-1]) if global_topk > 0 else logits.shape[-1]
        out = torch.empty(logits.shape[0], dtype=torch.int64)
        for i in range(logits.shape[0]):
            top_k, top_p, temperature = rows[i, 0], float(rows[i, 1]), float(rows[i, 2])
            values, ids = torch.topk(logits[i].float(), k)
            values = values.masked_fill(torch.arange(k) >= top_k, -3000.0)
            if int(top_k) == 1:  # one candidate left: the most likely token
                out[i] = ids[0]
                continue
            values = values / temperature  # after the mask (:414-415): masked tokens scale too
            # top-p (:417-428): drop every token whose inclusive cumulative probability passes top_p,
            # except the first; the bound is at least the smallest cumulative value.
            cumsum = torch.cumsum(torch.softmax(values, dim=-1), dim=-1)
            bound = max(float(cumsum.min()), top_p)
            drop = cumsum > bound
            drop[0] = False
            values = values.masked_fill(drop, -3000.0)
            out[i] = ids[torch.multinomial(torch.softmax(values, dim=-1), 1, generator=gen)[0]]
        return out


def validate_sampling_params(rows: torch.Tensor, global_topk: int) -> None:
    """NXDI modules/generation/sampling.py:99-159: what the on-device sampler refuses, with its messages."""
    top_k, top_p, temperature = rows[:, 0], rows[:, 1], rows[:, 2]
    if not torch.all((top_k == -1) | ((top_k >= 0) & (top_k <= global_topk))):
        raise ValueError(
            "Invalid top-k values found. top-k must be -1 or greater than 0 but less than or equal to "
            f"global_top_k={global_topk}. Found top_k={top_k}."
        )
    if not torch.equal(top_k, top_k.floor()):
        raise ValueError(f"Invalid top-k values found. top-k values should be integers. Found top_k={top_k}.")
    if not torch.all((top_p > 0.0) & (top_p <= 1.0)):
        raise ValueError(f"Invalid top-p values found. top-p must be in the range (0.0, 1.0]. Found top_p={top_p}.")
    if not torch.all(temperature >= 0.0):
        raise ValueError(f"Invalid temperature values found. Found temperature={temperature}.")
    if torch.any((temperature == 0.0) & ((top_k == -1) | (top_k == 0))):
        raise ValueError(
            "Invalid sampling parameters found. Temperature = 0 enables greedy sampling. Please set top_k to 1"
        )


def _mlp(lw: LayerWeights, h: torch.Tensor) -> torch.Tensor:
    return (F.silu(h @ lw.w_gate.T) * (h @ lw.w_up.T)) @ lw.w_down.T


def _tensors(lw: LayerWeights) -> list[torch.Tensor]:
    return [lw.wq, lw.wk, lw.wv, lw.wo, lw.w_gate, lw.w_up, lw.w_down, lw.input_norm, lw.post_norm]
