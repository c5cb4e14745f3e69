"""One rank's share of the model and the step it runs in lock-step with its peers.

The leader broadcasts each StepCommand (free / prefill / decode, ids only: token ids never leave
rank 0, which holds the embedding); every rank then runs the same sequence of collectives for it.
Prefill and decode each run as a pipeline (contiguous layers per rank, hidden states passed on)
or tensor-parallel (every layer split by heads/MLP, all-reduce after each split block); when the
two differ, the prefilled KV cache is re-sharded between layer-split and head-split layouts.
"""

from __future__ import annotations

import dataclasses
import zlib
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F

from contract import Strategy
from runtime.engines.base import EngineBroken
from runtime.engines.collectives import Communicator, GlooCommunicator
from runtime.engines.hugepages import on_huge_pages
from runtime.engines.layout import ParallelPlan, split_even
from runtime.engines.llama import (
    HeadWeights,
    KVAllocator,
    LayerWeights,
    PackedLayer,
    RopeTable,
    Segment,
    SeqKV,
    decoder_layer,
    linear,
    plan_decode,
    positions_of,
    prepack,
    rms_norm,
)
from runtime.engines.prefix_cache import BLOCK_TOKENS
from runtime.models.registry import WeightSource

OP_STEP, OP_HEARTBEAT, OP_SHUTDOWN, OP_REPEAT_DECODE, OP_STRATEGIES = 1, 2, 3, 4, 5
_STRATEGY_CODE = {"auto": 0, Strategy.PIPELINE: 1, Strategy.TENSOR: 2}
_STRATEGY_NAME = {v: k for k, v in _STRATEGY_CODE.items()}


HEADER_LEN = 10  # op, then the counts of free / prefill / decode / fork / load / store / drop / draft / trim entries
_PREFILL_WIDTH = 5  # a prefill on the wire: seq_id, n_tokens, capacity, cached tokens, ongoing (0/1)


@dataclass
class StepCommand:
    """One scheduler iteration. Token ids are meaningful on rank 0 only."""

    free: list[int] = field(default_factory=list)
    prefill: list[tuple[int, int, int]] = field(default_factory=list)  # (seq_id, n_tokens, capacity)
    prefill_tokens: list[Sequence[int]] = field(default_factory=list)
    decode: list[int] = field(default_factory=list)  # seq ids, one token each
    decode_tokens: list[int] = field(default_factory=list)
    # (source seq_id, new seq_id): after prefill, the new sequence starts as a copy of the source's
    # KV cache, so n completions of one prompt share its prefill.
    fork: list[tuple[int, int]] = field(default_factory=list)
    # Prefix cache (prefix_cache.PrefixCache decides, every rank does it in its prefill layout):
    # per prefill, the prompt tokens whose KV comes from cached blocks (empty: none); the blocks to
    # copy in first, (seq_id, block number, block id); the prompt blocks to keep after prefill,
    # (seq_id, block number, block id); and the block ids to forget, before anything else.
    cached: list[int] = field(default_factory=list)
    load: list[tuple[int, int, int]] = field(default_factory=list)
    store: list[tuple[int, int, int]] = field(default_factory=list)
    drop: list[int] = field(default_factory=list)
    # Chunked prefill: the seq ids whose prompt continues in a later step. Such a prefill computes
    # positions cached..n_tokens onto the sequence's own KV (a later chunk: the KV its earlier chunks
    # left, in the prefill layout), and its KV is not re-sharded until its last chunk has run.
    ongoing: list[int] = field(default_factory=list)
    # Speculative decoding (runtime/engines/speculative.py): (seq_id, k) for a decode entry that also
    # verifies k draft tokens, and draft_tokens (rank 0 only) the drafts of every decode entry. Such an
    # entry is one segment of 1 + k tokens and gets 1 + k rows of logits; the leader lists these entries
    # first among the decode entries, so the single-token rest still attends per slab. trim: (seq_id,
    # positions) a sequence's cache gives back from its end before anything else (rejected drafts).
    drafts: list[tuple[int, int]] = field(default_factory=list)
    draft_tokens: list[Sequence[int]] = field(default_factory=list)
    trim: list[tuple[int, int]] = field(default_factory=list)

    def cached_tokens(self, i: int) -> int:
        return self.cached[i] if self.cached else 0

    def encode(self) -> tuple[torch.Tensor, torch.Tensor]:
        ongoing = set(self.ongoing)
        header = torch.tensor(
            [
                OP_STEP,
                len(self.free),
                len(self.prefill),
                len(self.decode),
                len(self.fork),
                len(self.load),
                len(self.store),
                len(self.drop),
                len(self.drafts),
                len(self.trim),
            ],
            dtype=torch.int64,
        )
        flat = (
            list(self.free)
            + [v for i, p in enumerate(self.prefill) for v in (*p, self.cached_tokens(i), int(p[0] in ongoing))]
            + list(self.decode)
            + [v for pair in self.fork for v in pair]
            + [v for t in self.load for v in t]
            + [v for t in self.store for v in t]
            + list(self.drop)
            + [v for pair in (*self.drafts, *self.trim) for v in pair]
        )
        return header, torch.tensor(flat, dtype=torch.int64)

    @staticmethod
    def payload_len(header: torch.Tensor) -> int:
        h = [int(v) for v in header[1:HEADER_LEN]]
        return h[0] + _PREFILL_WIDTH * h[1] + h[2] + 2 * h[3] + 3 * h[4] + 3 * h[5] + h[6] + 2 * h[7] + 2 * h[8]

    @classmethod
    def decode_payload(cls, header: torch.Tensor, payload: torch.Tensor) -> "StepCommand":
        n_free, n_prefill, n_decode, n_fork, n_load, n_store, n_drop, n_drafts, n_trim = (
            int(v) for v in header[1:HEADER_LEN]
        )
        vals = iter(payload.tolist())

        def take(n: int, width: int) -> list:
            return [tuple(next(vals) for _ in range(width)) for _ in range(n)]

        free = [v for (v,) in take(n_free, 1)]
        pre = take(n_prefill, _PREFILL_WIDTH)
        decode = [v for (v,) in take(n_decode, 1)]
        fork = take(n_fork, 2)
        load, store = take(n_load, 3), take(n_store, 3)
        drop = [v for (v,) in take(n_drop, 1)]
        drafts, trim = take(n_drafts, 2), take(n_trim, 2)
        return cls(
            free=free,
            prefill=[p[:3] for p in pre],
            decode=decode,
            fork=fork,
            cached=[p[3] for p in pre],
            load=load,
            store=store,
            drop=drop,
            ongoing=[p[0] for p in pre if p[4]],
            drafts=drafts,
            trim=trim,
        )


@dataclass
class StepResult:
    prefill_logits: torch.Tensor | None = None  # rank 0: [n_prefill, vocab], last positions
    decode_logits: torch.Tensor | None = None  # rank 0: [decode rows, vocab]: one per entry, 1 + k if drafted


PIPELINE_CHUNK_TOKENS = 128


def pipeline_prefill_chunks(n: int, world_size: int) -> list[tuple[int, int]]:
    """How a prompt of n tokens is cut into pipeline micro-batches: whole below
    2 x PIPELINE_CHUNK_TOKENS (or on one rank), else up to 2 x world_size chunks of at least
    PIPELINE_CHUNK_TOKENS, so the stages overlap on a single long prompt."""
    if world_size == 1 or n < 2 * PIPELINE_CHUNK_TOKENS:
        return [(0, n)]
    return split_even(n, min(2 * world_size, n // PIPELINE_CHUNK_TOKENS))


def plan_fingerprint(model_id: str, plan: ParallelPlan, prefill: str, decode: str) -> list[int]:
    """What every rank must agree on before serving: model, shape, world size, the strategies as
    requested (auto included)."""
    return [
        zlib.crc32(f"{model_id}|{plan.shape!r}".encode()),
        plan.world_size,
        _STRATEGY_CODE[prefill],
        _STRATEGY_CODE[decode],
    ]


class ShardExecutor:
    """This rank's weights and KV caches, and the step that runs them in lock-step with peers."""

    def __init__(
        self,
        *,
        plan: ParallelPlan,
        rank: int,
        weights: WeightSource,
        device: torch.device | str = "cpu",
        comm: Communicator | None = None,
    ) -> None:
        self.plan, self.rank, self.device = plan, rank, torch.device(device)
        # Every exchange goes through comm (collectives.connect picks shared memory or gloo); the
        # default is the process group as it is, for callers that formed one themselves.
        self.comm = comm or GlooCommunicator(rank, plan.world_size)
        self.shape = s = plan.shape
        self.world_size = plan.world_size
        self.head = HeadWeights.load(weights, s) if rank == 0 else None
        self.stage = plan.stage(rank)
        self.tslice = plan.tensor_slice(rank)
        self.pp_layers: dict[int, PackedLayer] = {}
        self.tp_layers: dict[int, PackedLayer] = {}
        pipeline = plan.uses(Strategy.PIPELINE) or self.world_size == 1
        tensor = plan.uses(Strategy.TENSOR) and self.world_size > 1
        t = self.tslice
        for n in range(s.num_hidden_layers):
            full = LayerWeights.load(weights, n, shape=s) if pipeline and n in self.stage.layers else None
            if full is not None:
                self.pp_layers[n] = PackedLayer.pack(full)
            if tensor:
                if full is not None:  # this stage's own layers: slice what is already loaded
                    part = full.tensor_slice(q_heads=t.q_heads, kv_heads=t.kv_heads, mlp=t.mlp, shape=s)
                else:
                    part = LayerWeights.load(weights, n, shape=s, q_heads=t.q_heads, kv_heads=t.kv_heads, mlp=t.mlp)
                self.tp_layers[n] = PackedLayer.pack(part, owns_residual=rank == 0)
        if self.world_size == 1:
            self.tp_layers = self.pp_layers  # one rank: the tensor "slice" is the whole layer
        self._weights_on_huge_pages()
        self.rope = RopeTable(s, self.device)
        # Vocab-parallel LM head for tensor-parallel phases: each rank turns the (replicated)
        # final hidden state into its rows of logits, rank 0 gathers; rank 0 alone would be the
        # slowest rank of every step otherwise.
        self.lm_head_slice: torch.Tensor | None = None
        self.lm_head_packed: torch.Tensor | None = None
        self.final_norm: torch.Tensor | None = None
        if plan.uses(Strategy.TENSOR) and self.world_size > 1:
            v0, v1 = self.tslice.vocab
            if rank == 0:
                self.final_norm, self.lm_head_slice = self.head.final_norm, self.head.lm_head[v0:v1]
            else:
                name = "model.embed_tokens.weight" if s.tie_word_embeddings else "lm_head.weight"
                self.final_norm = weights.get("model.norm.weight")
                (self.lm_head_slice,) = on_huge_pages([weights.get(name, dim=0, start=v0, stop=v1)])
            self.lm_head_packed = prepack(self.lm_head_slice)
        self.kv: dict[int, SeqKV] = {}
        # KV caches by layout ("pipeline": this stage's layers, all KV heads; "tensor": every layer,
        # this rank's KV heads), in slabs so a decode step attends per slab (llama.KVAllocator).
        self._kv_alloc: dict[str, KVAllocator] = {}
        # Cached prompt blocks by block id (prefix_cache.PrefixCache on the leader decides which),
        # each [layers held, 2 (K, V), KV heads held, BLOCK_TOKENS, head_dim] in the prefill layout.
        self.blocks: dict[int, torch.Tensor] = {}
        # The steady state is "decode the same batch again": then only the header travels.
        self._last_decode: list[int] = []

    def _weights_on_huge_pages(self) -> None:
        """The matrices a batch-1 step streams, copied onto huge pages (runtime/engines/hugepages.py):
        one mapping per set of layers, so dropping a strategy's layers frees its mapping."""
        for layers in {id(d): d for d in (self.pp_layers, self.tp_layers) if d}.values():
            packed = list(layers.values())
            moved = iter(on_huge_pages([w for p in packed for w in (p.qkv, p.o, p.gate_up, p.down)]))
            for p in packed:
                p.qkv, p.o, p.gate_up, p.down = next(moved), next(moved), next(moved), next(moved)
        if self.head is not None:
            tied = self.head.lm_head is self.head.embed
            (self.head.lm_head,) = on_huge_pages([self.head.lm_head])
            if tied:  # the embedding is the same matrix: keep one copy
                self.head.embed = self.head.lm_head

    # --- collectives (every failure becomes EngineBroken) -----------------------------------
    def _all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        return self.comm.all_reduce(t)

    def _broadcast(self, t: torch.Tensor, src: int) -> torch.Tensor:
        return self.comm.broadcast(t, src)

    # --- leader / follower entry points -------------------------------------------------------
    def leader_step(self, cmd: StepCommand) -> StepResult:
        """Rank 0: send the command to the followers, then run it."""
        try:
            if self.world_size > 1:
                changed = cmd.free or cmd.prefill or cmd.fork or cmd.drop or cmd.drafts or cmd.trim
                repeat = not changed and cmd.decode == self._last_decode
                if repeat and cmd.decode:
                    self._broadcast(self._signal(OP_REPEAT_DECODE), 0)
                else:
                    header, payload = cmd.encode()
                    self._broadcast(header, 0)
                    if payload.numel():
                        self._broadcast(payload, 0)
            return self.run(cmd)
        except EngineBroken:
            raise
        except (RuntimeError, dist.DistError) as e:
            raise EngineBroken(f"a collective failed during a step (peer died or timed out): {e}") from e

    @staticmethod
    def _signal(op: int) -> torch.Tensor:
        return torch.tensor([op] + [0] * (HEADER_LEN - 1), dtype=torch.int64)

    def leader_set_strategies(self, prefill: str, decode: str, *, final: bool = False) -> None:
        """Rank 0: every rank switches to these strategies (the weights of both must be loaded);
        final drops the weights the chosen pair does not use. Sequences must all be freed first:
        their KV layout belongs to the old strategies."""
        try:
            if self.world_size > 1:
                header = self._signal(OP_STRATEGIES)
                header[1:4] = torch.tensor([_STRATEGY_CODE[prefill], _STRATEGY_CODE[decode], int(final)])
                self._broadcast(header, 0)
        except (RuntimeError, dist.DistError) as e:
            raise EngineBroken(f"a follower is gone (switching strategies): {e}") from e
        self.set_strategies(prefill, decode, final=final)

    def set_strategies(self, prefill: str, decode: str, *, final: bool = False) -> None:
        if self.kv:
            raise RuntimeError("strategies change only between sequences (bug: KV caches are still held)")
        plan = dataclasses.replace(self.plan, prefill=prefill, decode=decode)
        for strategy in (prefill, decode):
            if strategy == Strategy.PIPELINE and self.world_size > 1 and not self.pp_layers:
                raise RuntimeError("pipeline weights were not loaded (bug)")
            if strategy == Strategy.TENSOR and self.world_size > 1 and not self.tp_layers:
                raise RuntimeError("tensor-parallel weights were not loaded (bug)")
        self.plan = plan
        self._kv_alloc = {}  # no cache is held: the slabs of the old layouts go with their memory
        self.blocks = {}  # cached blocks are in the old prefill layout
        if final and self.world_size > 1:
            if not plan.uses(Strategy.PIPELINE):
                self.pp_layers = {}
            if not plan.uses(Strategy.TENSOR):
                self.tp_layers, self.lm_head_slice, self.final_norm = {}, None, None
                self.lm_head_packed = None

    def leader_signal(self, op: int) -> None:
        """Rank 0: heartbeat (proves the followers are alive) or shutdown."""
        if self.world_size == 1:
            return
        try:
            self._broadcast(self._signal(op), 0)
        except (RuntimeError, dist.DistError) as e:
            raise EngineBroken(f"a follower is gone (heartbeat failed): {e}") from e

    def follower_loop(self, heard: Callable[[], None] | None = None) -> None:
        """Rank > 0: run the leader's commands until it shuts down. Raises EngineBroken on failure.
        `heard` is called as each command (a step or a keep-alive) arrives: the leader's engine lives."""
        try:
            while True:
                header = self._broadcast(torch.empty(HEADER_LEN, dtype=torch.int64), 0)
                if heard is not None:
                    heard()
                op = int(header[0])
                if op == OP_SHUTDOWN:
                    return
                if op == OP_HEARTBEAT:
                    continue
                if op == OP_REPEAT_DECODE:
                    self.run(StepCommand(decode=list(self._last_decode)))
                    continue
                if op == OP_STRATEGIES:
                    codes = [int(v) for v in header[1:4]]
                    self.set_strategies(_STRATEGY_NAME[codes[0]], _STRATEGY_NAME[codes[1]], final=bool(codes[2]))
                    continue
                if op != OP_STEP:
                    raise EngineBroken(f"unknown op {op} from the leader (version skew?)")
                n = StepCommand.payload_len(header)
                payload = torch.empty(n, dtype=torch.int64)
                if n:
                    self._broadcast(payload, 0)
                self.run(StepCommand.decode_payload(header, payload))
        except EngineBroken:
            raise
        except (RuntimeError, dist.DistError) as e:
            raise EngineBroken(f"rank {self.rank}: lost the leader or a peer: {e}") from e

    # --- the step itself (identical collective sequence on every rank) ------------------------
    def run(self, cmd: StepCommand) -> StepResult:
        self._last_decode = list(cmd.decode)
        for seq_id, n in cmd.trim:
            self.kv[seq_id].length -= n
        for seq_id in cmd.free:
            self._drop_kv(seq_id)
        for block_id in cmd.drop:
            self.blocks.pop(block_id, None)
        result = StepResult()
        one_pass = bool(cmd.prefill and cmd.decode) and self._fuses()
        if cmd.prefill:
            # One rank has no stages to overlap: its prompts go through the layers as one batch (the
            # "tensor" path over the whole layer), 16 chat prompts in one pass instead of 16 passes
            # of a few dozen rows each (about half the time, measured: docs/benchmarks.md).
            if one_pass:  # with the decode tokens, which then need no pass of their own
                result.prefill_logits, result.decode_logits = self._prefill_and_decode(cmd)
            elif self.plan.prefill == Strategy.PIPELINE and self.world_size > 1:
                result.prefill_logits = self._prefill_pipeline(cmd)
            else:
                result.prefill_logits = self._prefill_tensor(cmd)
            self._store_blocks(cmd.store)
            ongoing = set(cmd.ongoing)
            done = [p[0] for p in cmd.prefill if p[0] not in ongoing]
            if done and self.plan.needs_reshard():
                self._reshard(done)
        for src, dst in cmd.fork:
            kv = self.kv[src]
            self.kv[dst] = kv.copy_into(self._new_kv(self.plan.decode, kv.capacity))
        if cmd.decode and not one_pass:
            if self.plan.decode == Strategy.PIPELINE:
                result.decode_logits = self._decode_pipeline(cmd)
            else:
                result.decode_logits = self._decode_tensor(cmd)
        return result

    def _embed(self, token_ids: Sequence[int]) -> torch.Tensor:
        return self.head.embed[torch.tensor(list(token_ids), device=self.device)]

    def _run_layers(
        self,
        layers: dict[int, PackedLayer],
        order: Sequence[int],
        x: torch.Tensor,
        segments: list[Segment],
        lead: int = 0,
    ) -> torch.Tensor:
        """x through the layers in `order`; `lead`: how many of the segments, first, are prompt chunks
        (the rest, one token each, attend per slab)."""
        cos, sin = self.rope(positions_of(segments, self.device), max(g.start + g.n for g in segments))
        decode = plan_decode(segments, self.device, lead)
        for n in order:
            x = decoder_layer(self.shape, n, layers[n], x, segments, cos, sin, self._all_reduce, decode)
        return x

    def _new_kv(self, layout: str, capacity: int) -> SeqKV:
        if layout == Strategy.TENSOR and self.world_size == 1:
            layout = Strategy.PIPELINE  # one rank: both layouts are the whole model
        alloc = self._kv_alloc.get(layout)
        if alloc is None:
            s = self.shape
            if layout == Strategy.PIPELINE:
                alloc = KVAllocator(self.stage.layers, s.num_key_value_heads, s.head_dim, self.device)
            else:
                kv0, kv1 = self.tslice.kv_heads
                alloc = KVAllocator(range(s.num_hidden_layers), kv1 - kv0, s.head_dim, self.device)
            self._kv_alloc[layout] = alloc
        return alloc.new(capacity)

    @staticmethod
    def _loads(cmd: StepCommand) -> dict[int, list[int]]:
        """The cached block ids each prefilled sequence starts from, in position order."""
        out: dict[int, list[int]] = {}
        for seq_id, block_no, block_id in sorted(cmd.load):
            out.setdefault(seq_id, []).append(block_id)
            assert len(out[seq_id]) == block_no + 1, "cached blocks load from position 0 on, in order (bug)"
        return out

    def _start_prefill(self, layout: str, seq_id: int, capacity: int, block_ids: list[int], start: int) -> SeqKV:
        """A new sequence's cache in the prefill layout, its leading positions copied from cached
        blocks: one copy of K and one of V per layer for the whole run of blocks. A later chunk of
        a prompt continues the cache its earlier chunks left (still in the prefill layout)."""
        kv = self.kv.get(seq_id)
        if kv is not None:
            assert not block_ids and kv.length == start, "a prompt's next chunk starts where the last ended (bug)"
            return kv
        kv = self._new_kv(layout, capacity)
        self.kv[seq_id] = kv
        if block_ids:
            run = torch.cat([self.blocks[b] for b in block_ids], dim=3)
            c = run.shape[3]
            for j, (K, V) in enumerate(kv.layers.values()):
                K[:, :c] = run[j, 0]
                V[:, :c] = run[j, 1]
            kv.length = c
        return kv

    def _store_blocks(self, store: list[tuple[int, int, int]]) -> None:
        """Keep copies of prompt blocks just prefilled (before any re-shard: the prefill layout)."""
        for seq_id, block_no, block_id in store:
            a, b = block_no * BLOCK_TOKENS, (block_no + 1) * BLOCK_TOKENS
            layers = self.kv[seq_id].layers.values()
            self.blocks[block_id] = torch.stack([torch.stack([K[:, a:b], V[:, a:b]]) for K, V in layers])

    def cached_blocks(self) -> int:
        return len(self.blocks)

    def _drop_kv(self, seq_id: int) -> None:
        kv = self.kv.pop(seq_id, None)
        if kv is not None:
            kv.release()

    def kv_slots_held(self) -> int:
        return sum(a.held() for a in self._kv_alloc.values())

    def _prefill_pipeline(self, cmd: StepCommand) -> torch.Tensor | None:
        """Prompts, and chunks of long prompts, flow through the stages as micro-batches with
        asynchronous sends: stage k works on micro-batch i while stage k+1 works on i-1. Two stages
        or more (run() sends one rank's prompts through _prefill_tensor, in one pass)."""
        W, r, H = self.world_size, self.rank, self.shape.hidden_size
        last_rank = W - 1
        pending, lasts = [], []
        loads = self._loads(cmd)
        for i, (seq_id, n, capacity) in enumerate(cmd.prefill):
            c = cmd.cached_tokens(i)
            kv = self._start_prefill(Strategy.PIPELINE, seq_id, capacity, loads.get(seq_id, []), c)
            for a, b in pipeline_prefill_chunks(n - c, W):
                a, b = a + c, b + c
                seg = [Segment(kv=kv, start=a, n=b - a)]
                if r == 0:
                    x = self._embed(cmd.prefill_tokens[i][a:b])
                else:
                    x = self.comm.recv(torch.empty(b - a, H, device=self.device), r - 1)
                x = self._run_layers(self.pp_layers, self.stage.layers, x, seg)
                kv.length = b
                if r == last_rank:
                    if b == n:
                        # Only the last position returns to rank 0 (LM head + sampling live there).
                        pending.append(self.comm.isend(x[-1:].contiguous(), 0))
                else:
                    pending.append(self.comm.isend(x.contiguous(), r + 1))
        for work in pending:
            work.wait()
        if r != 0:
            return None
        for _ in cmd.prefill:
            lasts.append(self.comm.recv(torch.empty(1, H, device=self.device), last_rank))
        return self._last_logits(lasts)

    def _prefill_segments(self, cmd: StepCommand) -> list[Segment]:
        """The step's prompt chunks as segments of caches in the tensor layout (one rank: the whole model)."""
        segments = []
        loads = self._loads(cmd)
        for i, (seq_id, n, capacity) in enumerate(cmd.prefill):
            c = cmd.cached_tokens(i)
            kv = self._start_prefill(Strategy.TENSOR, seq_id, capacity, loads.get(seq_id, []), c)
            segments.append(Segment(kv=kv, start=c, n=n - c))
        return segments

    def _tensor_pass(self, cmd: StepCommand, segments: list[Segment], decode: list[Segment]) -> torch.Tensor:
        """One pass over every layer (whole, or this rank's tensor slice) of the prompt chunks, then the
        decode tokens: rank 0 embeds them and broadcasts the rows; every rank returns the last hidden states."""
        total = sum(g.n for g in segments + decode)
        if self.rank == 0:
            parts = [self._embed(t[g.start : g.start + g.n]) for t, g in zip(cmd.prefill_tokens, segments)]
            if decode:
                parts.append(self._embed(self._decode_rows(cmd)))
            x = torch.cat(parts) if len(parts) > 1 else parts[0]
        else:
            x = torch.empty(total, self.shape.hidden_size, device=self.device)
        if self.world_size > 1:
            self._broadcast(x, 0)
        # Drafted decode entries come first and attend per segment, as prompt chunks do.
        lead = len(segments) + len(cmd.drafts)
        x = self._run_layers(self.tp_layers, range(self.shape.num_hidden_layers), x, segments + decode, lead=lead)
        for seg in segments + decode:
            seg.kv.length = seg.start + seg.n
        return x

    def _prompt_logits(self, x: torch.Tensor, segments: list[Segment]) -> torch.Tensor | None:
        """Each prompt's logits at its last position (rows of x in segment order; rank 0 gets them)."""
        ends = [sum(g.n for g in segments[: i + 1]) for i in range(len(segments))]
        if self.world_size == 1:
            return self._last_logits([x[e - 1 : e] for e in ends])
        per_seq = [self._tp_logits(x[e - 1 : e]) for e in ends]
        return torch.cat(per_seq) if self.rank == 0 else None

    def _prefill_tensor(self, cmd: StepCommand) -> torch.Tensor | None:
        segments = self._prefill_segments(cmd)
        return self._prompt_logits(self._tensor_pass(cmd, segments, []), segments)

    def _fuses(self) -> bool:
        """Whether a step's prompt chunks and decode tokens go through the layers in one pass: where
        both phases hold the same layout and run every layer on every rank (one rank, or tensor for
        both), so no re-shard separates them. That is vLLM's chunked prefill (docs/engine.md): the
        decode tokens ride along with the chunk instead of costing a second pass over the weights."""
        return self.world_size == 1 or (self.plan.prefill == Strategy.TENSOR and self.plan.decode == Strategy.TENSOR)

    def _prefill_and_decode(self, cmd: StepCommand) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        segments = self._prefill_segments(cmd)
        x = self._tensor_pass(cmd, segments, self._decode_segments(cmd))
        rows = sum(g.n for g in segments)
        return self._prompt_logits(x[:rows], segments), self._rows_logits(x[rows:])

    def _last_logits(self, lasts: list[torch.Tensor]) -> torch.Tensor:
        # One LM-head product per sequence: a prompt's first-token logits do not depend on which
        # other prompts were prefilled in the same step (a batched GEMM may sum in another order).
        return torch.stack([self.head.logits(self.shape, x)[0] for x in lasts])

    def _decode_segments(self, cmd: StepCommand) -> list[Segment]:
        """One segment per decode entry: its last token, and its draft's tokens when it has one."""
        segs, drafted = [], dict(cmd.drafts)
        for seq_id in cmd.decode:
            kv, n = self.kv[seq_id], 1 + drafted.get(seq_id, 0)
            if kv.length + n > kv.capacity:
                raise RuntimeError(f"sequence {seq_id} outgrew its KV capacity {kv.capacity} (bug)")
            segs.append(Segment(kv=kv, start=kv.length, n=n))
        return segs

    @staticmethod
    def _decode_rows(cmd: StepCommand) -> list[int]:
        """Rank 0: the token ids of the decode entries' rows, each entry's draft after its last token."""
        if not cmd.draft_tokens:
            return list(cmd.decode_tokens)
        return [t for last, draft in zip(cmd.decode_tokens, cmd.draft_tokens, strict=True) for t in (last, *draft)]

    def _decode_pipeline(self, cmd: StepCommand) -> torch.Tensor | None:
        """The batch goes through the stages in up to world_size micro-batches, so every stage
        works on one while the next stage works on the previous one."""
        W, r, H = self.world_size, self.rank, self.shape.hidden_size
        segs = self._decode_segments(cmd)
        B = len(segs)
        bounds = [(a, b) for a, b in split_even(B, min(W, B))]
        first = [0]  # each segment's first row: a drafted entry has 1 + k rows
        for seg in segs:
            first.append(first[-1] + seg.n)
        rows = self._decode_rows(cmd) if r == 0 else []
        pending, outs = [], []
        for a, b in bounds:
            mb = segs[a:b]
            if r == 0:
                x = self._embed(rows[first[a] : first[b]])
            else:
                x = self.comm.recv(torch.empty(first[b] - first[a], H, device=self.device), r - 1)
            x = self._run_layers(self.pp_layers, self.stage.layers, x, mb, lead=sum(g.n > 1 for g in mb))
            for seg in mb:
                seg.kv.length += seg.n
            if W == 1:
                outs.append(self.head.logits(self.shape, x))
            else:
                pending.append(self.comm.isend(x.contiguous(), (r + 1) % W))
        if r == 0 and W > 1:
            for a, b in bounds:
                x = self.comm.recv(torch.empty(first[b] - first[a], H, device=self.device), W - 1)
                outs.append(self.head.logits(self.shape, x))
        for work in pending:
            work.wait()
        return torch.cat(outs) if r == 0 else None

    def _decode_tensor(self, cmd: StepCommand) -> torch.Tensor | None:
        return self._rows_logits(self._tensor_pass(cmd, [], self._decode_segments(cmd)))

    def _rows_logits(self, x: torch.Tensor) -> torch.Tensor | None:
        """The logits of every row of x, the final hidden states of a tensor pass (rank 0 gets them)."""
        if self.world_size == 1:
            return self.head.logits(self.shape, x)
        return self._tp_logits(x)

    def _tp_logits(self, x: torch.Tensor) -> torch.Tensor | None:
        """Every rank: its vocab rows of the logits; rank 0 gathers them into [rows, vocab]."""
        local = linear(rms_norm(x, self.final_norm, self.shape.rms_norm_eps), self.lm_head_slice, self.lm_head_packed)
        widths = [t.vocab[1] - t.vocab[0] for t in self.plan.tensor_slices]
        if local.shape[1] < max(widths):  # gather needs equal sizes: pad, trim on rank 0
            local = F.pad(local, (0, max(widths) - local.shape[1]))
        parts = self.comm.gather(local.contiguous(), 0)
        if parts is None:
            return None
        return torch.cat([p[:, :w] for p, w in zip(parts, widths)], dim=-1)

    # --- KV re-shard between layer-split (pipeline) and head-split (tensor) -------------------
    def _reshard(self, seq_ids: list[int]) -> None:
        """Each rank broadcasts the KV it holds for the new sequences; every rank keeps its part.

        pipeline -> tensor: source rank src holds layers stage(src), all KV heads; each rank keeps
        its KV-head slice of those layers. tensor -> pipeline: src holds every layer, its KV-head
        slice; each rank keeps its own layers. With replicated attention every rank already holds
        all heads, so tensor -> pipeline needs no traffic.
        """
        s, plan, W = self.shape, self.plan, self.world_size
        d = s.head_dim
        to_tensor = plan.prefill == Strategy.PIPELINE
        old = {sid: self.kv[sid] for sid in seq_ids}
        new = {
            sid: self._new_kv(Strategy.TENSOR if to_tensor else Strategy.PIPELINE, kv.capacity)
            for sid, kv in old.items()
        }
        if not to_tensor and plan.attention_replicated:
            for sid, kv in old.items():
                for n in self.stage.layers:
                    K, V = kv.layers[n]
                    Kn, Vn = new[sid].layers[n]
                    Kn[:, : kv.length] = K[:, : kv.length]
                    Vn[:, : kv.length] = V[:, : kv.length]
        else:
            for src in range(W):
                if to_tensor:
                    src_layers = list(plan.stage(src).layers)
                    src_heads = (0, s.num_key_value_heads)
                else:
                    src_layers = list(range(s.num_hidden_layers))
                    src_heads = plan.tensor_slice(src).kv_heads
                nh = src_heads[1] - src_heads[0]
                sizes = [len(src_layers) * 2 * nh * old[sid].length * d for sid in seq_ids]
                if self.rank == src:
                    parts = []
                    for sid in seq_ids:
                        kv = old[sid]
                        for n in src_layers:
                            K, V = kv.layers[n]
                            parts += [K[:, : kv.length].reshape(-1), V[:, : kv.length].reshape(-1)]
                    flat = torch.cat(parts)
                else:
                    flat = torch.empty(sum(sizes), device=self.device)
                self._broadcast(flat, src)
                offset = 0
                for sid, size in zip(seq_ids, sizes):
                    L = old[sid].length
                    block = flat[offset : offset + size].view(len(src_layers), 2, nh, L, d)
                    offset += size
                    for j, n in enumerate(src_layers):
                        if n not in new[sid].layers:
                            continue
                        K, V = new[sid].layers[n]
                        if to_tensor:
                            mine = self.tslice.kv_heads
                            K[:, :L] = block[j, 0, mine[0] : mine[1]]
                            V[:, :L] = block[j, 1, mine[0] : mine[1]]
                        else:
                            K[src_heads[0] : src_heads[1], :L] = block[j, 0]
                            V[src_heads[0] : src_heads[1], :L] = block[j, 1]
        for sid in seq_ids:
            new[sid].length = old[sid].length
            self.kv[sid] = new[sid]
            old[sid].release()
