"""Prefix caching in the reference engine: prompt blocks keyed by their whole prefix, copied into
later prompts that start with them, shared by reference count while a step uses them, evicted
least recently used within the KV budget; greedy outputs equal those without the cache."""

from __future__ import annotations

import asyncio

import pytest
import torch

from runtime.engines.base import GenerationRequest, SamplingParams
from runtime.engines.executor import ShardExecutor, StepCommand
from runtime.engines.layout import make_plan
from runtime.engines.prefix_cache import BLOCK_TOKENS, Plan, PrefixCache, block_hashes
from runtime.engines.reference import ReferenceEngine
from runtime.membership import Membership
from runtime.models.registry import resolve_model

SOLO = Membership(unit_id="u", revision="1", rank=0, world_size=1, dist_host="127.0.0.1", dist_port=1)
B = BLOCK_TOKENS
# A "system prompt" of 3 blocks and 5 tokens, and turns that follow it (byte-level tiny tokenizer ids).
SYSTEM = [(7 * i + 3) % 250 + 1 for i in range(3 * B + 5)]
TURN_A = [40, 41, 42, 43, 44, 45, 46]
TURN_B = [90, 91, 92]


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=120))


# --- the index ----------------------------------------------------------------------------------


def test_a_block_key_names_its_whole_prefix_and_a_partial_block_has_none():
    tail = list(range(100, 100 + B))
    a = block_hashes([1] * B + tail + [5, 6])
    b = block_hashes([2] * B + tail + [5, 6])
    assert len(a) == len(b) == 2  # two full blocks; the last 2 tokens make no block
    assert a[1] != b[1]  # same tokens in block 1, different prefix before it
    assert block_hashes([1] * B + tail) == a


def _stored(cache: PrefixCache, tokens: list[int]) -> list[int]:
    """Store every full block of tokens as an admitted prompt would, then finish its step."""
    keys = block_hashes(tokens)
    hit = cache.match(keys, len(tokens))
    plan = Plan(hit=hit, store=cache.allocate(keys, len(hit), room_tokens=10**9))
    cache.done(plan)
    return hit + [b for _, b in plan.store]


def test_a_match_leaves_the_last_prompt_token_to_compute():
    cache = PrefixCache()
    prompt = list(range(2 * B))  # exactly two blocks
    ids = _stored(cache, prompt)
    assert len(ids) == 2
    hit = cache.match(block_hashes(prompt), len(prompt))
    assert hit == ids[:1]  # the second block would leave nothing to compute: its last token gives the logits
    assert cache.match(block_hashes(prompt + [7]), 2 * B + 1) == ids


def test_a_block_stored_in_a_step_is_found_only_after_that_step_ran():
    cache = PrefixCache()
    prompt = list(range(B + 3))
    keys = block_hashes(prompt)
    plan = Plan(hit=[], store=cache.allocate(keys, 0, room_tokens=10**9))
    assert cache.match(keys, len(prompt)) == []  # same step: its KV is not on the ranks yet
    assert cache.allocate(keys, 0, room_tokens=10**9) == []  # and it is not stored twice
    cache.done(plan)
    assert cache.match(keys, len(prompt)) == [plan.store[0][1]]


def test_eviction_takes_the_least_recently_used_block_and_a_prefix_tail_before_its_head():
    cache = PrefixCache()
    old = _stored(cache, list(range(3 * B)))  # blocks h0 h1 h2, released tail first
    new = _stored(cache, list(range(500, 500 + B)))
    assert cache.evict(B) == B and cache.take_dropped() == [old[2]]
    assert cache.evict(B) == B and cache.take_dropped() == [old[1]]
    cache.evict(B)
    assert cache.take_dropped() == [old[0]]  # the other prompt, used later, is still held
    assert cache.block_ids() == new


def test_a_pinned_block_is_never_evicted_and_every_release_returns_its_pin():
    cache = PrefixCache()
    ids = _stored(cache, list(range(2 * B)))
    keys = block_hashes(list(range(2 * B + 1)))
    first, second = cache.match(keys, 2 * B + 1), cache.match(keys, 2 * B + 1)  # two readers in one step
    assert [cache.refs(b) for b in ids] == [2, 2]
    assert cache.evict(10 * B) == 0 and cache.tokens == 2 * B
    cache.release(first)
    assert cache.evict(10 * B) == 0
    cache.release(second)
    assert [cache.refs(b) for b in ids] == [0, 0]
    assert cache.evict(10 * B) == 2 * B and cache.tokens == 0


# --- one rank's executor: KV copied in from blocks equals KV computed ----------------------------


@pytest.fixture(scope="module")
def tiny():
    return resolve_model("tiny")


def _one_rank(src) -> ShardExecutor:
    return ShardExecutor(plan=make_plan(src.shape, 1, prefill="tensor", decode="tensor"), rank=0, weights=src.weights)


def test_a_prefill_started_from_cached_blocks_gives_the_logits_of_a_full_prefill(tiny):
    first, second = SYSTEM + TURN_A, SYSTEM + TURN_B
    cap = len(second) + 4
    plain = _one_rank(tiny)
    want = plain.run(StepCommand(prefill=[(1, len(second), cap)], prefill_tokens=[second])).prefill_logits
    want_next = plain.run(StepCommand(decode=[1], decode_tokens=[5])).decode_logits

    ex = _one_rank(tiny)
    ex.run(
        StepCommand(prefill=[(1, len(first), cap)], prefill_tokens=[first], store=[(1, i, 10 + i) for i in range(3)])
    )
    assert sorted(ex.blocks) == [10, 11, 12]
    ex.run(StepCommand(free=[1]))  # the blocks outlive the sequence they came from
    got = ex.run(
        StepCommand(
            prefill=[(2, len(second), cap)],
            prefill_tokens=[second],
            cached=[3 * B],
            load=[(2, i, 10 + i) for i in range(3)],
        )
    ).prefill_logits
    got_next = ex.run(StepCommand(decode=[2], decode_tokens=[5])).decode_logits
    assert ex.kv[2].length == len(second) + 1
    # The cached K/V were computed in another prompt's prefill (a GEMM over other rows) and the
    # suffix attends with a mask instead of the causal kernel: float-close, not bit-equal.
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    torch.testing.assert_close(got_next, want_next, rtol=0, atol=1e-5)
    ex.run(StepCommand(drop=[10, 12]))
    assert sorted(ex.blocks) == [11]


def test_smollm2_from_cached_blocks_stays_within_the_engines_tolerance_and_keeps_its_greedy_tokens(smollm2_dir):
    """SmolLM2, one rank: a second chat turn started from the first turn's cached blocks gives the
    logits of a full prefill within the tolerance docs/engine.md states for SmolLM2 (2e-4), and
    the same greedy tokens over 8 decode steps."""
    src = resolve_model("smollm2")
    tok = src.make_tokenizer()
    system = [{"role": "system", "content": "You are a shopping assistant. Answer in one short sentence."}]
    first = tok.apply_chat_template(system + [{"role": "user", "content": "Which tent suits two people?"}])
    second = tok.apply_chat_template(
        system
        + [
            {"role": "user", "content": "Which tent suits two people?"},
            {"role": "assistant", "content": "A light two-person dome tent."},
            {"role": "user", "content": "And a sleeping bag for cold nights?"},
        ]
    )
    shared = len(block_hashes(first))
    assert shared >= 2 and block_hashes(second)[:shared] == block_hashes(first)
    cap = len(second) + 9

    def greedy(ex, seq, cmd):
        logits = [ex.run(cmd).prefill_logits[0]]
        for _ in range(8):
            token = int(logits[-1].argmax())
            logits.append(ex.run(StepCommand(decode=[seq], decode_tokens=[token])).decode_logits[0])
        return torch.stack(logits)

    ex = _one_rank(src)
    store = [(1, i, i) for i in range(shared)]
    ex.run(StepCommand(prefill=[(1, len(first), cap)], prefill_tokens=[first], store=store, decode=[]))
    load = [(2, i, i) for i in range(shared)]
    cmd = StepCommand(prefill=[(2, len(second), cap)], prefill_tokens=[second], cached=[shared * B], load=load)
    got = greedy(ex, 2, cmd)
    want = greedy(ex, 3, StepCommand(prefill=[(3, len(second), cap)], prefill_tokens=[second]))
    torch.testing.assert_close(got, want, rtol=0, atol=2e-4)
    assert got.argmax(-1).tolist() == want.argmax(-1).tolist()


# --- the engine on one rank ---------------------------------------------------------------------


async def _ask(engine, rid: str, prompt: list[int], **sampling) -> tuple[list[int], int]:
    sampling = {"max_tokens": 6, "ignore_eos": True, **sampling}
    req = GenerationRequest(request_id=rid, prompt_token_ids=tuple(prompt), sampling=SamplingParams(**sampling))
    events = [ev async for ev in engine.generate(req)]
    return [e.token_id for e in events], events[-1].cached_tokens


def _conversation() -> list[list[int]]:
    """Three turns, each resending the one before (as a chat client does), then another user."""
    one = SYSTEM + TURN_A
    two = one + [60, 61] + TURN_B + [7] * B
    three = two + TURN_A * 3
    # A long last turn: over two ranks its uncached part is a pipeline prefill cut into chunks.
    four = three + [(5 * i) % 200 + 20 for i in range(300)]
    return [one, two, three, four, SYSTEM + TURN_B]


def _expected_cached(history: list[list[int]], prompt: list[int]) -> int:
    """From the prompts alone: the longest run of whole blocks some earlier prompt shares from
    position 0, leaving at least one token to compute."""
    best = 0
    for before in history:
        same = 0
        while same < min(len(before), len(prompt)) and before[same] == prompt[same]:
            same += 1
        best = max(best, (min(same, len(before), len(prompt) - 1) // B) * B)
    return best


def test_greedy_outputs_with_the_cache_equal_outputs_without_it_and_cached_tokens_are_reported():
    turns = _conversation()

    async def go(prefix_caching: bool):
        engine = ReferenceEngine(SOLO, model="tiny", prefix_caching=prefix_caching)
        await engine.start()
        out = [await _ask(engine, f"t{i}", p) for i, p in enumerate(turns)]
        load = engine.load()
        await engine.shutdown()
        return out, load

    (cached_runs, load), (plain_runs, plain_load) = run(go(True)), run(go(False))
    assert [t for t, _ in cached_runs] == [t for t, _ in plain_runs]
    want = [_expected_cached(turns[:i], p) for i, p in enumerate(turns)]
    assert all(want[1:])  # every turn after the first shares a prefix with one before
    assert [c for _, c in cached_runs] == want
    assert [c for _, c in plain_runs] == [0] * len(turns)
    assert (load.prefix_cache_queries, load.prefix_cache_hits) == (sum(map(len, turns)), sum(want))
    assert (plain_load.prefix_cache_queries, plain_load.prefix_cache_hits) == (0, 0)


def test_what_the_engine_says_it_holds_of_a_prompt_before_admission_is_what_admission_takes_and_pins_nothing():
    """The leader counts a prompt's prefill ahead net of the engine's answer at acceptance
    (ReferenceEngine.cached_tokens): for each turn of a conversation served one after another it is
    the hit the turn then gets, worked out from the prompts alone; asking pins no block and counts
    no query."""
    turns = _conversation()

    async def go():
        engine = ReferenceEngine(SOLO, model="tiny", prefix_caching=True)
        await engine.start()
        told, got = [], []
        for i, p in enumerate(turns):
            req = GenerationRequest(request_id=f"t{i}", prompt_token_ids=tuple(p))
            cache = engine.prefix_cache
            assert cache is not None
            before = (cache.queries, sorted(cache.refs(b) for b in cache.block_ids()))
            told.append(engine.cached_tokens(req))
            assert (cache.queries, sorted(cache.refs(b) for b in cache.block_ids())) == before
            got.append((await _ask(engine, f"t{i}", p))[1])
        await engine.shutdown()
        return told, got

    told, got = run(go())
    want = [_expected_cached(turns[:i], p) for i, p in enumerate(turns)]
    assert told == got == want
    plain = ReferenceEngine(SOLO, model="tiny", prefix_caching=False)
    assert plain.cached_tokens(GenerationRequest(request_id="x", prompt_token_ids=tuple(turns[1]))) == 0


def test_prompts_admitted_in_one_step_share_blocks_stored_before_it_and_match_alone():
    """A burst of prompts with one system prompt, the cache warmed by one of them: each copies the
    same blocks in (one block read by several sequences of one step), and gets the tokens it gets
    alone without the cache."""
    prompts = [SYSTEM + [50 + i] * (i + 1) for i in range(4)]

    async def go():
        engine = ReferenceEngine(SOLO, model="tiny")
        await engine.start()
        warm = await _ask(engine, "w", prompts[0])
        burst = await asyncio.gather(*[_ask(engine, f"b{i}", p) for i, p in enumerate(prompts)])
        cache = engine.prefix_cache
        refs = {cache.refs(b) for b in cache.block_ids()}
        await engine.shutdown()
        plain = ReferenceEngine(SOLO, model="tiny", prefix_caching=False)
        await plain.start()
        alone = [await _ask(plain, f"a{i}", p) for i, p in enumerate(prompts)]
        await plain.shutdown()
        return warm, burst, alone, refs

    warm, burst, alone, refs = run(go())
    assert warm == (alone[0][0], 0)
    assert [t for t, _ in burst] == [t for t, _ in alone]
    assert [c for _, c in burst] == [3 * B] * 4
    assert refs == {0}


def test_the_cache_gives_way_to_running_sequences_least_recently_used_first_and_ranks_drop_what_it_drops():
    """Budget 256 tokens: a sequence reserving 200 (prompt + max_tokens, its prompt too short to
    make a block) leaves room for 3 of the 6 cached blocks, so the cache evicts 3, least recently
    used first: the older prompt's tail; the rank holds exactly the blocks the leader's index names."""
    old = [3] * (4 * B + 1)  # 4 blocks
    new = [9] * (2 * B + 1)  # 2 blocks, used after old's

    async def go():
        engine = ReferenceEngine(SOLO, model="tiny", kv_budget_tokens=256)
        await engine.start()
        await _ask(engine, "old", old)
        await _ask(engine, "new", new)
        cache, ex = engine.prefix_cache, engine.executor
        before = cache.tokens
        await _ask(engine, "big", [11] * 10, max_tokens=190)
        after = (cache.tokens, ex.cached_blocks(), len(cache.block_ids()))
        again_new = await _ask(engine, "new2", new)
        again_old = await _ask(engine, "old2", old)
        await engine.shutdown()
        return before, after, again_new[1], again_old[1]

    before, after, new_hit, old_hit = run(go())
    assert before == 6 * B
    assert after == (3 * B, 3, 3)
    assert new_hit == 2 * B  # the more recently used prompt kept its blocks
    assert old_hit == B  # the older one lost its tail, kept its head


def test_a_cancelled_request_returns_its_pins_and_leaves_its_stored_blocks_usable():
    prompt = SYSTEM + TURN_A

    async def go():
        engine = ReferenceEngine(SOLO, model="tiny")
        await engine.start()
        req = GenerationRequest(
            request_id="long", prompt_token_ids=tuple(prompt), sampling=SamplingParams(max_tokens=1000, ignore_eos=True)
        )
        n = 0
        async for _ in engine.generate(req):  # leaving the loop cancels the request
            n += 1
            if n == 3:
                break
        for _ in range(200):
            if engine.load().running == 0:
                break
            await asyncio.sleep(0.01)
        cache = engine.prefix_cache
        refs = sorted({cache.refs(b) for b in cache.block_ids()})
        held = engine.executor.kv_slots_held()
        again = await _ask(engine, "again", prompt)
        await engine.shutdown()
        return refs, held, again

    refs, held, (tokens, cached) = run(go())
    assert refs == [0] and held == 0
    assert cached == 3 * B


# --- two ranks, every strategy combination (the KV re-shard included) --------------------------

COMBOS = [("pipeline", "tensor"), ("pipeline", "pipeline"), ("tensor", "tensor"), ("tensor", "pipeline")]


# The default budget (each turn's uncached part prefilled in one step), and 40 tokens a step: then
# the first turn goes in 2 chunks and the long fourth in 8 (its 306 uncached tokens after 96 cached),
# chunks ending mid-block, the KV re-sharded and the blocks stored only after the last chunk.
@pytest.fixture(scope="module", params=[None, 40], ids=["one-pass", "chunked"])
def two_rank_runs(request, tmp_path_factory, two_rank_job):
    spec = {"model": "tiny", "combos": COMBOS, "prompts": [], "max_tokens": 6, "conversation": _conversation()}
    if request.param is not None:
        spec["max_prefill_tokens"] = request.param
    return two_rank_job("engine", spec, tmp_path_factory.mktemp("prefix"), ports=1)


def test_every_strategy_combination_serves_a_conversation_from_the_cache_with_unsplit_greedy_tokens(
    tiny, two_rank_runs
):
    from runtime.engines.llama import UnsplitLlama

    turns = _conversation()
    model = UnsplitLlama(tiny.shape, tiny.weights)
    want = []
    for p in turns:
        kv = model.new_kv(len(p) + 6)
        toks = [int(model.forward(p, kv).argmax())]
        while len(toks) < 6:
            toks.append(int(model.forward([toks[-1]], kv).argmax()))
        want.append(toks)
    cached = [_expected_cached(turns[:i], p) for i, p in enumerate(turns)]
    assert [tuple(r["combo"]) for r in two_rank_runs] == COMBOS
    for r in two_rank_runs:
        assert [t["tokens"] for t in r["conversation"]] == want, r["combo"]
        assert [t["cached"] for t in r["conversation"]] == cached, r["combo"]
        assert r["cache_refs"] == [0] and r["blocks_held"] == r["blocks_indexed"] > 0, r["combo"]


def test_the_leaders_canary_is_not_counted_as_prefix_cache_traffic():
    prompt = SYSTEM + TURN_A

    async def go():
        engine = ReferenceEngine(SOLO, model="tiny", prefix_caching=True)
        await engine.start()
        await _ask(engine, "client", prompt)
        before = engine.load()
        req = GenerationRequest(
            request_id="canary-1",
            prompt_token_ids=tuple(prompt),
            sampling=SamplingParams(max_tokens=1, ignore_eos=True),
            canary=True,
        )
        events = [ev async for ev in engine.generate(req)]
        after = engine.load()
        await engine.shutdown()
        return before, events, after

    before, events, after = run(go())
    assert len(events) == 1 and events[0].finish_reason == "length"  # it did run
    assert (after.prefix_cache_queries, after.prefix_cache_hits) == (len(prompt), 0)
    assert (before.prefix_cache_queries, before.prefix_cache_hits) == (len(prompt), 0)
