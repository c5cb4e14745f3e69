"""`flotilla publish` against moto's S3, read back by the node's own start-up (runtime/engines/neuron/
prepare.py): what the operator's command uploads is what a neuron rank plans from and fetches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from contract.manifest import MANIFEST_NAME

ROOT = Path(__file__).resolve().parents[2]
BUCKET = "my-models"
URI = f"s3://{BUCKET}/llama-3.1-8b-instruct/"
# meta-llama/Llama-3.1-8B-Instruct config.json (the numbers the planner reads)
LLAMA_31_8B = {
    "architectures": ["LlamaForCausalLM"],
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "torch_dtype": "bfloat16",
}


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    src = tmp_path / "Llama-3.1-8B-Instruct"
    (src / "original").mkdir(parents=True)
    (src / "config.json").write_text(json.dumps(LLAMA_31_8B))
    (src / "model-00001-of-00002.safetensors").write_bytes(os.urandom(3000))
    (src / "original" / "params.json").write_text("{}")
    return src


@pytest.fixture
def bucket(s3):
    s3.create_bucket(Bucket=BUCKET)
    return s3


def test_what_publish_uploads_is_what_a_neuron_rank_plans_from_and_fetches(bucket, checkpoint, tmp_path, run_cli_err):
    from runtime.engines.neuron import NeuronOptions
    from runtime.engines.neuron.prepare import prepare_rank
    from runtime.membership import Membership

    code, out, err = run_cli_err("publish", "--source", str(checkpoint), "--uri", URI, "--yes")
    assert code == 0, err
    digest = out.strip()
    assert len(digest) == 64 and "published s3://my-models/llama-3.1-8b-instruct/" in " ".join(err.split())
    membership = Membership(unit_id="u", revision="r", rank=0, world_size=1, dist_host="10.1.0.10", dist_port=29500)
    prepared = prepare_rank(
        membership,
        model_uri=URI,
        model_dir=tmp_path / "node" / "model",
        instance_type="trn1.32xlarge",
        options=NeuronOptions(compiled_artifacts_dir=str(tmp_path / "node" / "compiled")),
        s3=bucket,
        neuron_sdk_version="2.28.0",  # the image sets it (Dockerfile.neuron)
    )
    assert prepared.model_manifest.digest == digest
    for rel in ("config.json", "model-00001-of-00002.safetensors", "original/params.json"):
        assert (tmp_path / "node" / "model" / rel).read_bytes() == (checkpoint / rel).read_bytes()


def test_publish_again_of_the_same_set_uploads_nothing_and_another_set_on_that_prefix_is_refused(
    bucket, checkpoint, run_cli_err
):
    code, first, _ = run_cli_err("publish", "--source", str(checkpoint), "--uri", URI, "--yes")
    assert code == 0
    bucket.delete_object(Bucket=BUCKET, Key="llama-3.1-8b-instruct/config.json")  # would come back on an upload
    code, again, err = run_cli_err("publish", "--source", str(checkpoint), "--uri", URI, "--yes")
    assert code == 0 and again == first and "nothing to upload" in " ".join(err.split())
    assert "Contents" not in bucket.list_objects_v2(Bucket=BUCKET, Prefix="llama-3.1-8b-instruct/config.json")
    (checkpoint / "model-00001-of-00002.safetensors").write_bytes(b"fine-tuned")
    code, out, err = run_cli_err("publish", "--source", str(checkpoint), "--uri", URI, "--yes")
    assert code == 1 and out == ""
    assert "lists another artifact set" in " ".join(err.split()) and "publish to a new prefix" in " ".join(err.split())


def test_publish_without_a_config_json_or_without_confirmation_uploads_nothing(bucket, checkpoint, run_cli_err):
    (checkpoint / "config.json").unlink()
    code, _, err = run_cli_err("publish", "--source", str(checkpoint), "--uri", URI, "--yes")
    assert code == 2 and f"--source={checkpoint} has no config.json" in " ".join(err.split())
    (checkpoint / "config.json").write_text(json.dumps(LLAMA_31_8B))
    code, _, err = run_cli_err("publish", "--source", str(checkpoint), "--uri", URI)  # stdin is not a terminal
    assert code == 1 and "refusing to upload 3 file(s)" in " ".join(err.split())
    code, _, _ = run_cli_err("publish", "--source", str(checkpoint), "--uri", URI, "--dry-run")
    assert code == 0
    assert "Contents" not in bucket.list_objects_v2(Bucket=BUCKET)
    code, _, err = run_cli_err("publish", "--source", str(checkpoint), "--uri", f"s3://{BUCKET}", "--yes")
    assert code == 2 and "names no prefix" in err


def test_publish_json_names_the_set_and_the_manifest_goes_up_last(bucket, checkpoint, run_cli_err, monkeypatch):
    order: list[str] = []
    put = bucket.put_object  # upload_file sends a small file as one PutObject too
    monkeypatch.setattr(bucket, "put_object", lambda **kw: (order.append(kw["Key"]), put(**kw))[1])
    code, out, _ = run_cli_err("publish", "--source", str(checkpoint), "--uri", URI.rstrip("/"), "--yes", "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["uri"] == URI and doc["files"] == 3 and len(doc["digest"]) == 64
    assert order[-1] == f"llama-3.1-8b-instruct/{MANIFEST_NAME}" and len(order) == 4


def test_the_publish_command_imports_neither_torch_nor_the_runtime(tmp_path):
    # An operator's machine has the `ops` extra only: the command must run without torch or runtime/.
    code = (
        "import sys; from ops.cli import build_parser; "
        "a = build_parser().parse_args(['publish', '--source', 'x', '--uri', 's3://b/p/', '--dry-run']); "
        "import ops.commands.publish; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'runtime', 'aws_cdk', 'transformers')); "
        "print(','.join(bad)); sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"publish imports {proc.stdout.strip()} {proc.stderr[-500:]}"
