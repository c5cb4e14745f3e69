"""A neuron rank's start-up against S3 (moto): plan from config.json, fetch weights, compile cache."""

from __future__ import annotations

import os

import pytest
from s3_fixture import BUCKET, URI

from runtime.artifacts import publish


def test_prepare_rank_plans_from_config_then_fetches_and_a_restart_hits_the_compile_cache(s3, tmp_path, checkpoint):
    from runtime.engines.neuron import NeuronOptions
    from runtime.engines.neuron.prepare import prepare_rank, store_compiled
    from runtime.membership import Membership

    model_src = checkpoint("llama-3.1-70b")
    (model_src / "model.safetensors").write_bytes(os.urandom(2000))
    publish(model_src, URI, s3=s3)
    membership = Membership(unit_id="u", revision="r", rank=1, world_size=2, dist_host="10.1.0.10", dist_port=29500)
    cache_uri = f"s3://{BUCKET}/compiled"

    def prepare(node: str):
        options = NeuronOptions(compiled_artifacts_dir=str(tmp_path / node / "compiled"))
        return prepare_rank(
            membership,
            model_uri=URI,
            model_dir=tmp_path / node / "model",
            instance_type="trn1.32xlarge",
            options=options,
            s3=s3,
            compile_cache_uri=cache_uri,
            neuron_sdk_version="2.31.1",
        )

    first = prepare("node-a")
    assert first.plan.start_rank_id == 32 and first.compile_cache_hit is False
    assert (tmp_path / "node-a" / "model" / "model.safetensors").read_bytes() == (
        model_src / "model.safetensors"
    ).read_bytes()
    compiled = tmp_path / "node-a" / "compiled"  # what NxD Inference would have written
    compiled.mkdir(parents=True)
    (compiled / "model.pt").write_bytes(b"neff")
    assert store_compiled(first, compile_cache_uri=cache_uri, compiled_dir=compiled, s3=s3)

    restarted = prepare("node-b")
    assert restarted.compile_key == first.compile_key and restarted.compile_cache_hit is True
    assert (tmp_path / "node-b" / "compiled" / "model.pt").read_bytes() == b"neff"
    assert not store_compiled(restarted, compile_cache_uri=cache_uri, compiled_dir=compiled, s3=s3)


def test_prepare_rank_refuses_an_impossible_layout_before_fetching_weights(s3, tmp_path, checkpoint):
    from contract.layout import LayoutError
    from runtime.engines.neuron import NeuronOptions
    from runtime.engines.neuron.prepare import prepare_rank
    from runtime.membership import Membership

    model_src = checkpoint("llama-3.1-70b")
    (model_src / "model.safetensors").write_bytes(os.urandom(2000))
    publish(model_src, URI, s3=s3)
    membership = Membership(unit_id="u", revision="r", rank=0, world_size=2, dist_host="10.1.0.10", dist_port=29500)
    # A multi-node unit runs tensor parallelism only: no attention-dp degree.
    with pytest.raises(LayoutError, match=r"FLOTILLA_NEURON_ATTENTION_DP_DEGREE=2 applies to single-node units only"):
        prepare_rank(
            membership,
            model_uri=URI,
            model_dir=tmp_path / "model",
            instance_type="trn1.32xlarge",
            options=NeuronOptions(cp_degree=1, attention_dp_degree=2),
            s3=s3,
        )
    assert not (tmp_path / "model").exists()


def test_prepare_rank_reports_each_fetch_phase_with_bytes_on_disk_of_the_sets_total(s3, tmp_path, checkpoint):
    from contract.ready import LoadPhase
    from runtime.engines.neuron import NeuronOptions
    from runtime.engines.neuron.loading import LoadTracker
    from runtime.engines.neuron.prepare import prepare_rank, store_compiled
    from runtime.membership import Membership

    model_src = checkpoint("llama-3.1-70b")
    (model_src / "model-00001-of-00002.safetensors").write_bytes(os.urandom(3000))
    (model_src / "model-00002-of-00002.safetensors").write_bytes(os.urandom(5000))
    publish(model_src, URI, s3=s3)
    model_bytes = sum(f.stat().st_size for f in model_src.rglob("*") if f.is_file() and f.name != "manifest.json")
    membership = Membership(unit_id="u", revision="r", rank=1, world_size=2, dist_host="10.1.0.10", dist_port=29500)
    cache_uri = f"s3://{BUCKET}/compiled"

    def prepare(node: str) -> tuple:
        reports: list = []
        prepared = prepare_rank(
            membership,
            model_uri=URI,
            model_dir=tmp_path / node / "model",
            instance_type="trn1.32xlarge",
            options=NeuronOptions(compiled_artifacts_dir=str(tmp_path / node / "compiled")),
            s3=s3,
            compile_cache_uri=cache_uri,
            neuron_sdk_version="2.28.0",
            tracker=LoadTracker(reports.append, every_s=0.0),
        )
        return prepared, reports

    first, reports = prepare("node-a")
    weights = [r for r in reports if r.phase is LoadPhase.FETCH_MODEL]
    assert weights[0].done_bytes == 0 and {r.total_bytes for r in weights} == {model_bytes}
    done = [r.done_bytes for r in weights]
    assert done == sorted(done) and done[-1] == model_bytes and len(set(done)) > 2  # moved file by file
    assert reports[-1].phase is LoadPhase.FETCH_COMPILED and reports[-1].total_bytes == 0  # a miss: nothing to fetch

    compiled = tmp_path / "node-a" / "compiled"
    compiled.mkdir(parents=True)
    (compiled / "model.pt").write_bytes(os.urandom(4096))
    store_compiled(first, compile_cache_uri=cache_uri, compiled_dir=compiled, s3=s3)
    _, reports = prepare("node-b")
    cached = [r for r in reports if r.phase is LoadPhase.FETCH_COMPILED]
    assert cached[-1].done_bytes == cached[-1].total_bytes == 4096
