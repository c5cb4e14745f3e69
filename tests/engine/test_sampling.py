"""Token choice and incremental text: greedy, top-p support, stop strings held back until decided."""

from __future__ import annotations

import torch

from runtime.engines.base import SamplingParams
from runtime.engines.sampling import make_generator, sample
from runtime.engines.text import TextTracker
from runtime.models.tokenizers import ByteTokenizer


def _feed(tracker: TextTracker, text: str) -> tuple[list[str], bool]:
    deltas = []
    for b in text.encode():
        delta, stopped = tracker.add(b)
        deltas.append(delta)
        if stopped:
            return deltas, True
    return deltas, False


def test_greedy_picks_the_largest_logit():
    assert sample(torch.tensor([0.1, 3.0, -1.0]), SamplingParams(), None) == 1


def test_top_p_never_samples_outside_the_nucleus():
    logits = torch.log(torch.tensor([0.6, 0.3, 0.05, 0.05]))
    params = SamplingParams(temperature=1.0, top_p=0.8, seed=3)
    gen = make_generator(params)
    assert {sample(logits, params, gen) for _ in range(200)} == {0, 1}


def test_stop_string_is_cut_and_text_before_it_is_released():
    tracker = TextTracker(ByteTokenizer(), ("wor",))
    deltas, stopped = _feed(tracker, "hello world")
    assert stopped and "".join(deltas) == "hello "


def test_a_possible_stop_prefix_is_held_back_then_released_when_it_diverges():
    tracker = TextTracker(ByteTokenizer(), ("wor",))
    deltas, stopped = _feed(tracker, "a wow")
    assert not stopped
    assert deltas[2] == "" and "".join(deltas) == "a wo"  # trailing "w" could still be "wor"
    assert tracker.flush() == "w"


def test_incomplete_utf8_waits_for_its_next_byte():
    tracker = TextTracker(ByteTokenizer(), ())
    deltas, _ = _feed(tracker, "é!")
    assert deltas == ["", "é", "!"]


def test_incremental_text_equals_decoding_all_tokens_at_once(smollm2_dir):
    from runtime.models import resolve_model

    tok = resolve_model("smollm2").make_tokenizer()
    ids = tok.encode("Grüße aus Köln — 東京 🚀 ok. Done!")
    tracker = TextTracker(tok, ())
    text = "".join(tracker.add(t)[0] for t in ids) + tracker.flush()
    assert text == tok.decode(ids)
