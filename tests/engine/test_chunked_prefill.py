"""Chunked prefill on one rank (tiny): a prompt longer than the step's prefill budget is prefilled
over several steps, each followed by a decode step of the running batch, with the tokens of one
pass; the prefix cache loads with the first chunk and stores after the last; a request cancelled
between chunks gives back its KV, its batch slot and its pins."""

from __future__ import annotations

import asyncio

import pytest
import torch

from runtime.engines.base import GenerationRequest, SamplingParams
from runtime.engines.executor import StepCommand
from runtime.engines.prefix_cache import BLOCK_TOKENS
from runtime.engines.reference import ReferenceEngine
from runtime.membership import Membership

SOLO = Membership(unit_id="u", revision="1", rank=0, world_size=1, dist_host="127.0.0.1", dist_port=1)
BUDGET = 24  # prompt tokens per step: not a multiple of the cache's block, so chunks end mid-block
LONG = [(11 * i + 5) % 240 + 10 for i in range(150)]  # byte-level ids of the tiny tokenizer


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=120))


def _spy(engine: ReferenceEngine, after=None) -> list[StepCommand]:
    """Every step command the scheduler sends from now on (and a hook run after each step)."""
    seen: list[StepCommand] = []
    ex = engine.executor
    step = ex.leader_step

    def recording(cmd: StepCommand):
        seen.append(cmd)
        out = step(cmd)
        if after is not None:
            after(cmd)
        return out

    ex.leader_step = recording  # type: ignore[method-assign]
    return seen


async def _ask(engine, rid: str, prompt: list[int], **sampling) -> tuple[list[int], int]:
    sampling = {"max_tokens": 6, "ignore_eos": True, **sampling}
    req = GenerationRequest(request_id=rid, prompt_token_ids=tuple(prompt), sampling=SamplingParams(**sampling))
    events = [ev async for ev in engine.generate(req)]
    return [e.token_id for e in events], (events[-1].cached_tokens if events else -1)


async def _one_pass(prompts: list[list[int]], **sampling) -> list[list[int]]:
    """The tokens of each prompt prefilled in one pass (the default budget) and without the cache."""
    engine = ReferenceEngine(SOLO, model="tiny", prefix_caching=False)
    await engine.start()
    out = [(await _ask(engine, f"p{i}", p, **sampling))[0] for i, p in enumerate(prompts)]
    await engine.shutdown()
    return out


def _prefills_of(cmds: list[StepCommand], seq_id: int) -> list[tuple[int, int, bool]]:
    """(start, end, ongoing) of each step's prefill of one sequence."""
    out = []
    for cmd in cmds:
        for i, (sid, end, _) in enumerate(cmd.prefill):
            if sid == seq_id:
                out.append((cmd.cached_tokens(i), end, sid in cmd.ongoing))
    return out


def test_a_step_command_keeps_its_ongoing_prefills_on_the_way_to_the_followers():
    cmd = StepCommand(
        free=[4],
        prefill=[(7, 48, 60), (8, 30, 40)],
        cached=[24, 16],
        ongoing=[7],
        decode=[2, 3],
        load=[(8, 0, 5)],
    )
    header, payload = cmd.encode()
    assert StepCommand.payload_len(header) == payload.numel()
    got = StepCommand.decode_payload(header, payload)
    assert (got.free, got.prefill, got.cached, got.ongoing, got.decode, got.load) == (
        [4],
        [(7, 48, 60), (8, 30, 40)],
        [24, 16],
        [7],
        [2, 3],
        [(8, 0, 5)],
    )


def test_a_prompt_longer_than_the_budget_is_prefilled_in_chunks_with_the_tokens_of_one_pass():
    async def go():
        engine = ReferenceEngine(SOLO, model="tiny", prefix_caching=False, max_prefill_tokens=BUDGET)
        await engine.start()
        cmds = _spy(engine)
        tokens, _ = await _ask(engine, "long", LONG)
        await engine.shutdown()
        return tokens, cmds

    tokens, cmds = run(go())
    seq = cmds[0].prefill[0][0]
    chunks = _prefills_of(cmds, seq)
    n = -(-len(LONG) // BUDGET)
    assert [(a, b) for a, b, _ in chunks] == [(k * BUDGET, min((k + 1) * BUDGET, len(LONG))) for k in range(n)]
    assert [ongoing for _, _, ongoing in chunks] == [True] * (n - 1) + [False]
    assert tokens == run(_one_pass([LONG]))[0]


def test_every_step_of_a_long_prompt_also_decodes_the_running_batch():
    """A running answer gets a token at every chunk of a newcomer's long prompt, instead of waiting
    for the whole prompt (the decode stall chunked prefill bounds)."""

    async def go():
        engine = ReferenceEngine(SOLO, model="tiny", prefix_caching=False, max_prefill_tokens=BUDGET)
        await engine.start()
        first_tokens: list[int] = []
        started = asyncio.Event()

        async def first():
            req = GenerationRequest(
                request_id="first",
                prompt_token_ids=(256, 72, 105),
                sampling=SamplingParams(max_tokens=1500, ignore_eos=True),
            )
            async for ev in engine.generate(req):
                first_tokens.append(ev.token_id)
                started.set()

        task = asyncio.create_task(first())
        await started.wait()
        cmds = _spy(engine)
        long_tokens, _ = await _ask(engine, "long", LONG)
        engine.cancel("first")
        await task
        await engine.shutdown()
        return cmds, long_tokens

    cmds, long_tokens = run(go())
    first_seq = next(sid for cmd in cmds for sid in cmd.decode)
    long_seq = next(sid for cmd in cmds for sid, _, _ in cmd.prefill)
    with_chunk = [cmd for cmd in cmds if any(sid == long_seq for sid, _, _ in cmd.prefill)]
    assert len(with_chunk) == -(-len(LONG) // BUDGET)
    assert all(first_seq in cmd.decode for cmd in with_chunk)
    # The long prompt decodes only after its last chunk: never in a step that still prefills it.
    assert not any(long_seq in cmd.decode for cmd in with_chunk)
    assert long_tokens == run(_one_pass([LONG]))[0]


def test_the_cache_loads_with_the_first_chunk_and_stores_after_the_last():
    follow = LONG + [60, 61, 62] + LONG[:40]

    async def go():
        engine = ReferenceEngine(SOLO, model="tiny", max_prefill_tokens=BUDGET)
        await engine.start()
        cmds = _spy(engine)
        one = await _ask(engine, "one", LONG)
        two = await _ask(engine, "two", follow)
        cache, ex = engine.prefix_cache, engine.executor
        state = (sorted({cache.refs(b) for b in cache.block_ids()}), len(cache.block_ids()), ex.cached_blocks())
        await engine.shutdown()
        return one, two, cmds, state

    one, two, cmds, (refs, indexed, held) = run(go())
    assert [one[0], two[0]] == run(_one_pass([LONG, follow]))
    hit = (len(LONG) // BLOCK_TOKENS) * BLOCK_TOKENS
    assert (one[1], two[1]) == (0, hit)
    second = next(sid for cmd in cmds for sid, _, _ in cmd.prefill if sid != cmds[0].prefill[0][0])
    chunks = _prefills_of(cmds, second)
    assert chunks[0][0] == hit and chunks[-1][1] == len(follow)  # only the uncached part is computed
    assert len(chunks) == -(-(len(follow) - hit) // BUDGET)
    loads = [cmd for cmd in cmds if any(s == second for s, _, _ in cmd.load)]
    stores = [cmd for cmd in cmds if any(s == second for s, _, _ in cmd.store)]
    assert len(loads) == len(stores) == 1
    assert second in loads[0].ongoing and second not in stores[0].ongoing  # first chunk, last chunk
    assert refs == [0] and indexed == held == len(follow) // BLOCK_TOKENS


def test_a_request_cancelled_between_chunks_gives_back_its_kv_its_slot_and_its_pins():
    async def go():
        engine = ReferenceEngine(SOLO, model="tiny", max_prefill_tokens=BUDGET, max_running=1)
        await engine.start()

        def cancel_after_first_chunk(cmd: StepCommand) -> None:
            if cmd.ongoing:
                engine.cancel("long")

        _spy(engine, after=cancel_after_first_chunk)
        tokens, _ = await _ask(engine, "long", LONG)
        cache, ex = engine.prefix_cache, engine.executor
        for _ in range(200):  # the step after the cancel frees the KV on the ranks
            if engine.load().running == 0 and ex.kv_slots_held() == 0:
                break
            await asyncio.sleep(0.01)
        load = engine.load()
        after = (load.running, load.kv_cache_used, ex.kv_slots_held(), cache.block_ids())
        again = await _ask(engine, "again", LONG[:40])  # the only batch slot is free again
        held = (len(cache.block_ids()), ex.cached_blocks(), sorted({cache.refs(b) for b in cache.block_ids()}))
        await engine.shutdown()
        return tokens, after, again, held

    tokens, after, again, held = run(go())
    assert tokens == []  # the stream ended without a token
    assert after == (0, 0.0, 0, [])  # nothing reserved, no KV, no block left half-stored in the index
    assert again == (run(_one_pass([LONG[:40]]))[0], 0)
    assert held == (40 // BLOCK_TOKENS, 40 // BLOCK_TOKENS, [0])  # the ranks hold what the index names


def test_n_choices_of_a_chunked_prompt_fork_after_its_last_chunk():
    async def go():
        engine = ReferenceEngine(SOLO, model="tiny", prefix_caching=False, max_prefill_tokens=BUDGET)
        await engine.start()
        cmds = _spy(engine)
        req = GenerationRequest(
            request_id="two",
            prompt_token_ids=tuple(LONG),
            sampling=SamplingParams(max_tokens=5, ignore_eos=True, n=2, temperature=0.0),
        )
        by_choice: dict[int, list[int]] = {}
        async for ev in engine.generate(req):
            by_choice.setdefault(ev.index, []).append(ev.token_id)
        await engine.shutdown()
        return by_choice, cmds

    by_choice, cmds = run(go())
    forks = [cmd for cmd in cmds if cmd.fork]
    assert len(forks) == 1 and not forks[0].ongoing and forks[0].prefill[0][1] == len(LONG)
    want = run(_one_pass([LONG], max_tokens=5))[0]
    assert by_choice == {0: want, 1: want}


@pytest.mark.parametrize("budget", [0, -5])
def test_a_prefill_budget_below_one_token_is_refused(budget):
    with pytest.raises(ValueError, match="max_prefill_tokens must be at least 1"):
        ReferenceEngine(SOLO, model="tiny", max_prefill_tokens=budget)


def test_chunked_logits_stay_within_the_tolerance_of_one_pass():
    """The executor alone: a prompt run in three chunks onto its own KV gives first-token logits
    within tiny's stated tolerance (1e-5) of one pass (the later chunks attend with a mask, not the
    causal kernel, so the sums may be ordered differently)."""
    from runtime.engines.executor import ShardExecutor
    from runtime.engines.layout import make_plan
    from runtime.models.registry import resolve_model

    src = resolve_model("tiny")
    ex = ShardExecutor(plan=make_plan(src.shape, 1, prefill="tensor", decode="tensor"), rank=0, weights=src.weights)
    cap = len(LONG) + 4
    whole = ex.run(StepCommand(prefill=[(1, len(LONG), cap)], prefill_tokens=[LONG])).prefill_logits[0]
    cuts = [0, 50, 100, len(LONG)]
    for a, b in zip(cuts, cuts[1:]):
        ongoing = [2] if b < len(LONG) else []
        out = ex.run(StepCommand(prefill=[(2, b, cap)], prefill_tokens=[LONG[:b]], cached=[a], ongoing=ongoing))
    torch.testing.assert_close(out.prefill_logits[0], whole, rtol=0, atol=1e-5)
