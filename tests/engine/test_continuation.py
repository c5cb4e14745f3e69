"""A continuation (GenerationRequest.generated): a request another unit started, continued here from the
tokens its client already has. The split answer must equal the unsplit one token for token, text for
text, for greedy and for seeded sampling, with penalties, logprobs and a grammar."""

from __future__ import annotations

import asyncio

import pytest

from runtime.engines.base import GenerationRequest, RequestRejected, SamplingParams, StructuredOutput
from runtime.engines.reference import ReferenceEngine
from runtime.membership import Membership

SOLO = Membership(unit_id="u", revision="1", rank=0, world_size=1, dist_host="127.0.0.1", dist_port=1)
PROMPT = (256, 72, 105, 33)


async def _events(engine, rid, sampling, generated=()):
    req = GenerationRequest(request_id=rid, prompt_token_ids=PROMPT, sampling=sampling, generated=tuple(generated))
    return [ev async for ev in engine.generate(req)]


def _split_and_whole(sampling: SamplingParams, cut: int):
    """The unsplit answer, and the same request cut after `cut` tokens and continued."""

    async def go():
        engine = ReferenceEngine(SOLO, model="tiny")
        await engine.start()
        try:
            whole = await _events(engine, "whole", sampling)
            head = whole[:cut]
            tail = await _events(engine, "tail", sampling, [e.token_id for e in head])
            return whole, head + tail
        finally:
            await engine.shutdown()

    return asyncio.run(asyncio.wait_for(go(), timeout=120))


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingParams(max_tokens=24, ignore_eos=True),
        SamplingParams(max_tokens=24, ignore_eos=True, temperature=1.0, top_p=0.9, seed=7),
        SamplingParams(max_tokens=24, ignore_eos=True, temperature=0.8, seed=-3, presence_penalty=0.5, logprobs=2),
    ],
    ids=["greedy", "seeded", "seeded-penalties-logprobs"],
)
def test_a_continued_answer_equals_the_unsplit_one(sampling):
    whole, split = _split_and_whole(sampling, cut=9)
    assert [e.token_id for e in split] == [e.token_id for e in whole]
    assert "".join(e.text for e in split) == "".join(e.text for e in whole)
    assert [e.finish_reason for e in split] == [e.finish_reason for e in whole]
    # The continued tokens' logits come from one prefill over prompt + generated instead of decode
    # steps: the same sums in another order, so logprobs agree to float32 rounding, not bit for bit.
    for got, want in zip(split, whole, strict=True):
        if want.logprob is None:
            assert got.logprob is None
            continue
        assert got.logprob.logprob == pytest.approx(want.logprob.logprob, abs=1e-4)
        assert [t for t, _ in got.logprob.top] == [t for t, _ in want.logprob.top]


def test_a_continued_structured_answer_replays_the_grammar():
    sampling = SamplingParams(max_tokens=40, structured=StructuredOutput(kind="json_object"))
    whole, split = _split_and_whole(sampling, cut=4)
    assert [e.token_id for e in split] == [e.token_id for e in whole]
    assert "".join(e.text for e in split) == "".join(e.text for e in whole)


def test_a_stop_string_held_back_before_the_cut_is_released_after_it():
    # The stop string's first character is held back at the cut (it may become the stop string);
    # the continuation must release it exactly once, or cut it with the rest.
    free, _ = _split_and_whole(SamplingParams(max_tokens=24, ignore_eos=True), cut=1)
    text = "".join(e.text for e in free)
    stop = text[6:8] + "\u2603"  # its prefix appears in the text, the whole never does
    whole, split = _split_and_whole(SamplingParams(max_tokens=24, ignore_eos=True, stop=(stop,)), cut=7)
    assert "".join(e.text for e in split) == "".join(e.text for e in whole) == text


@pytest.mark.parametrize(
    ("sampling", "generated", "words"),
    [
        (SamplingParams(max_tokens=8, n=2), (65,), "one choice"),
        (SamplingParams(max_tokens=3), (65, 66, 67), "nothing is left"),
        (SamplingParams(max_tokens=8), (10**9,), "outside the vocabulary"),
    ],
    ids=["n>1", "budget-spent", "bad-token"],
)
def test_a_continuation_that_cannot_be_served_is_refused_with_the_reason(sampling, generated, words):
    async def go():
        engine = ReferenceEngine(SOLO, model="tiny")
        await engine.start()
        try:
            with pytest.raises(RequestRejected, match=words):
                await engine.check(
                    GenerationRequest(request_id="x", prompt_token_ids=PROMPT, sampling=sampling, generated=generated)
                )
        finally:
            await engine.shutdown()

    asyncio.run(asyncio.wait_for(go(), timeout=120))


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingParams(max_tokens=16, ignore_eos=True, n=3),
        SamplingParams(max_tokens=16, ignore_eos=True, n=3, temperature=1.0, seed=11),
    ],
    ids=["greedy", "seeded"],
)
def test_continued_choices_each_go_on_from_their_own_tokens(sampling):
    """n = 3 cut at different points per choice, choice 1 already ended: choices 0 and 2 each go on
    from prompt + their own tokens and equal the unsplit answer's choices; choice 1 is not run again."""
    cuts = {0: 5, 2: 11}

    async def go():
        engine = ReferenceEngine(SOLO, model="tiny")
        await engine.start()
        try:
            whole = await _events(engine, "whole", sampling)
            ids = {i: [e.token_id for e in whole if e.index == i] for i in range(3)}
            resumed = tuple((i, tuple(ids[i][:cut])) for i, cut in cuts.items())
            req = GenerationRequest(
                request_id="tail", prompt_token_ids=PROMPT, sampling=sampling, resumed_choices=resumed
            )
            return ids, [ev async for ev in engine.generate(req)]
        finally:
            await engine.shutdown()

    ids, tail = asyncio.run(asyncio.wait_for(go(), timeout=120))
    if sampling.temperature:
        assert ids[0] != ids[2]  # seed + index: the choices differ, so a crossed token would show
    assert {e.index for e in tail} == set(cuts)
    for i, cut in cuts.items():
        got = [e for e in tail if e.index == i]
        assert [e.token_id for e in got] == ids[i][cut:]
        assert [e.finish_reason for e in got] == [None] * (len(got) - 1) + ["length"]


def test_continued_choices_are_refused_with_the_reason():
    async def go():
        engine = ReferenceEngine(SOLO, model="tiny")
        await engine.start()
        try:
            for resumed, words in (
                (((3, (65,)),), "outside 0..1"),
                (((0, (65,)), (0, (66,))), "each choice once"),
                (((1, (65, 66, 67, 68)),), "nothing is left"),
            ):
                with pytest.raises(RequestRejected, match=words):
                    await engine.check(
                        GenerationRequest(
                            request_id="x",
                            prompt_token_ids=PROMPT,
                            sampling=SamplingParams(max_tokens=4, n=2),
                            resumed_choices=resumed,
                        )
                    )
        finally:
            await engine.shutdown()

    asyncio.run(asyncio.wait_for(go(), timeout=120))
