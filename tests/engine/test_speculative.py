"""Speculative decoding in the reference engine (runtime/engines/speculative.py): the proposer's drafts,
the verifier keeping the model's own tokens and its distribution, the switch that turns drafting off,
and the KV cache and token stream staying whole through cancellation and mid-stream moves."""

from __future__ import annotations

import asyncio
import collections
import random

import pytest
import torch

from runtime.engines.base import GenerationRequest, SamplingParams
from runtime.engines.reference import ReferenceEngine
from runtime.engines.sampling import Draws, choose
from runtime.engines.speculative import Lookup, SeqSpeculation, SpeculationSettings, Speculator
from runtime.membership import Membership

SOLO = Membership(unit_id="u", revision="1", rank=0, world_size=1, dist_host="127.0.0.1", dist_port=1)
# tiny's greedy answers to these repeat stretches of the prompt, so prompt lookup drafts and some
# drafts are kept (checked below: a test of the verifier that never verifies would prove nothing).
REPEATING = [[5, 6, 7, 8, 9, 10, 11, 12] * 6, [1, 2, 3, 4] * 10 + [7], list(range(30, 80)) + list(range(30, 60))]
ON = SpeculationSettings(max_batch=8)  # n = 2 choices of three prompts decode six sequences


def _lookup_by_definition(tokens: list[int], k: int, lo: int, hi: int) -> list[int]:
    """The draft as the proposer is specified: the longest suffix (hi down to lo tokens) that occurred
    earlier with something after it; what followed its latest such occurrence, at most k tokens."""
    L = len(tokens)
    for n in range(min(hi, L), lo - 1, -1):
        suffix = tokens[L - n :]
        for end in range(L - 1, n - 1, -1):  # occurrence tokens[end - n:end], followed by tokens[end]
            if tokens[end - n : end] == suffix:
                return tokens[end : end + k]
    return []


def test_prompt_lookup_drafts_what_followed_the_latest_occurrence_of_the_longest_suffix():
    rng = random.Random(3)
    for _ in range(200):
        prompt = [rng.randrange(6) for _ in range(rng.randrange(1, 30))]
        answer = [rng.randrange(6) for _ in range(40)]
        look = Lookup(prompt, 2, 4)
        for t in range(0, len(answer), rng.randrange(1, 4)):  # the index grows by several tokens at a time
            assert look.propose(answer[:t], 3) == _lookup_by_definition(prompt + answer[:t], 3, 2, 4)


class _Seq:
    """What Speculator.take reads of a sequence, advanced as the engine's _advance does it: the choice's
    token from the row with its draw for that position (sampling.Draws), and its count."""

    def __init__(self, params: SamplingParams, seed_index: int, draft: list[int]) -> None:
        self.params, self.draws = params, Draws(params, seed_index)
        self.spec = SeqSpeculation(Lookup([], 2, 4), draft=draft)
        self.seq_id, self.generated, self.last_token, self.done, self.emitted = 1, 0, -1, False, []

    def advance(self, row: torch.Tensor) -> None:
        token, _ = choose(row, self.params, self.draws.at(self.generated))
        self.generated += 1
        self.last_token = token
        self.emitted.append(token)


def _chi_square(counts: collections.Counter, probs: list[float], n: int) -> float:
    return sum((counts.get(t, 0) - n * p) ** 2 / (n * p) for t, p in enumerate(probs))


def test_sampled_tokens_keep_the_target_distribution_whatever_the_draft():
    """Leviathan et al. 2023 / Chen et al. 2023: with a draft, the tokens emitted are distributed as the
    model's own. Three rows of a 4-token vocabulary; draft [1, 1]. The first token must follow p0; the
    second exists only when the first is the draft's, and then follows p1; the third likewise.
    Tolerance: each chi-square statistic below 16.27, its 0.999 quantile at 3 degrees of freedom
    (seeds 0..3999 fixed, so the outcome is the same on every run)."""
    p = [[0.5, 0.3, 0.15, 0.05], [0.1, 0.6, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25]]
    rows = torch.tensor(p).log()
    params = SamplingParams(temperature=1.0, seed=0, max_tokens=8)
    n = 4000
    first, second, third = collections.Counter(), collections.Counter(), collections.Counter()
    spec = Speculator(ON)
    for trial in range(n):
        seq = _Seq(params, trial, draft=[1, 1])
        spec.take(seq, iter(rows), seq.advance)
        first[seq.emitted[0]] += 1
        if seq.emitted[0] != 1:
            assert len(seq.emitted) == 1, "a rejected draft token ends the step with the model's own token"
            continue
        second[seq.emitted[1]] += 1
        if seq.emitted[1] == 1:
            third[seq.emitted[2]] += 1
        else:
            assert len(seq.emitted) == 2
    assert _chi_square(first, p[0], n) < 16.27
    assert _chi_square(second, p[1], sum(second.values())) < 16.27
    assert _chi_square(third, p[2], sum(third.values())) < 16.27
    assert spec.draft_tokens == 2 * n and spec.accepted_tokens == sum(second.values()) + sum(third.values())


def test_rejected_draft_tokens_are_trimmed_from_the_cache_at_the_next_step():
    spec = Speculator(ON)
    greedy = torch.tensor([[0.0, 9.0, 0.0], [9.0, 0.0, 0.0], [0.0, 0.0, 9.0], [0.0, 0.0, 9.0]])
    seq = _Seq(SamplingParams(max_tokens=8), 0, draft=[1, 2, 2])  # row 1 chooses 0, not 2
    spec.take(seq, iter(greedy), seq.advance)
    assert seq.emitted == [1, 0]
    assert spec.orders([])["trim"] == [(1, 2)]  # drafts 2 and 3 were computed and are dropped
    assert spec.orders([])["trim"] == []


class _Req:
    def __init__(self, prompt: list[int], max_tokens: int = 100) -> None:
        self.request = GenerationRequest(
            request_id="r", prompt_token_ids=tuple(prompt), sampling=SamplingParams(max_tokens=max_tokens)
        )


class _Decoding:
    def __init__(self, generated: list[int]) -> None:
        self.spec, self.seq_id, self.generated, self.done = None, 1, len(generated), False

        class T:
            ids = generated

        self.tracker = T()


def test_no_drafts_while_the_batch_is_larger_than_max_batch():
    spec = Speculator(SpeculationSettings(max_batch=2))
    batch = [(_Req([1, 2, 3, 1, 2]), _Decoding([])) for _ in range(3)]
    planned = spec.plan(batch)
    assert all(seq.spec.draft == [] for _, seq in planned)
    planned = spec.plan(batch[:2])
    assert [seq.spec.draft for _, seq in planned] == [[3, 1, 2], [3, 1, 2]]


def test_a_sequence_whose_drafts_are_rejected_pauses_drafting_then_tries_again():
    settings = SpeculationSettings(pause_steps=3, min_acceptance=0.3)
    spec = Speculator(settings)
    req, seq = _Req([1, 2, 3, 1, 2]), _Decoding([])
    steps_with_drafts = []
    for step in range(12):
        ((_, s),) = spec.plan([(req, seq)])
        steps_with_drafts.append(bool(s.spec.draft))
        if s.spec.draft:
            # the model disagrees with every draft: row 0 chooses token 9
            rows = torch.full((1 + len(s.spec.draft), 10), 0.0)
            rows[:, 9] = 5.0
            spec.take(s, iter(rows), lambda row: setattr(s, "last_token", int(row.argmax())))
    # acceptance 1.0 -> 0.7 -> 0.49 -> 0.343 -> 0.24 (below 0.3 after the fourth rejection): paused 3 steps
    assert steps_with_drafts[:4] == [True] * 4
    assert steps_with_drafts[4:7] == [False] * 3
    assert steps_with_drafts[7] is True


def test_a_draft_never_runs_past_max_tokens():
    spec = Speculator(SpeculationSettings(num_tokens=4))
    ((_, seq),) = spec.plan([(_Req([1, 2, 3, 1, 2], max_tokens=4), _Decoding([7, 7]))])
    assert seq.spec.draft == [] or len(seq.spec.draft) <= 4 - 2 - 1


# --- the engine end to end (tiny, one rank) -----------------------------------------------------------


async def _answers(engine, prompts, sampling, prefix="r"):
    async def one(i, p):
        req = GenerationRequest(request_id=f"{prefix}{i}", prompt_token_ids=tuple(p), sampling=sampling)
        events = [(ev.index, ev.token_id, ev.text, ev.finish_reason) async for ev in engine.generate(req)]
        # Each choice's events in order (a choice that keeps a draft runs ahead of the other choices)
        return sorted(events, key=lambda e: e[0])

    return await asyncio.gather(*[one(i, p) for i, p in enumerate(prompts)])


def _both(prompts, sampling):
    async def go(speculation):
        engine = ReferenceEngine(SOLO, model="tiny", speculation=speculation)
        await engine.start()
        try:
            out = await _answers(engine, prompts, sampling)
            return out, engine.load()
        finally:
            await engine.shutdown()

    return asyncio.run(asyncio.wait_for(go(None), 120)), asyncio.run(asyncio.wait_for(go(ON), 120))


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingParams(max_tokens=40, ignore_eos=True),
        SamplingParams(max_tokens=40, ignore_eos=True, temperature=0.7, seed=11, n=2),
        SamplingParams(max_tokens=40, ignore_eos=True, temperature=0.2, seed=3, frequency_penalty=0.1, logprobs=2),
    ],
    ids=["greedy", "seeded-n2", "seeded-penalties-logprobs"],
)
def test_batched_answers_with_speculation_equal_those_without_token_for_token(sampling):
    (plain, plain_load), (sped, sped_load) = _both(REPEATING, sampling)
    assert sped == plain
    assert sped_load.spec_accepted_tokens > 0, "drafts were kept: the verifier's accept path ran"
    assert sped_load.spec_draft_tokens > sped_load.spec_accepted_tokens, "and its reject path ran"
    if sampling.temperature == 0.0:  # sampled, the slowest choice may keep few drafts
        assert sped_load.steps < plain_load.steps
    assert plain_load.tokens_per_step == 1.0 and sped_load.tokens_per_step > 1.0


def test_cancelled_answers_free_their_cache_and_leave_the_next_answer_unchanged():
    async def go():
        engine = ReferenceEngine(SOLO, model="tiny", speculation=ON)
        await engine.start()
        try:
            streams = []
            for i, p in enumerate(REPEATING):
                req = GenerationRequest(
                    request_id=f"c{i}",
                    prompt_token_ids=tuple(p),
                    sampling=SamplingParams(max_tokens=200, ignore_eos=True),
                )
                streams.append(engine.generate(req))
            for s in streams:  # every stream has drafted by its seventh token (tiny repeats the prompt)
                for _ in range(7):
                    await s.__anext__()
            for s in streams:
                await s.aclose()  # the client went away: the engine cancels
            for _ in range(500):  # the scheduler frees cancelled sequences in a step of their own
                if engine.load().running == 0 and not engine.executor.kv:
                    break
                await asyncio.sleep(0.01)
            held = engine.executor.kv_slots_held(), dict(engine.executor.kv)
            after = await _answers(engine, REPEATING, SamplingParams(max_tokens=40, ignore_eos=True), prefix="n")
            return held, after, engine.load()
        finally:
            await engine.shutdown()

    held, after, load = asyncio.run(asyncio.wait_for(go(), 120))
    assert held == (0, {})
    (plain, _), _ = _both(REPEATING, SamplingParams(max_tokens=40, ignore_eos=True))
    assert after == plain
    assert load.spec_draft_tokens > 0


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingParams(max_tokens=40, ignore_eos=True),
        SamplingParams(max_tokens=40, ignore_eos=True, temperature=0.8, seed=5),
    ],
    ids=["greedy", "seeded"],
)
def test_an_answer_moved_mid_stream_with_speculation_on_equals_the_unmoved_one(sampling):
    prompt = tuple(REPEATING[0])

    async def go():
        engine = ReferenceEngine(SOLO, model="tiny", speculation=ON)
        await engine.start()
        try:
            whole = [ev async for ev in engine.generate(GenerationRequest("w", prompt, sampling))]
            head = whole[:13]
            tail = [
                ev
                async for ev in engine.generate(
                    GenerationRequest("t", prompt, sampling, generated=tuple(e.token_id for e in head))
                )
            ]
            return whole, head + tail
        finally:
            await engine.shutdown()

    whole, split = asyncio.run(asyncio.wait_for(go(), 120))
    assert [e.token_id for e in split] == [e.token_id for e in whole]
    assert "".join(e.text for e in split) == "".join(e.text for e in whole)
    (plain, _), _ = _both([list(prompt)], sampling)
    assert [t for _, t, *_ in plain[0]] == [e.token_id for e in whole]


# --- SmolLM2 on 2 ranks: both decode strategies, batched -----------------------------------------------

QUOTING = [
    "Product 1. TrailPeak 40L backpack: aluminium frame, rain cover, 1.4 kg, 89 dollars. Review: the frame "
    "carried a heavy load comfortably.\nProduct 2. SummitLite 38L backpack: frameless, roll-top, 0.9 kg, 119 "
    "dollars. Review: uncomfortable above 10 kg.\nCompare the TrailPeak 40L and the SummitLite 38L.",
    "Product 1. BrewMaster Pro coffee maker: 12 cup glass carafe, keep-warm plate. Product 2. ThermaBrew coffee "
    "maker: 10 cup thermal stainless steel carafe. Which keeps coffee hot longer, the BrewMaster Pro or the "
    "ThermaBrew?",
    "Repeat the product name exactly: AquaPure Water Filter Pitcher 2.4 litre. Then repeat it again.",
]
SPEC_TOKENS = 24
SPEC_COMBOS = [("tensor", "tensor"), ("pipeline", "pipeline")]  # decode split by heads, and by layers


@pytest.fixture(scope="module")
def quoting_prompts(smollm2_dir):
    from runtime.models import resolve_model

    tok = resolve_model("smollm2").make_tokenizer()
    return [tok.apply_chat_template([{"role": "user", "content": q}]) for q in QUOTING]


@pytest.fixture(scope="module")
def speculative_runs(quoting_prompts, tmp_path_factory, two_rank_job):
    spec = {
        "model": "smollm2",
        "combos": SPEC_COMBOS,
        "prompts": quoting_prompts,
        "max_tokens": SPEC_TOKENS,
        "speculation": {"max_batch": 8},
    }
    return two_rank_job("engine", spec, tmp_path_factory.mktemp("speculative"), ports=1)


# Its setup runs two SmolLM2 ranks for every combination, its body the unsplit model on every torch thread.
@pytest.mark.whole_machine
def test_smollm2_greedy_answers_with_speculation_equal_the_unsplit_model_in_both_decode_strategies(
    speculative_runs, quoting_prompts
):
    from runtime.engines.llama import UnsplitLlama
    from runtime.models import resolve_model

    src = resolve_model("smollm2")
    model, eos = UnsplitLlama(src.shape, src.weights), src.make_tokenizer().eos_token_id
    want = []
    for p in quoting_prompts:
        kv = model.new_kv(len(p) + SPEC_TOKENS)
        toks = [int(model.forward(p, kv).argmax())]
        while len(toks) < SPEC_TOKENS and toks[-1] != eos:
            toks.append(int(model.forward([toks[-1]], kv).argmax()))
        want.append(toks)
    assert [tuple(r["combo"]) for r in speculative_runs] == SPEC_COMBOS
    for run in speculative_runs:
        assert run["together"] == want, run["combo"]  # three answers decoding as one batch
        assert run["alone"] == want, run["combo"]
        drafted, kept = run["spec"]
        assert 0 < kept < drafted, run["combo"]  # drafts were both kept and rejected
        assert run["load_after"] == (0, 0, 0.0), run["combo"]
