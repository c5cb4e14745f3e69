"""One rank prefills every prompt of a step in one pass through the layers (nothing to overlap
without a second stage), and each prompt gets the logits and the cache it would get alone."""

from __future__ import annotations

import torch

from runtime.engines import executor as executor_module
from runtime.engines.executor import ShardExecutor, StepCommand
from runtime.engines.layout import make_plan
from runtime.models.registry import resolve_model

PROMPTS = [[1, 5, 9, 13, 2], [7, 7, 3], [4, 8, 15, 16, 23, 42, 11, 2, 9]]


def _executor() -> ShardExecutor:
    src = resolve_model("tiny")
    # pipeline prefill is what a one-rank unit's plan says by default
    return ShardExecutor(plan=make_plan(src.shape, 1, prefill="pipeline", decode="tensor"), rank=0, weights=src.weights)


def test_one_rank_prefills_a_steps_prompts_in_one_pass_with_the_logits_each_gets_alone(monkeypatch):
    ex = _executor()
    alone = [
        ex.run(StepCommand(prefill=[(100 + i, len(p), len(p) + 2)], prefill_tokens=[p])).prefill_logits[0]
        for i, p in enumerate(PROMPTS)
    ]
    after_alone = ex.run(StepCommand(decode=[100, 101, 102], decode_tokens=[3, 4, 5])).decode_logits

    passes: list[int] = []
    real = executor_module.decoder_layer

    def counting(shape, layer, lw, x, segments, *rest, **kw):
        passes.append(len(segments))
        return real(shape, layer, lw, x, segments, *rest, **kw)

    monkeypatch.setattr(executor_module, "decoder_layer", counting)
    together = ex.run(
        StepCommand(prefill=[(i, len(p), len(p) + 2) for i, p in enumerate(PROMPTS)], prefill_tokens=PROMPTS)
    ).prefill_logits
    assert passes == [len(PROMPTS)] * ex.shape.num_hidden_layers  # one pass per layer, every prompt in it
    after_together = ex.run(StepCommand(decode=[0, 1, 2], decode_tokens=[3, 4, 5])).decode_logits

    # A GEMM over more rows may sum in another order: equal to float tolerance, same greedy choice.
    for a, b in [*zip(alone, together), *zip(after_alone, after_together)]:
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
        assert int(a.argmax()) == int(b.argmax())
