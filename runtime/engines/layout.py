"""The parallel plan of a unit: which contiguous layers each rank runs as a pipeline stage, and how
each layer's attention heads and MLP are split for tensor parallelism (with an explicit fallback
when the heads do not divide by the degree). Pure arithmetic on the model's shape; printable."""

from __future__ import annotations

from dataclasses import dataclass

import contract
from contract import Strategy
from runtime.models.registry import LlamaShape

STRATEGIES = contract.STRATEGIES


@dataclass(frozen=True)
class PipelineStage:
    rank: int
    first_layer: int
    stop_layer: int  # exclusive
    holds_embedding: bool  # stage 0: token embedding; final norm + LM head sit with it
    cost: int  # parameters this stage multiplies per token

    @property
    def layers(self) -> range:
        return range(self.first_layer, self.stop_layer)


@dataclass(frozen=True)
class TensorSlice:
    rank: int
    q_heads: tuple[int, int]  # [start, stop) of query heads this rank computes
    kv_heads: tuple[int, int]
    mlp: tuple[int, int]  # [start, stop) of the MLP intermediate dimension
    vocab: tuple[int, int] = (0, 0)  # [start, stop) of the LM head rows (vocab-parallel logits)


@dataclass(frozen=True)
class ParallelPlan:
    shape: LlamaShape
    world_size: int
    prefill: str
    decode: str
    stages: tuple[PipelineStage, ...]
    tensor_slices: tuple[TensorSlice, ...]
    attention_replicated: bool  # heads do not divide by tp_degree: every rank runs all heads
    notes: tuple[str, ...]

    @property
    def pp_degree(self) -> int:
        return self.world_size

    @property
    def tp_degree(self) -> int:
        return self.world_size

    def stage(self, rank: int) -> PipelineStage:
        return self.stages[rank]

    def tensor_slice(self, rank: int) -> TensorSlice:
        return self.tensor_slices[rank]

    def uses(self, strategy: str) -> bool:
        return strategy in (self.prefill, self.decode)

    def needs_reshard(self) -> bool:
        return self.world_size > 1 and self.prefill != self.decode

    def params_held(self, rank: int) -> int:
        """Weights this rank loads: its stage's full layers and/or its tensor slice of every layer."""
        s = self.shape
        h, d = s.hidden_size, s.head_dim
        total = 0
        full_layers = set(self.stage(rank).layers) if self.uses(Strategy.PIPELINE) else set()
        if self.uses(Strategy.TENSOR):
            t = self.tensor_slice(rank)
            q = t.q_heads[1] - t.q_heads[0]
            kv = t.kv_heads[1] - t.kv_heads[0]
            m = t.mlp[1] - t.mlp[0]
            sliced = h * d * (2 * q + 2 * kv) + 3 * h * m + 2 * h
            total += sliced * (s.num_hidden_layers - len(full_layers))
            if rank != 0 and self.world_size > 1:  # rank 0 already holds the whole LM head
                total += (t.vocab[1] - t.vocab[0]) * h + h
        total += s.layer_params * len(full_layers)
        if rank == 0:
            total += _head_cost(s)
        return total

    def describe(self) -> str:
        s = self.shape

        def used_by(strategy: str) -> str:
            phases = [ph for ph, st in (("prefill", self.prefill), ("decode", self.decode)) if st == strategy]
            return f"used for {' and '.join(phases)}" if phases else "not used by these strategies"

        def span(a: int, b: int) -> str:
            return f"{a}" if b - a == 1 else f"{a}-{b - 1}"

        lines = [
            f"model: {s.num_hidden_layers} layers, hidden {s.hidden_size}, {s.num_attention_heads} query / "
            f"{s.num_key_value_heads} KV heads (head_dim {s.head_dim}), MLP intermediate "
            f"{s.intermediate_size}, vocab {s.vocab_size}, "
            f"{'tied' if s.tie_word_embeddings else 'untied'} embeddings",
            f"unit: world_size {self.world_size}; prefill={self.prefill}, decode={self.decode}",
            f"pipeline (pp_degree {self.pp_degree}, {used_by('pipeline')}), stages balanced by "
            "parameters per token (embedding and LM head counted on stage 0):",
        ]
        total = sum(st.cost for st in self.stages)
        for st in self.stages:
            extra = " + embedding, final norm, LM head, sampling" if st.holds_embedding else ""
            lines.append(
                f"  rank {st.rank}: layers {st.first_layer}-{st.stop_layer - 1} "
                f"({len(st.layers)} layers){extra}; cost {st.cost / 1e6:.2f}M "
                f"({100 * st.cost / total:.1f}%)"
            )
        lines.append(f"tensor parallel (tp_degree {self.tp_degree}, {used_by('tensor')}), every layer split:")
        for t in self.tensor_slices:
            lines.append(
                f"  rank {t.rank}: query heads {span(*t.q_heads)}, KV heads "
                f"{span(*t.kv_heads)}, MLP columns {span(*t.mlp)}, LM head rows "
                f"{span(*t.vocab)}{'; embedding, sampling' if t.rank == 0 else ''}"
            )
        if self.needs_reshard():
            src, dst = (
                ("layer-split", "head-split") if self.prefill == Strategy.PIPELINE else ("head-split", "layer-split")
            )
            lines.append(f"KV cache re-shard after prefill: {src} -> {dst}")
        for r in range(self.world_size):
            lines.append(
                f"  rank {r} holds {self.params_held(r) / 1e6:.2f}M parameters "
                f"({self.params_held(r) * 4 / 2**20:.0f} MiB fp32; on CPU the weights are held twice, "
                "plain and oneDNN-packed)"
            )
        lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)


def _head_cost(s: LlamaShape) -> int:
    # Tied: the LM head multiplies the embedding matrix, held once. Untied: both matrices live here.
    embed = s.vocab_size * s.hidden_size
    return embed * (1 if s.tie_word_embeddings else 2) + s.hidden_size


def split_even(n: int, parts: int) -> list[tuple[int, int]]:
    """n items in `parts` contiguous [start, stop) ranges whose sizes differ by at most one."""
    base, extra = divmod(n, parts)
    out, start = [], 0
    for i in range(parts):
        stop = start + base + (1 if i < extra else 0)
        out.append((start, stop))
        start = stop
    return out


def _balanced_stages(s: LlamaShape, world_size: int) -> list[tuple[int, int]]:
    """Contiguous layer ranges minimising the largest stage cost (exact DP; L and P are small)."""
    L, P, c = s.num_hidden_layers, world_size, s.layer_params
    head = _head_cost(s)
    inf = float("inf")
    # best[p][n]: minimal max-cost putting layers [0, n) on stages [0, p)
    best = [[inf] * (L + 1) for _ in range(P + 1)]
    cut = [[0] * (L + 1) for _ in range(P + 1)]
    best[0][0] = 0
    for p in range(1, P + 1):
        for n in range(p, L - (P - p) + 1):
            for k in range(p - 1, n):
                cost = (n - k) * c + (head if p == 1 else 0)
                val = max(best[p - 1][k], cost)
                if val < best[p][n]:
                    best[p][n], cut[p][n] = val, k
    ranges, n = [], L
    for p in range(P, 0, -1):
        k = cut[p][n]
        ranges.append((k, n))
        n = k
    return ranges[::-1]


def _uneven_heads(n: int, parts: int) -> list[tuple[int, int]]:
    """split_even, but the larger shares go to the last ranks (rank 0 has the most other work)."""
    sizes = sorted(b - a for a, b in split_even(n, parts))
    out, start = [], 0
    for size in sizes:
        out.append((start, start + size))
        start += size
    return out


def check_strategies(prefill: str, decode: str) -> None:
    """Refuse a phase strategy that is not one of STRATEGIES (the plan and the engine both ask)."""
    for phase, value in (("prefill", prefill), ("decode", decode)):
        if value not in STRATEGIES:
            raise ValueError(f"{phase} strategy {value!r} is not one of {', '.join(STRATEGIES)}")


def make_plan(
    shape: LlamaShape,
    world_size: int,
    *,
    prefill: str = Strategy.PIPELINE,
    decode: str = Strategy.TENSOR,
    boundaries: tuple[int, ...] | None = None,
    split_uneven_heads: bool = False,
) -> ParallelPlan:
    """boundaries: explicit first layer of stages 1..world_size-1 instead of the balanced split.

    split_uneven_heads: when the KV heads do not divide by world_size, split the query heads as evenly
    as they go (a KV head read by two ranks is held by both) instead of replicating attention.
    That costs a second all-reduce per layer, worth it only on a fast transport (shared memory);
    the engine asks for it when its ranks share a host."""
    check_strategies(prefill, decode)
    if world_size < 1:
        raise ValueError(f"world_size {world_size} must be at least 1")
    if world_size > shape.num_hidden_layers:
        raise ValueError(
            f"world_size {world_size} exceeds the model's {shape.num_hidden_layers} layers: "
            "every pipeline stage needs at least one layer; use fewer nodes"
        )
    if world_size > shape.intermediate_size:
        raise ValueError(f"world_size {world_size} exceeds the MLP width {shape.intermediate_size}")
    notes = []
    stages = []
    if boundaries is not None:
        cuts = [0, *boundaries, shape.num_hidden_layers]
        if len(boundaries) != world_size - 1 or any(a >= b for a, b in zip(cuts, cuts[1:])):
            raise ValueError(
                f"boundaries {boundaries} must be {world_size - 1} increasing layer "
                f"indices inside 1..{shape.num_hidden_layers - 1}"
            )
        ranges = list(zip(cuts, cuts[1:]))
        notes.append(f"layer split forced at {list(boundaries)} (not cost-balanced)")
    else:
        ranges = _balanced_stages(shape, world_size)
    for rank, (a, b) in enumerate(ranges):
        cost = (b - a) * shape.layer_params + (_head_cost(shape) if rank == 0 else 0)
        stages.append(PipelineStage(rank=rank, first_layer=a, stop_layer=b, holds_embedding=rank == 0, cost=cost))
    replicated = shape.num_key_value_heads % world_size != 0
    group = shape.num_attention_heads // shape.num_key_value_heads
    mlp = split_even(shape.intermediate_size, world_size)
    vocab = split_even(shape.vocab_size, world_size)
    uneven = replicated and split_uneven_heads and shape.num_key_value_heads >= world_size
    if uneven:
        # Query heads split as evenly as they go; a rank holds every KV head its query heads read, so
        # a KV head whose group straddles two ranks is computed (and cached) on both. The two blocks
        # between all-reduces (attention, MLP) are then each near-even, which is what the ranks wait
        # on; whole KV groups per rank (SmolLM2: 3 and 6 query heads) left one rank idle in one block
        # of every layer and the other in the next, whatever the MLP split.
        q = _uneven_heads(shape.num_attention_heads, world_size)
        kv = [(a // group, -(-b // group)) for a, b in q]
        notes.append(
            f"attention split UNEVENLY: {shape.num_attention_heads} query heads over tp_degree {world_size} "
            f"({', '.join(str(b - a) for a, b in q)} per rank, the extra ones away from rank 0, which "
            "also embeds and samples); a KV head shared by two ranks' query heads is held by both "
            f"(KV heads {', '.join(f'{a}-{b - 1}' for a, b in kv)}); MLP split evenly; two all-reduces "
            "per layer (cheap over shared memory)"
        )
        slices = tuple(
            TensorSlice(rank=r, q_heads=q[r], kv_heads=kv[r], mlp=mlp[r], vocab=vocab[r]) for r in range(world_size)
        )
        replicated = False
    elif replicated:
        notes.append(
            f"attention REPLICATED on every rank: {shape.num_attention_heads} query / {shape.num_key_value_heads} KV "
            f"heads do not divide by tp_degree {world_size}; the MLP is still split, so tensor-"
            "parallel layers all-reduce once (after the MLP) instead of twice. An uneven split "
            "of the KV groups saves the duplicated attention but adds an all-reduce per layer: "
            "the engine uses it when its ranks share memory, not over a network"
        )
        slices = tuple(
            TensorSlice(
                rank=r,
                q_heads=(0, shape.num_attention_heads),
                kv_heads=(0, shape.num_key_value_heads),
                mlp=mlp[r],
                vocab=vocab[r],
            )
            for r in range(world_size)
        )
    else:
        kv = split_even(shape.num_key_value_heads, world_size)
        slices = tuple(
            TensorSlice(
                rank=r, q_heads=(kv[r][0] * group, kv[r][1] * group), kv_heads=kv[r], mlp=mlp[r], vocab=vocab[r]
            )
            for r in range(world_size)
        )
    if shape.intermediate_size % world_size:
        notes.append(
            f"MLP width {shape.intermediate_size} does not divide by {world_size}: slices differ by one column"
        )
    return ParallelPlan(
        shape=shape,
        world_size=world_size,
        prefill=prefill,
        decode=decode,
        stages=tuple(stages),
        tensor_slices=slices,
        attention_replicated=replicated,
        notes=tuple(notes),
    )
