"""A decode step attends once per KV slab for all of the slab's sequences (padded to the longest and
masked), and every sequence still gets the logits it gets decoding alone over a cache of its own:
the per-sequence path, which tests/engine/test_models.py checks against transformers."""

from __future__ import annotations

import pytest
import torch

from runtime.engines import executor as executor_module
from runtime.engines import llama
from runtime.engines.executor import ShardExecutor, StepCommand
from runtime.engines.layout import make_plan
from runtime.engines.llama import UnsplitLlama
from runtime.models.registry import resolve_model

# Different lengths, so the batched call pads and masks every row but the longest.
PROMPTS = [[1, 5, 9, 13, 2], [7, 7, 3], [4, 8, 15, 16, 23, 42, 11, 2, 9], [3, 1, 4, 1, 5, 9, 2], [6, 6]]
NEW = [[3, 4, 5, 6], [9, 8, 7, 6], [1, 2, 3, 4], [5, 5, 5, 5], [2, 7, 1, 8]]


@pytest.fixture(scope="module")
def tiny():
    return resolve_model("tiny")


def _one_rank(src) -> ShardExecutor:
    return ShardExecutor(plan=make_plan(src.shape, 1, prefill="tensor", decode="tensor"), rank=0, weights=src.weights)


def _alone(src, prompt: list[int], tokens: list[int]) -> list[torch.Tensor]:
    """Logits of each decode step of one sequence run by itself, with a cache of its own."""
    model = UnsplitLlama(src.shape, src.weights)
    kv = model.new_kv(len(prompt) + len(tokens))
    model.forward(prompt, kv)
    return [model.forward([t], kv) for t in tokens]


def _capture_plans(monkeypatch) -> list:
    plans: list = []
    real = executor_module.decoder_layer

    def spy(shape, layer, lw, x, segments, cos, sin, all_reduce=None, decode=None):
        if layer == 0:
            plans.append(decode)
        return real(shape, layer, lw, x, segments, cos, sin, all_reduce, decode)

    monkeypatch.setattr(executor_module, "decoder_layer", spy)
    return plans


def test_a_decode_step_attends_per_slab_and_each_sequence_gets_its_logits_alone(tiny, monkeypatch):
    # Slabs of at most 256 positions: capacity 200 rounds to 256 and gets a cache of its own.
    monkeypatch.setattr(llama, "SLAB_MAX_TOKENS", 256)
    ex = _one_rank(tiny)
    caps = [len(p) + 4 for p in PROMPTS]
    caps[3] = 200  # the one with a cache of its own
    ex.run(StepCommand(prefill=list(zip(range(5), map(len, PROMPTS), caps)), prefill_tokens=PROMPTS))
    assert [ex.kv[i].slot for i in (0, 1, 2, 4)] == [0, 1, 2, 3] and ex.kv[3].slab is None
    # Sequence 1 leaves: slot 1 becomes a gap between the rows that stay.
    ex.run(StepCommand(free=[1]))
    plans = _capture_plans(monkeypatch)
    order = [4, 3, 0, 2]  # not slot order either
    got = {i: [] for i in order}
    for step in range(4):
        out = ex.run(StepCommand(decode=order, decode_tokens=[NEW[i][step] for i in order])).decode_logits
        for row, i in enumerate(order):
            got[i].append(out[row])

    plan = plans[0]
    assert plan is not None and len(plan.groups) == 1 and plan.alone == [1]  # row 1 is sequence 3
    g = plan.groups[0]
    assert (g.lo, g.hi) == (0, 4) and g.slots.tolist() == [0, 2, 3] and g.at is not None and g.mask is not None
    for i in order:
        for step, (a, b) in enumerate(zip(_alone(tiny, PROMPTS[i], NEW[i]), got[i])):
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5, msg=f"sequence {i}, step {step}")


def test_rows_that_fill_their_slots_in_order_take_the_direct_path(tiny, monkeypatch):
    ex = _one_rank(tiny)
    ex.run(
        StepCommand(prefill=[(i, len(p), len(p) + 4) for i, p in enumerate(PROMPTS[:3])], prefill_tokens=PROMPTS[:3])
    )
    plans = _capture_plans(monkeypatch)
    out = ex.run(StepCommand(decode=[0, 1, 2], decode_tokens=[NEW[i][0] for i in range(3)])).decode_logits
    g = plans[0].groups[0]
    assert g.rows is None and g.at is None and plans[0].alone == []
    for i in range(3):
        torch.testing.assert_close(out[i], _alone(tiny, PROMPTS[i], NEW[i][:1])[0], rtol=1e-5, atol=1e-5)


def test_a_prompt_chunk_and_the_decode_tokens_of_a_step_share_one_pass(tiny, monkeypatch):
    """vLLM's chunked prefill: a step's prompt chunk and its decode tokens are one batch through the
    layers (docs/engine.md). Each still gets the logits it gets alone: the chunk those of the whole
    prompt run by itself, each decoding row those of its own sequence."""
    monkeypatch.setattr(llama, "SLAB_MAX_TOKENS", 256)
    ex = _one_rank(tiny)
    caps = [len(p) + 4 for p in PROMPTS[:4]]
    caps[3] = 200  # a cache of its own: a row attended alone
    ex.run(StepCommand(prefill=list(zip(range(4), map(len, PROMPTS), caps)), prefill_tokens=PROMPTS[:4]))
    ex.run(StepCommand(free=[1]))  # a gap in the slab
    long = [(7 * i) % 250 + 1 for i in range(30)]
    ex.run(StepCommand(prefill=[(9, 12, 40)], prefill_tokens=[long[:12]], ongoing=[9]))  # its first chunk alone

    plans = _capture_plans(monkeypatch)
    passes: list[int] = []
    real = executor_module.decoder_layer

    def counting(shape, layer, lw, x, segments, *rest, **kw):
        passes.append(x.shape[0])
        return real(shape, layer, lw, x, segments, *rest, **kw)

    monkeypatch.setattr(executor_module, "decoder_layer", counting)
    order = [3, 0, 2]
    out = ex.run(
        StepCommand(
            prefill=[(9, 30, 40)],
            prefill_tokens=[long],
            cached=[12],  # the chunk continues the sequence's own KV from position 12
            decode=order,
            decode_tokens=[NEW[i][0] for i in order],
        )
    )
    assert (
        passes == [18 + len(order)] * ex.shape.num_hidden_layers
    )  # one pass per layer: the chunk's 18 rows and 3 tokens
    plan = plans[0]
    assert plan is not None and (plan.lead, plan.lead_rows) == (1, 18) and plan.alone == [0]  # sequence 3
    assert plan.groups[0].rows.tolist() == [19, 20]  # sequences 0 and 2, after the chunk's rows
    model = UnsplitLlama(tiny.shape, tiny.weights)
    whole = model.forward(long, model.new_kv(40))
    torch.testing.assert_close(out.prefill_logits[0], whole, rtol=1e-5, atol=1e-5)
    for row, i in enumerate(order):
        alone = _alone(tiny, PROMPTS[i], NEW[i][:1])[0]
        torch.testing.assert_close(out.decode_logits[row], alone, rtol=1e-5, atol=1e-5)
    assert ex.kv[9].length == 30 and all(ex.kv[i].length == len(PROMPTS[i]) + 1 for i in order)
    # the prompt's first decode step attends over all 30 positions its two chunks left
    nxt = ex.run(StepCommand(decode=[9], decode_tokens=[5])).decode_logits[0]
    torch.testing.assert_close(nxt, _alone(tiny, long, [5])[0], rtol=1e-5, atol=1e-5)


def test_slots_come_back_and_forks_decode_like_their_source(tiny):
    ex = _one_rank(tiny)
    p = PROMPTS[2]
    ex.run(StepCommand(prefill=[(0, len(p), len(p) + 4)], prefill_tokens=[p], fork=[(0, 1), (0, 2)]))
    assert [ex.kv[i].slot for i in range(3)] == [0, 1, 2]
    assert ex.kv[1].length == ex.kv[0].length == len(p)
    out = ex.run(StepCommand(decode=[0, 1, 2], decode_tokens=[5, 5, 5])).decode_logits
    expected = _alone(tiny, p, [5])[0]
    for row in out:
        torch.testing.assert_close(row, expected, rtol=1e-5, atol=1e-5)
    ex.run(StepCommand(free=[1]))
    assert ex.kv_slots_held() == 2
    # The lowest free slot is taken first: the new sequence fills the gap.
    ex.run(StepCommand(prefill=[(3, 3, 7)], prefill_tokens=[PROMPTS[1]]))
    assert ex.kv[3].slot == 1
    ex.run(StepCommand(free=[0, 2, 3]))
    assert ex.kv_slots_held() == 0


def test_idle_memory_is_at_most_one_slab():
    alloc = llama.KVAllocator(range(2), n_kv=2, head_dim=4)
    small = [alloc.new(10) for _ in range(20)]  # 16 per slab of 64 positions: two slabs
    large = [alloc.new(300) for _ in range(3)]  # 512 positions, 8 per slab: one slab
    assert alloc.slab_count() == 3 and alloc.held() == 23
    for kv in small + large:
        kv.release()
    assert alloc.held() == 0 and alloc.slab_count() == 1  # the last slab to empty stays, zeroed once
    (spare,) = (s for slabs in alloc.slabs.values() for s in slabs)
    again = alloc.new(300)
    assert again.slab is spare  # the next burst of the same size reuses it


def _alone_greedy(ex: ShardExecutor, prompt: list[int], n: int) -> list[int]:
    r = ex.run(StepCommand(prefill=[(999, len(prompt), len(prompt) + n + 1)], prefill_tokens=[prompt]))
    tokens = [int(r.prefill_logits[0].argmax())]
    for _ in range(n - 1):
        r = ex.run(StepCommand(decode=[999], decode_tokens=[tokens[-1]]))
        tokens.append(int(r.decode_logits[0].argmax()))
    ex.run(StepCommand(free=[999]))
    return tokens


@pytest.mark.parametrize("seed", [0, 1])
def test_continuous_batching_gives_every_sequence_the_tokens_it_gets_alone(tiny, seed):
    """Sequences arrive, finish and are cancelled at random, so slots are reused, batches come in any
    slot order and slabs have gaps; greedy tokens must be those of each sequence run by itself."""
    import random

    rng = random.Random(seed)

    def executor() -> ShardExecutor:
        return ShardExecutor(
            plan=make_plan(tiny.shape, 1, prefill="tensor", decode="tensor"), rank=0, weights=tiny.weights
        )

    ex, alone = executor(), executor()
    running: dict[int, tuple[list[int], int, list[int]]] = {}
    finished, free, next_id = [], [], 0
    for _ in range(150):
        admit = []
        while len(running) + len(admit) < 16 and rng.random() < 0.3:
            prompt = [rng.randrange(1, 250) for _ in range(rng.randrange(1, 40))]
            admit.append((next_id, prompt, rng.randrange(1, 40)))
            next_id += 1
        decode = list(running)
        out = ex.run(
            StepCommand(
                free=free,
                prefill=[(s, len(p), len(p) + n + 1) for s, p, n in admit],
                prefill_tokens=[p for _, p, _ in admit],
                decode=decode,
                decode_tokens=[running[s][2][-1] for s in decode],
            )
        )
        free = []
        for i, (s, p, n) in enumerate(admit):
            running[s] = (p, n, [int(out.prefill_logits[i].argmax())])
        for i, s in enumerate(decode):
            running[s][2].append(int(out.decode_logits[i].argmax()))
        for s in list(running):
            p, n, tokens = running[s]
            if len(tokens) >= n or rng.random() < 0.02:  # done, or cancelled
                finished.append((p, tokens))
                free.append(s)
                del running[s]
    assert len(finished) > 50
    for p, tokens in finished:
        assert _alone_greedy(alone, p, len(tokens)) == tokens
