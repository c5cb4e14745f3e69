"""The Llama forward pass, written out in torch so a rank can hold any part of it: a contiguous
layer range (pipeline stage), a head/MLP slice of every layer (tensor parallelism), or both, each
with a per-sequence KV cache that can be re-sharded between those layouts.

Why not drive transformers' LlamaDecoderLayer: its cache is indexed by layer_idx and sized for all
heads, and a tensor slice would need patched modules. Here every op mirrors transformers' order
(RMSNorm in fp32, RoPE via rotate_half, SwiGLU), so the unsplit model matches LlamaForCausalLM
within float tolerance (tests/engine/test_models.py), a pipeline split is bit-identical
to the unsplit model (same ops on the same shapes, one thread, every weight starting on a 64-byte
boundary: hugepages.ALIGN_BYTES), and a tensor split differs only by the order of the all-reduce sum.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from runtime.engines.hugepages import aligned
from runtime.models.registry import LlamaShape, WeightSource

# (before, after): query heads of zeros that make a slice's held query heads whole groups of its
# held KV heads (a slice that cuts through a KV group); None when they already are.
QueryPad = tuple[int, int] | None


def query_pad(q_heads: tuple[int, int], kv_heads: tuple[int, int], shape: LlamaShape) -> QueryPad:
    group = shape.num_attention_heads // shape.num_key_value_heads
    (qa, qb), (ka, kb) = q_heads, kv_heads
    if (qa, qb) == (ka * group, kb * group):
        return None
    return qa - ka * group, kb * group - qb


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
    q_pad: QueryPad = None

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
        qh = q_heads or (0, shape.num_attention_heads)
        kvh = kv_heads or (0, shape.num_key_value_heads)
        m = mlp or (0, shape.intermediate_size)
        full_attn = qh == (0, shape.num_attention_heads)
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
            q_pad=query_pad(qh, kvh, shape),
        )

    def tensor_slice(
        self, *, q_heads: tuple[int, int], kv_heads: tuple[int, int], mlp: tuple[int, int], shape: LlamaShape
    ) -> "LayerWeights":
        """A tensor slice of this full layer without re-reading the checkpoint: row slices are
        views; column slices (o_proj, down_proj) are copied so the matmuls see contiguous memory."""
        d = shape.head_dim
        full_attn = q_heads == (0, shape.num_attention_heads)
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
            q_pad=query_pad(q_heads, kv_heads, shape),
        )


@dataclass
class PackedLayer:
    """A layer laid out for the step: q/k/v fused, gate/up fused, every matrix stored [in, out] so
    a decode step is four matrix products that each stream their weights once; the two RMSNorm
    weights are folded into the rows of the products that follow them (normed_mm). Built from
    LayerWeights (whole or a tensor slice); the unpacked tensors can then be dropped."""

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
    q_pad: QueryPad = None
    # The same four matrices pre-packed for oneDNN, used from PREPACK_MIN_ROWS rows up (None: off).
    packed: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    @classmethod
    def pack(cls, lw: LayerWeights, *, owns_residual: bool = True, prepack: bool = True) -> "PackedLayer":
        # RMSNorm(x) @ W.T = (x * r) * g @ W.T = (x * r) @ (W * g).T: g scales W's input columns.
        qkv = torch.cat([lw.wq, lw.wk, lw.wv]) * lw.input_norm
        gate_up = torch.cat([lw.w_gate, lw.w_up]) * lw.post_norm
        packed = None
        if prepack and _ONEDNN and qkv.device.type == "cpu":
            packed = tuple(_onednn_pack(w) for w in (qkv, lw.wo, gate_up, lw.w_down))
        return cls(
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
            q_pad=lw.q_pad,
        )


@dataclass
class SeqKV:
    """One sequence's KV cache on this rank: per layer held, K and V of shape [n_kv, capacity, d].

    Either its own tensors, or views of one slot of a KVSlab (slab and slot set), which lets a
    decode step attend for every sequence of the slab in one call."""

    capacity: int
    length: int = 0
    layers: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    slab: "KVSlab | None" = None
    slot: int = -1

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

    def release(self) -> None:
        """Give a slab slot back to its allocator (nothing to do for a cache of its own)."""
        if self.slab is not None:
            self.slab.owner.release(self)

    def copy_into(self, other: "SeqKV") -> "SeqKV":
        """other (fresh, same layers, capacity at least this one's) with this cache's contents."""
        L = self.length
        for n, (k, v) in self.layers.items():
            K, V = other.layers[n]
            K[:, :L] = k[:, :L]
            V[:, :L] = v[:, :L]
        other.length = L
        return other


class KVSlab:
    """The KV caches of up to `slots` sequences of up to `tokens` positions each, one
    [slots, n_kv, tokens, d] tensor per layer for K and for V. A slot's SeqKV holds views of it."""

    def __init__(self, owner: "KVAllocator", slots: int, tokens: int) -> None:
        self.owner, self.tokens = owner, tokens
        shape = (slots, owner.n_kv, tokens, owner.head_dim)
        # Zeroed, not empty: a batched attention call reads the masked positions too, and masking
        # a NaN left in uninitialised memory still yields NaN. So a slab is resident in full from
        # the start (at most SLAB_MAX_TOKENS positions of every layer held).
        self.k = {n: torch.zeros(shape, device=owner.device) for n in owner.layers}
        self.v = {n: torch.zeros(shape, device=owner.device) for n in owner.layers}
        self.free = list(range(slots))  # a heap: the lowest free slot is taken first
        self.slots = slots

    def take(self, capacity: int) -> SeqKV:
        slot = heapq.heappop(self.free)
        layers = {n: (self.k[n][slot, :, :capacity], self.v[n][slot, :, :capacity]) for n in self.k}
        return SeqKV(capacity=capacity, layers=layers, slab=self, slot=slot)


# Slabs: a capacity rounds up to a power of two (at least 64 positions) and shares a slab with the
# sequences of the same bucket: up to 16 of them, and no more than 4096 positions per slab, so a
# long sequence gets a slab of its own (it then decodes alone, as a SeqKV of its own would).
SLAB_MIN_TOKENS, SLAB_SLOTS, SLAB_MAX_TOKENS = 64, 16, 4096


class KVAllocator:
    """This rank's KV caches for one layout (its layers, its KV heads), grouped into slabs so that a
    decode step runs one attention call per slab and layer instead of one per sequence."""

    def __init__(self, layers: Sequence[int], n_kv: int, head_dim: int, device: torch.device | str = "cpu") -> None:
        self.layers, self.n_kv, self.head_dim, self.device = list(layers), n_kv, head_dim, torch.device(device)
        self.slabs: dict[int, list[KVSlab]] = {}  # by bucket (positions per slot)
        # The one empty slab kept for the next burst (a slab is zeroed when made: ~5-40 ms); every
        # other slab that empties is dropped, so idle memory is at most one slab.
        self.spare: KVSlab | None = None

    def new(self, capacity: int) -> SeqKV:
        bucket = max(SLAB_MIN_TOKENS, 1 << (capacity - 1).bit_length())
        slots = min(SLAB_SLOTS, SLAB_MAX_TOKENS // bucket)
        if slots < 2:
            return SeqKV.empty(self.layers, self.n_kv, self.head_dim, capacity, self.device)
        slabs = self.slabs.setdefault(bucket, [])
        slab = next((s for s in slabs if s.free), None)
        if slab is None:
            slab = KVSlab(self, slots, bucket)
            slabs.append(slab)
        if slab is self.spare:
            self.spare = None
        return slab.take(capacity)

    def release(self, kv: SeqKV) -> None:
        """Give kv's slot back (its views must not be used afterwards); a no-op for a cache of its own."""
        slab = kv.slab
        if slab is None:
            return
        assert slab.owner is self, "a slot goes back to the allocator it came from"
        kv.slab, kv.layers = None, {}
        heapq.heappush(slab.free, kv.slot)
        if len(slab.free) == slab.slots:
            if self.spare is not None:
                self.slabs[self.spare.tokens].remove(self.spare)
            self.spare = slab

    def held(self) -> int:
        """Slots in use (tests: every freed sequence gives its slot back)."""
        return sum(s.slots - len(s.free) for slabs in self.slabs.values() for s in slabs)

    def slab_count(self) -> int:
        return sum(len(slabs) for slabs in self.slabs.values())


@dataclass(frozen=True)
class Segment:
    """A run of consecutive tokens of one sequence inside a flat [tokens, hidden] batch."""

    kv: SeqKV
    start: int  # position of the first token (the cache length before it)
    n: int


@dataclass
class SlabRows:
    """The rows of a decode step whose caches share a slab: their K/V writes and their attention are
    one call per layer. Slots lo..hi-1 are attended; rows are the step's rows in slot order."""

    slab: KVSlab
    rows: torch.Tensor | None  # None: every row of the step, already in slot order
    slots: torch.Tensor
    pos: torch.Tensor  # the position each row writes (its cache length before the token)
    lo: int
    hi: int
    at: torch.Tensor | None  # each row's index in lo..hi; None when the rows fill lo..hi
    mask: torch.Tensor | None  # [hi - lo, 1, 1, L]: True where a slot attends; None: all of 0..L-1
    L: int


@dataclass
class DecodePlan:
    """How a step's single-token segments attend: a call per slab, and alone the rows whose cache
    shares a slab with no other row of the step. A step that also prefills has its prompt segments
    first (`lead` segments over `lead_rows` rows), attended per segment; `alone` counts from the first
    single-token segment."""

    groups: list[SlabRows]
    alone: list[int]
    lead: int = 0
    lead_rows: int = 0


def plan_decode(segments: Sequence[Segment], device: torch.device | str = "cpu", lead: int = 0) -> DecodePlan | None:
    """None unless every segment after the first `lead` (a step's prompt chunks) is one token and at
    least two of those share a slab (then the per-sequence path is just as good)."""
    head, tail = segments[:lead], segments[lead:]
    if not tail or any(g.n != 1 for g in tail):
        return None
    base = sum(g.n for g in head)  # the rows before the first single-token segment
    by_slab: dict[int, tuple[KVSlab, list[int]]] = {}
    alone: list[int] = []
    for i, seg in enumerate(tail):
        if seg.kv.slab is None:
            alone.append(i)
        else:
            by_slab.setdefault(id(seg.kv.slab), (seg.kv.slab, []))[1].append(i)
    groups = []
    for slab, rows in by_slab.values():
        if len(rows) == 1:
            alone += rows
            continue
        rows.sort(key=lambda i: tail[i].kv.slot)
        slots = [tail[i].kv.slot for i in rows]
        pos = [tail[i].start for i in rows]
        lo, hi, L = slots[0], slots[-1] + 1, max(pos) + 1
        # A slot in lo..hi that is not in the step attends to its position 0 (finite: slabs start
        # zeroed) and its output is dropped.
        lens = [1] * (hi - lo)
        for slot, p in zip(slots, pos):
            lens[slot - lo] = p + 1
        mask = None
        if any(n != L for n in lens):
            mask = (torch.arange(L, device=device) < torch.tensor(lens, device=device)[:, None]).view(hi - lo, 1, 1, L)
        groups.append(
            SlabRows(
                slab=slab,
                rows=None if base == 0 and rows == list(range(len(tail))) else torch.tensor(rows, device=device) + base,
                slots=torch.tensor(slots, device=device),
                pos=torch.tensor(pos, device=device),
                lo=lo,
                hi=hi,
                at=None if hi - lo == len(rows) else torch.tensor([x - lo for x in slots], device=device),
                mask=mask,
                L=L,
            )
        )
    return DecodePlan(groups=groups, alone=sorted(alone), lead=lead, lead_rows=base) if groups else None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # One call (on CPU torch runs it as several ops); the same arithmetic as transformers'
    # LlamaRMSNorm for fp32 activations (fp32 mean of squares, rsqrt, weight applied last). The
    # layers fold their norms into their products instead (normed_mm); this is the final norm.
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


def normed_mm(x: torch.Tensor, w: torch.Tensor, packed: torch.Tensor | None, eps: float) -> torch.Tensor:
    """rms_norm(x, g) @ w where g is already folded into w's rows (PackedLayer.pack): each row of x
    is scaled by rsqrt(mean(x^2) + eps), transformers' LlamaRMSNorm without its weight. One row
    takes its scale from one dot product as a Python float: four tensor ops where F.rms_norm and
    the product dispatch about ten, each costing microseconds once a product has flushed the caches
    (measured at batch 1 on one thread: both norms with their products 27 us less per layer, about
    0.8 ms a step)."""
    if x.shape[0] == 1:
        r = (float(torch.dot(x[0], x[0])) / x.shape[1] + eps) ** -0.5
        return _mm(x * r, w, packed)
    return _mm(x * torch.rsqrt(x.square().mean(-1, keepdim=True).add_(eps)), w, packed)


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


def _sdpa(
    q: torch.Tensor,
    K: torch.Tensor,
    V: torch.Tensor,
    pad: QueryPad,
    mask: torch.Tensor | None = None,
    causal: bool = False,
) -> torch.Tensor:
    """Attention of q [B, n_q, Lq, d] over K, V [B, n_kv, L, d] (grouped-query). When the held query
    heads cut through a KV group, q is padded with heads of zeros to whole groups for the call and
    their outputs dropped: one call still, where a call per KV head cost more than the padding."""
    if pad is None:
        gqa = q.shape[1] != K.shape[1]
        return F.scaled_dot_product_attention(q, K, V, attn_mask=mask, is_causal=causal, enable_gqa=gqa)
    before, after = pad
    o = F.scaled_dot_product_attention(
        F.pad(q, (0, 0, 0, 0, before, after)), K, V, attn_mask=mask, is_causal=causal, enable_gqa=True
    )
    return o[:, before : before + q.shape[1]]


def _attend_one(
    layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seg: Segment, pad: QueryPad
) -> torch.Tensor:
    """One decoding sequence (q, k, v: its row [heads, d]): append K/V, attend over its cache."""
    K, V = seg.kv.layers[layer]
    K[:, seg.start] = k
    V[:, seg.start] = v
    stop = seg.start + 1
    nq, d = q.shape
    o = _sdpa(q.view(1, nq, 1, d), K[None, :, :stop], V[None, :, :stop], pad)
    return o.reshape(1, nq * d)


def _attend_segments(
    layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, segments: Sequence[Segment], pad: QueryPad
) -> torch.Tensor:
    """Attention of each segment over its own cache (prompts, chunks, caches of their own)."""
    T, nq, d = q.shape
    outs = []
    offset = 0
    for seg in segments:
        if seg.n == 1:
            outs.append(_attend_one(layer, q[offset], k[offset], v[offset], seg, pad))
            offset += 1
            continue
        K, V = seg.kv.layers[layer]
        stop = seg.start + seg.n
        K[:, seg.start : stop] = k[offset : offset + seg.n].transpose(0, 1)
        V[:, seg.start : stop] = v[offset : offset + seg.n].transpose(0, 1)
        qs = q[offset : offset + seg.n].transpose(0, 1).unsqueeze(0)  # [1, n_q, n, d]
        ks, vs = K[:, :stop].unsqueeze(0), V[:, :stop].unsqueeze(0)  # [1, n_kv, S, d]
        if seg.start == 0:
            mask, causal = None, True
        else:  # a chunk after cached tokens: causal relative to absolute positions
            pos_q = torch.arange(seg.start, stop, device=q.device)[:, None]
            mask, causal = torch.arange(stop, device=q.device)[None, :] <= pos_q, False
        o = _sdpa(qs, ks, vs, pad, mask, causal)
        outs.append(o[0].transpose(0, 1).reshape(seg.n, nq * d))
        offset += seg.n
    return torch.cat(outs) if len(outs) > 1 else outs[0]


def _attend_slab(
    layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: SlabRows, pad: QueryPad
) -> torch.Tensor:
    """One slab's rows of a decode step: one write of K, one of V and one attention call over the
    slab's slots lo..hi-1, padded to the longest and masked. Rows come back in slot order."""
    _, nq, d = q.shape
    Kp, Vp = g.slab.k[layer], g.slab.v[layer]
    qg, kg, vg = (q, k, v) if g.rows is None else (q[g.rows], k[g.rows], v[g.rows])
    Kp[g.slots, :, g.pos] = kg
    Vp[g.slots, :, g.pos] = vg
    span = g.hi - g.lo
    if g.at is None:
        qs = qg.unsqueeze(2)  # [rows, n_q, 1, d]
    else:
        qs = qg.new_zeros(span, nq, 1, d)
        qs[g.at] = qg.unsqueeze(2)
    o = _sdpa(qs, Kp[g.lo : g.hi, :, : g.L], Vp[g.lo : g.hi, :, : g.L], pad, g.mask).reshape(span, nq * d)
    return o if g.at is None else o[g.at]


def _attend_decode(
    layer: int,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    segments: Sequence[Segment],
    plan: DecodePlan,
    pad: QueryPad,
) -> torch.Tensor:
    """A decode step's attention: one call per slab for its rows (_attend_slab), the other rows
    alone, a step's prompt chunks per segment (_attend_segments), all placed back in the step's order."""
    first = plan.groups[0]
    if first.rows is None:  # one slab holds every row of the step, in slot order
        return _attend_slab(layer, q, k, v, first, pad)
    T, nq, d = q.shape
    out = q.new_empty(T, nq * d)
    r = plan.lead_rows
    if plan.lead:
        out[:r] = _attend_segments(layer, q[:r], k[:r], v[:r], segments[: plan.lead], pad)
    for g in plan.groups:
        out[g.rows] = _attend_slab(layer, q, k, v, g, pad)
    for i in plan.alone:
        out[r + i] = _attend_one(layer, q[r + i], k[r + i], v[r + i], segments[plan.lead + i], pad)[0]
    return out


def decoder_layer(
    shape: LlamaShape,
    layer: int,
    lw: PackedLayer,
    x: torch.Tensor,
    segments: Sequence[Segment],
    cos: torch.Tensor,
    sin: torch.Tensor,
    all_reduce: AllReduce | None = None,
    decode: DecodePlan | None = None,
) -> torch.Tensor:
    """x: [tokens, hidden] for the segments in order. Appends each segment's K/V to its cache;
    decode (plan_decode of the segments) batches the attention of single-token steps per slab."""
    d = shape.head_dim
    T = x.shape[0]
    nq, nkv = lw.n_q, lw.n_kv
    pq, po, pgu, pd = lw.packed or (None, None, None, None)
    qkv = normed_mm(x, lw.qkv, pq, shape.rms_norm_eps).view(T, nq + 2 * nkv, d)
    qk = _rotate(qkv[:, : nq + nkv], cos, sin)
    q, k, v = qk[:, :nq], qk[:, nq:], qkv[:, nq + nkv :]
    if decode is not None:
        attn = _attend_decode(layer, q, k, v, segments, decode, lw.q_pad)
    else:
        attn = _attend_segments(layer, q, k, v, segments, lw.q_pad)
    x = _project(x, attn, lw.o, po, lw.attention_partial, lw.owns_residual, all_reduce)
    gate_up = normed_mm(x, lw.gate_up, pgu, shape.rms_norm_eps)
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
        # The LM head is read in place by one-row products: aligned as every split holds it, or the
        # unsplit model's logits could differ from a split's in the last bits (hugepages.ALIGN_BYTES).
        embed = aligned(weights.get("model.embed_tokens.weight"))
        lm_head = embed if shape.tie_word_embeddings else aligned(weights.get("lm_head.weight"))
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
        self.layers = {
            n: PackedLayer.pack(LayerWeights.load(weights, n, shape=shape)) for n in range(shape.num_hidden_layers)
        }
        self.rope = RopeTable(shape)

    def new_kv(self, capacity: int) -> SeqKV:
        return SeqKV.empty(
            range(self.shape.num_hidden_layers), self.shape.num_key_value_heads, self.shape.head_dim, capacity
        )

    def forward(self, token_ids: Sequence[int], kv: SeqKV, *, all_positions: bool = False) -> torch.Tensor:
        """Logits of the last position ([vocab]) or all positions ([n, vocab]); extends the cache."""
        seg = Segment(kv=kv, start=kv.length, n=len(token_ids))
        x = self.head.embed[torch.tensor(list(token_ids))]
        cos, sin = self.rope(positions_of([seg]), seg.start + seg.n)
        for n in range(self.shape.num_hidden_layers):
            x = decoder_layer(self.shape, n, self.layers[n], x, [seg], cos, sin)
        kv.length += seg.n
        return self.head.logits(self.shape, x if all_positions else x[-1:])[... if all_positions else 0]
