"""EAGLE speculation on a neuron unit: the flag vLLM is given, what NxD Inference compiles for it, the
draft published and verified in the model's own manifest, and the multi-node refusal."""

from __future__ import annotations

import json
import os

import pytest
from s3_fixture import URI

from contract.layout import LayoutError
from contract.llama import LlamaShape
from contract.speculation import Speculation
from runtime.artifacts import publish
from runtime.artifacts.fetch import ChecksumMismatch, fetch

EAGLE_5 = Speculation(method="eagle", num_speculative_tokens=5, draft="eagle-draft")


def _plan(tmp_path, nodes: int, speculation):
    from runtime.engines.neuron import NeuronOptions
    from runtime.engines.neuron.launch import plan_member
    from runtime.membership import Membership

    raw = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "num_hidden_layers": 32,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "vocab_size": 128256,
        "max_position_embeddings": 8192,
    }
    shape = LlamaShape.from_config(raw, source="config.json")
    m = Membership(unit_id="u", revision="r", rank=0, world_size=nodes, dist_host="10.0.0.1", dist_port=29500)
    options = NeuronOptions(sampling="device", speculation=speculation)
    return plan_member(
        m, instance_type="trn1.32xlarge", model=shape, model_dir=str(tmp_path / "model"), options=options
    )


def test_one_node_passes_the_eagle_draft_to_vllm_and_compiles_fused_speculation(tmp_path):
    plan = _plan(tmp_path, 1, EAGLE_5)
    argv = list(plan.command)
    config = json.loads(argv[argv.index("--speculative-config") + 1])
    assert config == {"method": "eagle", "model": str(tmp_path / "model" / "eagle-draft"), "num_speculative_tokens": 5}
    # the compile-cache key changes with it (the plugin sets these: neuronx_distributed_model_loader.py:785-791)
    assert plan.nxdi_config["enable_fused_speculation"] is True and plan.nxdi_config["speculation_length"] == 5
    plain = _plan(tmp_path, 1, Speculation())
    assert "--speculative-config" not in plain.command and "speculation_length" not in plain.nxdi_config


def test_a_multi_node_unit_refuses_speculation_naming_why(tmp_path):
    with pytest.raises(LayoutError, match="one-node units only.*one token per step"):
        _plan(tmp_path, 2, EAGLE_5)


def _model_with_draft(checkpoint):
    src = checkpoint("llama-3.1-70b")
    (src / "model.safetensors").write_bytes(os.urandom(2000))
    draft = src / "eagle-draft"
    draft.mkdir()
    (draft / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 1}))
    (draft / "model.safetensors").write_bytes(os.urandom(500))
    return src


def test_the_draft_is_published_and_verified_by_the_models_manifest(s3, tmp_path, checkpoint):
    src = _model_with_draft(checkpoint)
    manifest = publish(src, URI, s3=s3)
    assert {"eagle-draft/config.json", "eagle-draft/model.safetensors"} <= {f.path for f in manifest.files}
    fetch(URI, tmp_path / "a", s3=s3)
    assert (tmp_path / "a" / "eagle-draft" / "model.safetensors").read_bytes() == (
        src / "eagle-draft" / "model.safetensors"
    ).read_bytes()
    bucket, key = URI[len("s3://") :].split("/", 1)
    s3.put_object(Bucket=bucket, Key=f"{key.rstrip('/')}/eagle-draft/model.safetensors", Body=os.urandom(500))
    with pytest.raises(ChecksumMismatch, match="eagle-draft/model.safetensors"):
        fetch(URI, tmp_path / "b", s3=s3)


def test_a_rank_refuses_a_draft_missing_from_the_manifest_before_fetching_weights(s3, tmp_path, checkpoint):
    from runtime.engines.neuron import NeuronOptions
    from runtime.engines.neuron.prepare import prepare_rank
    from runtime.membership import Membership

    src = checkpoint("llama-3.1-70b")
    (src / "model.safetensors").write_bytes(os.urandom(2000))
    publish(src, URI, s3=s3)
    m = Membership(unit_id="u", revision="r", rank=0, world_size=1, dist_host="10.0.0.1", dist_port=29500)
    options = NeuronOptions(sampling="device", speculation=EAGLE_5)
    with pytest.raises(ValueError, match="not in the published model's manifest.*publish"):
        prepare_rank(m, model_uri=URI, model_dir=tmp_path / "m", instance_type="trn1.32xlarge", options=options, s3=s3)
    assert not (tmp_path / "m" / "model.safetensors").exists()


def test_a_rank_counts_the_drafts_own_config_in_the_memory_check_before_fetching_weights(s3, tmp_path, checkpoint):
    from contract.layout import LayoutError, check_layout
    from contract.llama import load_config_json
    from runtime.engines.neuron import NeuronOptions
    from runtime.engines.neuron.prepare import prepare_rank
    from runtime.membership import Membership

    src = checkpoint("llama-3.1-70b")
    (src / "model.safetensors").write_bytes(os.urandom(2000))
    shape = load_config_json(src / "config.json")

    def fits(batch: int) -> bool:
        try:
            check_layout(shape, instance_type="trn1.32xlarge", nodes=1, batch_size=batch, speculation="eagle")
        except LayoutError:
            return False
        return True

    edge = 8
    while fits(edge + 8):  # the largest batch that holds the model and a one-layer draft (synth's estimate)
        edge += 8
    draft = src / "eagle-draft"
    draft.mkdir()
    deep = dict(json.loads((src / "config.json").read_text()), num_hidden_layers=20)  # a draft of 20 layers
    (draft / "config.json").write_text(json.dumps(deep))
    (draft / "model.safetensors").write_bytes(os.urandom(500))
    publish(src, URI, s3=s3)
    m = Membership(unit_id="u", revision="r", rank=0, world_size=1, dist_host="10.0.0.1", dist_port=29500)
    options = NeuronOptions(sampling="device", speculation=EAGLE_5, batch_size=edge)
    with pytest.raises(LayoutError, match=r"^FLOTILLA_SPECULATIVE_METHOD=eagle cannot hold .*EAGLE draft"):
        prepare_rank(m, model_uri=URI, model_dir=tmp_path / "m", instance_type="trn1.32xlarge", options=options, s3=s3)
    assert not (tmp_path / "m" / "model.safetensors").exists()
    # the draft the estimate assumes (one layer of the model's shape) fits the same batch
    (draft / "config.json").write_text(json.dumps(dict(deep, num_hidden_layers=1)))
    publish(src, URI, s3=s3)
    ready = prepare_rank(
        m,
        model_uri=URI,
        model_dir=tmp_path / "m",
        instance_type="trn1.32xlarge",
        options=options,
        s3=s3,
        neuron_sdk_version="2.28.0",
    )
    assert (tmp_path / "m" / "eagle-draft" / "config.json").exists() and ready.plan.nxdi_config["batch_size"] == edge
