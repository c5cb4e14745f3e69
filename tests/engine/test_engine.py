"""The engine end to end on 2 ranks: every prefill/decode strategy combination gives the unsplit
model's greedy tokens, and batching does not change them."""

from __future__ import annotations

import json

import jsonschema
import pytest

COMBOS = [("pipeline", "tensor"), ("pipeline", "pipeline"), ("tensor", "tensor"), ("tensor", "pipeline")]
PROMPTS = [[1, 9690, 198, 2683, 359, 253, 5356], [504, 3458, 282], [1, 4093, 198, 6004, 2, 198, 1, 520]]
MAX_TOKENS = 6
SCHEMA = {
    "type": "object",
    "properties": {"item": {"type": "string", "maxLength": 8}, "count": {"type": "integer"}},
    "required": ["item", "count"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def engine_runs(smollm2_dir, tmp_path_factory, two_rank_job):
    spec = {
        "model": "smollm2",
        "combos": COMBOS,
        "prompts": PROMPTS,
        "max_tokens": MAX_TOKENS,
        "structured": {"schema": SCHEMA, "max_tokens": 60},
    }
    return two_rank_job("engine", spec, tmp_path_factory.mktemp("engine"), ports=1)


@pytest.fixture(scope="module")
def unsplit_tokens(smollm2_dir):
    from runtime.engines.llama import UnsplitLlama
    from runtime.models import resolve_model

    src = resolve_model("smollm2")
    model = UnsplitLlama(src.shape, src.weights)
    out = []
    for p in PROMPTS:
        kv = model.new_kv(len(p) + MAX_TOKENS)
        toks = [int(model.forward(p, kv).argmax())]
        while len(toks) < MAX_TOKENS:
            toks.append(int(model.forward([toks[-1]], kv).argmax()))
        out.append(toks)
    return out


def test_every_strategy_combination_matches_unsplit_greedy_tokens(engine_runs, unsplit_tokens):
    assert [tuple(r["combo"]) for r in engine_runs] == COMBOS
    for run in engine_runs:
        assert run["alone"] == unsplit_tokens, run["combo"]


def test_requests_batched_together_get_the_same_tokens_as_alone(engine_runs):
    for run in engine_runs:
        assert run["together"] == run["alone"], run["combo"]


def test_finished_requests_release_slots_and_kv_budget(engine_runs):
    for run in engine_runs:
        assert run["load_after"] == (0, 0, 0.0)
        assert run["state"] == "stopped"


def test_structured_n_choices_share_the_prefill_and_match_in_every_layout(engine_runs):
    """Sampling and the grammar mask run on rank 0 over the full logits in every layout, and the n
    choices continue from copies of one prefilled KV cache: greedy choices are identical to each
    other and across strategy combinations, and the JSON validates."""
    first = engine_runs[0]["structured"]
    assert sorted(first) == [0, 1]
    assert first[0]["tokens"] == first[1]["tokens"] and first[0]["finish"] == "stop"
    jsonschema.validate(json.loads(first[0]["text"]), SCHEMA)
    assert all(len(top) == 2 and top[0] == tok for top, tok in zip(first[0]["top"], first[0]["tokens"]))
    for run in engine_runs[1:]:
        assert [run["structured"][i]["tokens"] for i in (0, 1)] == [first[0]["tokens"]] * 2, run["combo"]
