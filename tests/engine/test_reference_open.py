"""A reference unit whose checkpoint directory can never be served stops at its first attempt with the
node exit status that says why (contract/node_exit.py), before it forms a process group or loads a
weight: no config.json, config.json not JSON, no weights, weights of another model, a tokenizer that
does not load, more nodes than the model has layers. A complete checkpoint opens."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from safetensors.torch import save_file
from tokenizers import Tokenizer, models, pre_tokenizers

import contract
from contract import node_exit
from runtime.engines.base import EngineCannotServe
from runtime.engines.reference import ReferenceEngine, run_worker
from runtime.engines.reference_open import open_model, open_tokenizer
from runtime.membership import Membership
from runtime.models.registry import TINY_SEED, TINY_SHAPE, SeededWeights, hf_tensor_shapes


def _checkpoint(root: Path, *, drop: tuple[str, ...] = (), weights: bool = True, tokenizer: bool = True) -> Path:
    """The tiny model as a checkpoint directory (config.json, model.safetensors, tokenizer.json)
    without the tensors named in `drop`."""
    root.mkdir()
    (root / "config.json").write_text(json.dumps({"model_type": "llama", **TINY_SHAPE.to_hf_config()}))
    if weights:
        seeded = SeededWeights(TINY_SHAPE, TINY_SEED)
        save_file({k: seeded.get(k) for k in hf_tensor_shapes(TINY_SHAPE) if k not in drop}, root / "model.safetensors")
    if tokenizer:
        vocab = {"<unk>": 0, **{f"t{i}": i for i in range(1, TINY_SHAPE.vocab_size)}}
        tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        tok.save(str(root / "tokenizer.json"))
    return root


def _membership(rank: int = 0, world_size: int = 1) -> Membership:
    # No process group is formed in these tests: a port nobody listens on shows it.
    return Membership(unit_id="u", revision="1", rank=rank, world_size=world_size, dist_host="127.0.0.1", dist_port=9)


def _refusal(model: Path, *, world_size: int = 1) -> EngineCannotServe:
    """What the leader's engine raises from start()."""
    engine = ReferenceEngine(_membership(world_size=world_size), model=str(model), start_timeout_s=1.0)
    with pytest.raises(EngineCannotServe) as e:
        asyncio.run(engine.start())
    assert "\n" not in str(e.value)  # the node logs it as one line
    return e.value


def test_a_complete_checkpoint_opens_with_its_layout_and_tokenizer(tmp_path):
    model = str(_checkpoint(tmp_path / "ckpt"))
    opened = open_model(model, 2, prefill="pipeline", decode="tensor")
    assert opened.plan.world_size == 2 and opened.source.weights.keys() == set(hf_tensor_shapes(TINY_SHAPE))
    assert open_tokenizer(model, opened.source).encode("t7 t9") == [7, 9]


def test_no_weights_stops_with_model_unreadable_naming_the_directory_and_the_fix(tmp_path):
    model = _checkpoint(tmp_path / "ckpt", weights=False)
    e = _refusal(model)
    assert e.exit_code == node_exit.MODEL_UNREADABLE
    assert f"{model} has no *.safetensors files" in str(e)
    assert f"fix the checkpoint directory ({contract.ENV_MODEL}: config.json, *.safetensors, tokenizer.json)" in str(e)


def test_a_config_json_that_is_not_json_stops_with_model_unreadable(tmp_path):
    model = _checkpoint(tmp_path / "ckpt")
    (model / "config.json").write_text("{not json")
    e = _refusal(model)
    assert e.exit_code == node_exit.MODEL_UNREADABLE and "Expecting property name" in str(e)


def test_a_directory_without_config_json_stops_with_model_unreadable(tmp_path):
    model = _checkpoint(tmp_path / "ckpt")
    (model / "config.json").unlink()
    e = _refusal(model)
    assert e.exit_code == node_exit.MODEL_UNREADABLE and f"{model} has no config.json" in str(e)


def test_weights_missing_tensors_the_config_needs_stop_before_any_is_loaded(tmp_path):
    gone = (
        "model.layers.3.mlp.down_proj.weight",
        "model.norm.weight",
        "lm_head.weight",
        "model.layers.0.mlp.up_proj.weight",
    )
    e = _refusal(_checkpoint(tmp_path / "ckpt", drop=gone))
    assert e.exit_code == node_exit.MODEL_UNREADABLE
    # The first three in name order, and how many more.
    assert (
        "its *.safetensors lack 4 tensor(s) its config.json needs: lm_head.weight, "
        "model.layers.0.mlp.up_proj.weight, model.layers.3.mlp.down_proj.weight and 1 more"
    ) in str(e)


def test_a_weights_file_that_is_not_safetensors_stops_with_model_unreadable(tmp_path):
    model = _checkpoint(tmp_path / "ckpt")
    (model / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{broken}")
    assert _refusal(model).exit_code == node_exit.MODEL_UNREADABLE


def test_a_tokenizer_that_does_not_load_stops_with_model_unreadable(tmp_path):
    model = _checkpoint(tmp_path / "ckpt")
    (model / "tokenizer.json").write_text('{"model": "not a tokenizer"}')
    e = _refusal(model)
    assert e.exit_code == node_exit.MODEL_UNREADABLE and "its tokenizer does not load" in str(e)


def test_more_nodes_than_layers_is_a_refused_layout_on_leader_and_follower_alike(tmp_path):
    model = _checkpoint(tmp_path / "ckpt")
    e = _refusal(model, world_size=8)
    assert e.exit_code == node_exit.LAYOUT_REFUSED
    assert f"{contract.ENV_NODES_PER_UNIT}=8 cannot serve {model}" in str(e) and "4 layers" in str(e)
    # A follower refuses before it waits for the unit's store (start_timeout_s would otherwise pass).
    with pytest.raises(EngineCannotServe) as f:
        run_worker(_membership(rank=3, world_size=8), model=str(model), start_timeout_s=600.0)
    assert f.value.exit_code == node_exit.LAYOUT_REFUSED


def test_a_builtin_model_is_not_judged_as_a_checkpoint_directory():
    # `tiny` has no files: its weights are drawn, so there is nothing to check them against.
    opened = open_model("tiny", 1, prefill="pipeline", decode="tensor")
    assert open_tokenizer("tiny", opened.source).eos_token_id is not None
