"""The Llama forward pass, written out in torch so a rank can hold any part of it: a contiguous
layer range (pipeline stage), a head/MLP slice of every layer (tensor parallelism), or both, each
with a per-sequence KV cache that can be re-sharded between those layouts.

Why not drive transformers' LlamaDecoderLayer: its cache is indexed by layer_idx and sized for all
heads, and a tensor slice would need patched modules. Here every op mirrors transformers' order
(RMSNorm in fp32, RoPE via rotate_half, SwiGLU), so the unsplit model matches LlamaForCausalLM
within float tolerance (tests/engine/test_models.py), a pipeline split is bit-identical
to the unsplit model (same ops on the same shapes), and a tensor split differs only by the order
of the all-reduce sum.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from runtime.models.registry import LlamaShape, WeightSource


@dataclass
class LayerWeights:
    """One decoder layer as this rank holds it: all heads (stage) or a slice (tensor parallel)."""

    input_norm: torch.Tensor
    post_norm: torch.Tensor
    wq: torch.Tensor
    wk: torch.Tensor
    wv: torch.Tensor
    wo: torch.Tensor
    w_gate: torch.Tensor
    w_up: torch.Tensor
    w_down: torch.Tensor
    n_q: int  # query heads held
    n_kv: int
    attention_partial: bool  # o_proj output is a partial sum that needs an all-reduce
    mlp_partial: bool

    @classmethod
    def load(
        cls,
        weights: WeightSource,
        layer: int,
        *,
        q_heads: tuple[int, int] | None = None,
        kv_heads: tuple[int, int] | None = None,
        mlp: tuple[int, int] | None = None,
        shape: LlamaShape,
    ) -> "LayerWeights":
        """Full layer when the slices are None; otherwise only the rows/columns of the slice."""
        p = f"model.layers.{layer}."
        d = shape.head_dim
        qh = q_heads or (0, shape.num_heads)
        kvh = kv_heads or (0, shape.num_kv_heads)
        m = mlp or (0, shape.intermediate_size)
        full_attn = qh == (0, shape.num_heads)
        full_mlp = m == (0, shape.intermediate_size)

        def get(name: str, dim: int, span: tuple[int, int], full: bool) -> torch.Tensor:
            if full:
                return weights.get(p + name)
            return weights.get(p + name, dim=dim, start=span[0], stop=span[1])

        return cls(
            input_norm=weights.get(p + "input_layernorm.weight"),
            post_norm=weights.get(p + "post_attention_layernorm.weight"),
            wq=get("self_attn.q_proj.weight", 0, (qh[0] * d, qh[1] * d), full_attn),
            wk=get("self_attn.k_proj.weight", 0, (kvh[0] * d, kvh[1] * d), full_attn),
            wv=get("self_attn.v_proj.weight", 0, (kvh[0] * d, kvh[1] * d), full_attn),
            wo=get("self_attn.o_proj.weight", 1, (qh[0] * d, qh[1] * d), full_attn),
            w_gate=get("mlp.gate_proj.weight", 0, m, full_mlp),
            w_up=get("mlp.up_proj.weight", 0, m, full_mlp),
            w_down=get("mlp.down_proj.weight", 1, m, full_mlp),
            n_q=qh[1] - qh[0],
            n_kv=kvh[1] - kvh[0],
            attention_partial=not full_attn,
            mlp_partial=not full_mlp,
        )

    def tensor_slice(
        self, *, q_heads: tuple[int, int], kv_heads: tuple[int, int], mlp: tuple[int, int], shape: LlamaShape
    ) -> "LayerWeights":
        """A tensor slice of this full layer without re-reading the checkpoint: row slices are
        views; column slices (o_proj, down_proj) are copied so the matmuls see contiguous memory."""
        d = shape.head_dim
        full_attn = q_heads == (0, shape.num_heads)
        full_mlp = mlp == (0, shape.intermediate_size)

        def rows(w, a, b):
            return w if (a, b) == (0, w.shape[0]) else w[a:b]

        def cols(w, a, b):
            return w if (a, b) == (0, w.shape[1]) else w[:, a:b].contiguous()

        return LayerWeights(
            input_norm=self.input_norm,
            post_norm=self.post_norm,
            wq=rows(self.wq, q_heads[0] * d, q_heads[1] * d),
            wk=rows(self.wk, kv_heads[0] * d, kv_heads[1] * d),
            wv=rows(self.wv, kv_heads[0] * d, kv_heads[1] * d),
            wo=cols(self.wo, q_heads[0] * d, q_heads[1] * d),
            w_gate=rows(self.w_gate, *mlp),
            w_up=rows(self.w_up, *mlp),
            w_down=cols(self.w_down, *mlp),
            n_q=q_heads[1] - q_heads[0],
            n_kv=kv_heads[1] - kv_heads[0],
            attention_partial=not full_attn,
            mlp_partial=not full_mlp,
        )


@dataclass
class PackedLayer:
    """A layer laid out for the step: q/k/v fused, gate/up fused, every matrix stored [in, out] so
    a decode step is four matrix products that each stream their weights once. Built from
    LayerWeights (whole or a tensor slice); the unpacked tensors can then be dropped."""

    input_norm: torch.Tensor
    post_norm: torch.Tensor
    qkv: torch.Tensor  # [hidden, (n_q + 2 n_kv) head_dim]
    o: torch.Tensor  # [n_q head_dim, hidden]
    gate_up: torch.Tensor  # [hidden, 2 mlp]
    down: torch.Tensor  # [mlp, hidden]
    n_q: int
    n_kv: int
    mlp: int
    attention_partial: bool
    mlp_partial: bool
    owns_residual: bool  # this rank adds the residual into its partial sums (one rank of a tensor split)
    # The same four matrices pre-packed for oneDNN, used from PREPACK_MIN_ROWS rows up (None: off).
    packed: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    @classmethod
    def pack(cls, lw: LayerWeights, *, owns_residual: bool = True, prepack: bool = True) -> "PackedLayer":
        qkv = torch.cat([lw.wq, lw.wk, lw.wv])
        gate_up = torch.cat([lw.w_gate, lw.w_up])
        packed = None
        if prepack and _ONEDNN and qkv.device.type == "cpu":
            packed = tuple(_onednn_pack(w) for w in (qkv, lw.wo, gate_up, lw.w_down))
        return cls(
            input_norm=lw.input_norm,
            post_norm=lw.post_norm,
            qkv=qkv.t().contiguous(),
            o=lw.wo.t().contiguous(),
            gate_up=gate_up.t().contiguous(),
            down=lw.w_down.t().contiguous(),
            packed=packed,
            n_q=lw.n_q,
            n_kv=lw.n_kv,
            mlp=lw.w_gate.shape[0],
            attention_partial=lw.attention_partial,
            mlp_partial=lw.mlp_partial,
            owns_residual=owns_residual,
        )


@dataclass
class SeqKV:
    """One sequence's KV cache on this rank: per layer held, K and V of shape [n_kv, capacity, d]."""

    capacity: int
    length: int = 0
    layers: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)

    @classmethod
    def empty(
        cls, layers: Sequence[int], n_kv: int, head_dim: int, capacity: int, device: torch.device | str = "cpu"
    ) -> "SeqKV":
        kv = {}
        for layer in layers:
            kv[layer] = (
                torch.empty(n_kv, capacity, head_dim, device=device),
                torch.empty(n_kv, capacity, head_dim, device=device),
            )
        return cls(capacity=capacity, layers=kv)

    def copy(self) -> "SeqKV":
        """An independent cache with the same contents (a forked sequence continues from here)."""
        return SeqKV(
            capacity=self.capacity,
            length=self.length,
            layers={n: (k.clone(), v.clone()) for n, (k, v) in self.layers.items()},
        )


@dataclass(frozen=True)
class Segment:
    """A run of consecutive tokens of one sequence inside a flat [tokens, hidden] batch."""

    kv: SeqKV
    start: int  # position of the first token (the cache length before it)
    n: int


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # One fused op; the same arithmetic as transformers' LlamaRMSNorm for fp32 activations (fp32
    # mean of squares, rsqrt, weight applied last).
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


class RopeTable:
    """cos/sin of every position up to the longest seen so far, computed once and indexed per step.

    Rows hold [cos, cos] and [-sin, sin] (each half head_dim wide) so rotary embedding is
    x * cos + swap_halves(x) * sin, i.e. transformers' x * cos + rotate_half(x) * sin, bit for bit
    (x2 * -s == -(x2 * s) exactly)."""

    def __init__(self, shape: LlamaShape, device: torch.device | str = "cpu") -> None:
        self.shape, self.device = shape, torch.device(device)
        self.cos = self.sin = torch.empty(0, 2, shape.head_dim // 2, device=self.device)

    def _grow(self, n: int) -> None:
        n = min(max(n, 2 * self.cos.shape[0], 256), max(n, self.shape.max_position_embeddings))
        dim = self.shape.head_dim
        inv_freq = 1.0 / (self.shape.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
        freqs = torch.arange(n, device=self.device)[:, None].float() * inv_freq.to(self.device)
        cos, sin = freqs.cos(), freqs.sin()
        self.cos = torch.stack([cos, cos], dim=1)  # [n, 2, half]
        self.sin = torch.stack([-sin, sin], dim=1)

    def __call__(self, positions: torch.Tensor, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Tables for `positions` (the largest is stop - 1), shaped [tokens, 1, 2, half]."""
        if stop > self.cos.shape[0]:
            self._grow(stop)
        return self.cos[positions][:, None], self.sin[positions][:, None]


def rope_tables(shape: LlamaShape, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One-off tables for `positions` (RopeTable caches them across steps)."""
    return RopeTable(shape, positions.device)(positions, int(positions.max()) + 1)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of x [tokens, heads, head_dim] with tables [tokens, 1, 2, half]."""
    T, nh, d = x.shape
    halves = x.view(T, nh, 2, d // 2)
    return (halves * cos + halves.flip(2) * sin).view(T, nh, d)


def positions_of(segments: Sequence[Segment], device: torch.device | str = "cpu") -> torch.Tensor:
    if len(segments) == 1:
        s = segments[0]
        return torch.arange(s.start, s.start + s.n, device=device)
    return torch.cat([torch.arange(s.start, s.start + s.n, device=device) for s in segments])


AllReduce = Callable[[torch.Tensor], torch.Tensor]


# At batch 1 a product is a matrix-vector product that streams the weights once (MKL via torch.mm
# is at the bandwidth floor); from a few rows on MKL's small-M GEMM re-packs the weights on every
# call, and oneDNN with weights packed once (what vLLM's CPU backend does) was 20-25 % faster at 16
# rows and 20-35 % slower at 1 row, so both layouts are kept and the row count picks one.
PREPACK_MIN_ROWS = 3
_ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


def _onednn_pack(w_out_in: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(w_out_in.contiguous(), 16)


def prepack(w_out_in: torch.Tensor) -> torch.Tensor | None:
    """The oneDNN-packed copy of a [out, in] matrix, or None where oneDNN is not available."""
    return _onednn_pack(w_out_in) if _ONEDNN and w_out_in.device.type == "cpu" else None


def linear(a: torch.Tensor, w_out_in: torch.Tensor, packed: torch.Tensor | None) -> torch.Tensor:
    """a @ w_out_in.T (the LM head, stored [vocab, hidden] as the embedding it is tied to)."""
    if packed is not None and a.shape[0] >= PREPACK_MIN_ROWS:
        return torch.ops.mkldnn._linear_pointwise(a, packed, None, "none", [], "")
    return F.linear(a, w_out_in)


def _mm(a: torch.Tensor, w: torch.Tensor, packed: torch.Tensor | None) -> torch.Tensor:
    if packed is not None and a.shape[0] >= PREPACK_MIN_ROWS:
        return torch.ops.mkldnn._linear_pointwise(a, packed, None, "none", [], "")
    return torch.mm(a, w)


def _addmm(x: torch.Tensor, a: torch.Tensor, w: torch.Tensor, packed: torch.Tensor | None) -> torch.Tensor:
    if packed is not None and a.shape[0] >= PREPACK_MIN_ROWS:
        return torch.ops.mkldnn._linear_pointwise.binary(a, x, packed, None, "add")
    return torch.addmm(x, a, w)


def _project(
    x: torch.Tensor,
    a: torch.Tensor,
    w: torch.Tensor,
    packed: torch.Tensor | None,
    partial: bool,
    owns_residual: bool,
    all_reduce: AllReduce | None,
) -> torch.Tensor:
    """x + a @ w. A partial product is summed over the ranks; one of them adds the residual into
    its part first, so the all-reduce also does the residual add."""
    if not partial:
        return _addmm(x, a, w, packed)
    assert all_reduce is not None, "a tensor slice of a layer needs all_reduce to sum its output"
    return all_reduce(_addmm(x, a, w, packed) if owns_residual else _mm(a, w, packed))


def decoder_layer(
    shape: LlamaShape,
    layer: int,
    lw: PackedLayer,
    x: torch.Tensor,
    segments: Sequence[Segment],
    cos: torch.Tensor,
    sin: torch.Tensor,
    all_reduce: AllReduce | None = None,
) -> torch.Tensor:
    """x: [tokens, hidden] for the segments in order. Appends each segment's K/V to its cache."""
    d = shape.head_dim
    T = x.shape[0]
    nq, nkv = lw.n_q, lw.n_kv
    h = rms_norm(x, lw.input_norm, shape.rms_norm_eps)
    pq, po, pgu, pd = lw.packed or (None, None, None, None)
    qkv = _mm(h, lw.qkv, pq).view(T, nq + 2 * nkv, d)
    qk = _rotate(qkv[:, : nq + nkv], cos, sin)
    q, k, v = qk[:, :nq], qk[:, nq:], qkv[:, nq + nkv :]
    outs = []
    offset = 0
    gqa = nq != nkv
    for seg in segments:
        K, V = seg.kv.layers[layer]
        stop = seg.start + seg.n
        if seg.n == 1:
            # Decode fast path (same values as the general path, fewer tensor ops per sequence).
            K[:, seg.start] = k[offset]
            V[:, seg.start] = v[offset]
            o = F.scaled_dot_product_attention(
                q[offset].view(1, nq, 1, d), K[None, :, :stop], V[None, :, :stop], enable_gqa=gqa
            )
            outs.append(o.view(1, nq * d))
            offset += 1
            continue
        K[:, seg.start : stop] = k[offset : offset + seg.n].transpose(0, 1)
        V[:, seg.start : stop] = v[offset : offset + seg.n].transpose(0, 1)
        qs = q[offset : offset + seg.n].transpose(0, 1).unsqueeze(0)  # [1, n_q, n, d]
        ks, vs = K[:, :stop].unsqueeze(0), V[:, :stop].unsqueeze(0)  # [1, n_kv, S, d]
        if seg.start == 0:
            mask, causal = None, True
        else:  # a chunk after cached tokens: causal relative to absolute positions
            pos_q = torch.arange(seg.start, stop, device=x.device)[:, None]
            mask, causal = torch.arange(stop, device=x.device)[None, :] <= pos_q, False
        o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, is_causal=causal, enable_gqa=gqa)
        outs.append(o[0].transpose(0, 1).reshape(seg.n, nq * d))
        offset += seg.n
    attn = torch.cat(outs) if len(outs) > 1 else outs[0]
    x = _project(x, attn, lw.o, po, lw.attention_partial, lw.owns_residual, all_reduce)
    h = rms_norm(x, lw.post_norm, shape.rms_norm_eps)
    gate_up = _mm(h, lw.gate_up, pgu)
    act = F.silu(gate_up[:, : lw.mlp]) * gate_up[:, lw.mlp :]
    return _project(x, act, lw.down, pd, lw.mlp_partial, lw.owns_residual, all_reduce)


@dataclass
class HeadWeights:
    """What stage 0 holds besides its layers: embedding, final norm, LM head (tied or not)."""

    embed: torch.Tensor
    final_norm: torch.Tensor
    lm_head: torch.Tensor
    lm_head_packed: torch.Tensor | None = None  # oneDNN-packed copy for batches (see PREPACK_MIN_ROWS)

    @classmethod
    def load(cls, weights: WeightSource, shape: LlamaShape) -> "HeadWeights":
        embed = weights.get("model.embed_tokens.weight")
        lm_head = embed if shape.tie_word_embeddings else weights.get("lm_head.weight")
        return cls(
            embed=embed, final_norm=weights.get("model.norm.weight"), lm_head=lm_head, lm_head_packed=prepack(lm_head)
        )

    def logits(self, shape: LlamaShape, hidden: torch.Tensor) -> torch.Tensor:
        return linear(rms_norm(hidden, self.final_norm, shape.rms_norm_eps), self.lm_head, self.lm_head_packed)


class UnsplitLlama:
    """The whole model in one process: the reference the splits are checked against, and the
    world_size=1 engine's layers."""

    def __init__(self, shape: LlamaShape, weights: WeightSource) -> None:
        self.shape = shape
        self.head = HeadWeights.load(weights, shape)
        self.layers = {n: PackedLayer.pack(LayerWeights.load(weights, n, shape=shape)) for n in range(shape.num_layers)}
        self.rope = RopeTable(shape)

    def new_kv(self, capacity: int) -> SeqKV:
        return SeqKV.empty(range(self.shape.num_layers), self.shape.num_kv_heads, self.shape.head_dim, capacity)

    def forward(self, token_ids: Sequence[int], kv: SeqKV, *, all_positions: bool = False) -> torch.Tensor:
        """Logits of the last position ([vocab]) or all positions ([n, vocab]); extends the cache."""
        seg = Segment(kv=kv, start=kv.length, n=len(token_ids))
        x = self.head.embed[torch.tensor(list(token_ids))]
        cos, sin = self.rope(positions_of([seg]), seg.start + seg.n)
        for n in range(self.shape.num_layers):
            x = decoder_layer(self.shape, n, self.layers[n], x, [seg], cos, sin)
        kv.length += seg.n
        return self.head.logits(self.shape, x if all_positions else x[-1:])[... if all_positions else 0]
