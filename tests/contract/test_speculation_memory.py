"""An EAGLE draft's memory in the one layout-and-memory check (contract/sizing.py, contract/layout.py):
counted beside the model's, from the draft's own config.json where the node has it and estimated at
synth, and a refusal that names speculation when the draft is what does not fit."""

from __future__ import annotations

import dataclasses

import pytest

from contract.layout import LayoutError, check_layout
from contract.llama import PRESETS

SHAPE = PRESETS["llama-3.1-8b"]
ONE_TRN1 = {"instance_type": "trn1.32xlarge", "nodes": 1, "seq_len": 4096}


def _fits(batch: int, **kw) -> bool:
    try:
        check_layout(SHAPE, batch_size=batch, **ONE_TRN1, **kw)
    except LayoutError:
        return False
    return True


def _largest_batch() -> int:
    """The largest batch (a multiple of 8, which every degree here divides) that fits without a draft."""
    batch = 8
    while _fits(batch + 8):
        batch += 8
    return batch


def test_the_draft_is_counted_beside_the_model_and_its_own_shape_replaces_the_estimate():
    plain = check_layout(SHAPE, batch_size=8, **ONE_TRN1).memory
    eagle = check_layout(SHAPE, batch_size=8, speculation="eagle", **ONE_TRN1).memory
    assert plain is not None and eagle is not None
    assert plain.draft == 0 and eagle.draft > 0
    assert (eagle.weights, eagle.kv_cache) == (plain.weights, plain.kv_cache)
    assert eagle.total == plain.total + eagle.draft
    # EAGLE-3's FC fuses three layers' features, not two: a larger draft
    eagle3 = check_layout(SHAPE, batch_size=8, speculation="eagle3", **ONE_TRN1).memory
    assert eagle3 is not None and eagle3.draft > eagle.draft
    # a draft whose config.json says more layers weighs more, and its KV cache grows with the batch
    deeper = dataclasses.replace(SHAPE, num_hidden_layers=4, tie_word_embeddings=False)
    four = check_layout(SHAPE, batch_size=8, speculation="eagle", draft=deeper, **ONE_TRN1).memory
    assert four is not None and four.draft > eagle.draft
    wider = check_layout(SHAPE, batch_size=16, speculation="eagle", **ONE_TRN1).memory
    assert wider is not None and wider.draft > eagle.draft
    # no draft without an EAGLE method
    assert check_layout(SHAPE, batch_size=8, speculation="none", draft=deeper, **ONE_TRN1).memory == plain


def test_a_batch_that_fits_only_without_the_draft_is_refused_naming_speculation_not_more_nodes():
    edge = _largest_batch()
    with pytest.raises(LayoutError) as e:
        check_layout(
            SHAPE, batch_size=edge, speculation="eagle", names={"speculation": "speculation.method"}, **ONE_TRN1
        )
    assert e.value.setting == "speculation"
    said = str(e.value)
    assert said.startswith("speculation.method=eagle cannot hold")
    assert "EAGLE draft" in said and "set speculation.method none" in said
    assert "use --nodes" not in said  # EAGLE runs on one node: more nodes are not a fix
    assert len(said.splitlines()) == 1
    # the same unit with a smaller batch holds the model and its draft
    assert _fits(edge // 2, speculation="eagle")
