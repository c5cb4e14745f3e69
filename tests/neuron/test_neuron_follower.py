"""A follower node's formation (run_follower) against moto S3: it compiles its own rank range once,
stores it in the compile cache under its own key, and a later start of that rank loads it without
compiling. The worker is spmd.py's load half over the NxD Inference stand-in (loaded_worker.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from llama_shapes import LLAMA_31_405B
from s3_fixture import BUCKET, URI
from standin_model import NXDI_2_28, make_checkpoint

from contract.ready import LoadPhase
from runtime.artifacts import publish
from runtime.engines.neuron.engine import NeuronEngineSettings, run_follower
from runtime.engines.neuron.launch import NeuronOptions
from runtime.membership import Membership

HERE = Path(__file__).resolve().parent
CACHE_URI = f"s3://{BUCKET}/compile-cache"


def _follow(tmp_path: Path, s3, node: str) -> list[LoadPhase]:
    """One formation of rank 1 of a 2 x trn1.32xlarge unit on a fresh disk; the phases it reported.
    Every line of the worker's saying it hears the leader reaches the caller's `heard` with its count."""
    settings = NeuronEngineSettings(
        model_uri=URI,
        model_dir=str(tmp_path / node / "model"),
        instance_type="trn1.32xlarge",
        options=NeuronOptions(seq_len=32, batch_size=2, compiled_artifacts_dir=str(tmp_path / node / "compiled")),
        compile_cache_uri=CACHE_URI,
        launcher=f"{sys.executable} {HERE / 'loaded_worker.py'}",
    )
    membership = Membership(unit_id="u", revision="r", rank=1, world_size=2, dist_host="127.0.0.1", dist_port=29500)
    reports: list = []
    heard: list[int] = []
    run_follower(membership, settings=settings, s3=s3, report=reports.append, heard=heard.append)
    assert heard == [1, 2, 3]  # each line of the worker's (FOLLOWING_LINES, below), a broadcast more each
    return [r.phase for r in reports]


def test_a_follower_stores_what_it_compiled_and_its_next_start_only_loads(s3, tmp_path, monkeypatch):
    publish(make_checkpoint(tmp_path / "published", LLAMA_31_405B), URI, s3=s3)
    monkeypatch.setenv("FLOTILLA_NEURON_SDK_VERSION", "2.28.0")
    monkeypatch.setenv("FOLLOWING_LINES", "3")  # what the worker writes after its join (loaded_worker.py)
    # tp_degree 64 runs as 4 partitions of the tiny model, 2 on this node (ranks 32-63).
    monkeypatch.setenv("STANDIN_NXDI_CORES_PER_PARTITION", "16")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([NXDI_2_28, str(HERE), str(HERE.parents[1])]))

    first = _follow(tmp_path, s3, "node-a")
    assert LoadPhase.COMPILE in first and first[-1] is LoadPhase.JOIN
    stored = s3.list_objects_v2(Bucket=BUCKET, Prefix="compile-cache/").get("Contents", [])
    assert any(o["Key"].endswith("/model.pt") for o in stored), stored

    # A replacement node of the same rank (empty disk): the cache holds its ranks, so no compile.
    again = _follow(tmp_path, s3, "node-b")
    assert LoadPhase.FETCH_COMPILED in again and LoadPhase.LOAD in again
    assert LoadPhase.COMPILE not in again, again
