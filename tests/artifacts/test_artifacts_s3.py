"""Model artifacts on S3 (moto): publish, fetch with verification, resume, and the compile cache."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re

import pytest
from s3_fixture import BUCKET, URI

from runtime.artifacts import (
    MANIFEST_NAME,
    ArtifactError,
    ChecksumMismatch,
    CompileCache,
    Manifest,
    build_manifest,
    compile_cache_key,
    fetch,
    publish,
)
from runtime.artifacts.cli import run_artifacts
from runtime.artifacts.manifest import ManifestError


class RecordingS3:
    """Passes calls to the moto client and records every get_object's arguments."""

    def __init__(self, client):
        self._client, self.gets = client, []

    def get_object(self, **kwargs):
        self.gets.append(kwargs)
        return self._client.get_object(**kwargs)

    def __getattr__(self, name):
        return getattr(self._client, name)


@pytest.fixture
def source(tmp_path):
    root = tmp_path / "src"
    (root / "shards").mkdir(parents=True)
    (root / "config.json").write_text(json.dumps({"num_hidden_layers": 2}))
    (root / "shards" / "model-00001.safetensors").write_bytes(os.urandom(300_000))
    (root / "tokenizer.json").write_bytes(os.urandom(1000))
    return root


def _same_tree(a, b):
    files = sorted(p.relative_to(a).as_posix() for p in a.rglob("*") if p.is_file())
    return files == sorted(
        p.relative_to(b).as_posix() for p in b.rglob("*") if p.is_file() and p.name != MANIFEST_NAME
    ) and all((a / f).read_bytes() == (b / f).read_bytes() for f in files)


def test_manifest_lists_every_file_with_its_size_and_sha256(source):
    manifest = build_manifest(source)
    entry = {f.path: f for f in manifest.files}["shards/model-00001.safetensors"]
    data = (source / "shards" / "model-00001.safetensors").read_bytes()
    assert (entry.size, entry.sha256) == (len(data), hashlib.sha256(data).hexdigest())
    assert [f.path for f in manifest.files] == ["config.json", "shards/model-00001.safetensors", "tokenizer.json"]
    assert Manifest.from_json(manifest.to_json(), source="x") == manifest


def test_fetch_downloads_verifies_and_logs_progress(s3, source, tmp_path, caplog):
    published = publish(source, URI, s3=s3)
    dest = tmp_path / "dest"
    with caplog.at_level(logging.INFO, logger="flotilla.artifacts"):
        got = fetch(URI, dest, s3=s3, chunk_size=16_384)
    assert got.digest == published.digest
    assert _same_tree(source, dest)
    assert (dest / MANIFEST_NAME).read_bytes() == published.to_json()
    assert not any((dest / ".partial").glob("**/*.part"))
    messages = "\n".join(r.getMessage() for r in caplog.records)
    assert re.search(r"shards/model-00001.safetensors: \d+/300000 bytes \(\d+%\)", messages)
    assert "progress 301024/301024 bytes (100%)" in messages


def test_a_corrupted_object_fails_the_checksum_and_leaves_no_file_behind(s3, source, tmp_path):
    publish(source, URI, s3=s3)
    # Same size, different bytes: only the checksum can catch it.
    s3.put_object(Bucket=BUCKET, Key="llama/v1/tokenizer.json", Body=os.urandom(1000))
    dest = tmp_path / "dest"
    with pytest.raises(
        ChecksumMismatch,
        match=r"tokenizer.json: downloaded 1000 bytes with "
        r"sha256 .* the download was discarded.*republish",
    ):
        fetch(URI, dest, s3=s3)
    assert not (dest / "tokenizer.json").exists()
    assert not (dest / ".partial" / "tokenizer.json.part").exists()
    assert not (dest / MANIFEST_NAME).exists()


def test_an_interrupted_download_resumes_with_a_range_get_from_the_partial_size(s3, source, tmp_path):
    publish(source, URI, s3=s3)
    dest = tmp_path / "dest"
    data = (source / "shards" / "model-00001.safetensors").read_bytes()
    part = dest / ".partial" / "shards" / "model-00001.safetensors.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(data[:120_000])
    recording = RecordingS3(s3)
    fetch(URI, dest, s3=recording)
    shard_gets = [g for g in recording.gets if g["Key"].endswith(".safetensors")]
    assert shard_gets == [
        {"Bucket": BUCKET, "Key": "llama/v1/shards/model-00001.safetensors", "Range": "bytes=120000-"}
    ]
    assert (dest / "shards" / "model-00001.safetensors").read_bytes() == data


def test_progress_counts_bytes_on_disk_including_a_resumed_partial_and_ends_at_the_sets_total(s3, source, tmp_path):
    publish(source, URI, s3=s3)
    total = sum(f.stat().st_size for f in source.rglob("*") if f.is_file())
    dest = tmp_path / "dest"
    part = dest / ".partial" / "shards" / "model-00001.safetensors.part"
    part.parent.mkdir(parents=True)
    part.write_bytes((source / "shards" / "model-00001.safetensors").read_bytes()[:120_000])
    seen: list[tuple[int, int]] = []
    fetch(URI, dest, s3=s3, chunk_size=50_000, on_bytes=lambda done, of: seen.append((done, of)))
    assert {of for _, of in seen} == {total}
    done = [d for d, _ in seen]
    assert done[0] == 0 and done == sorted(done) and done[-1] == total
    # The shard's chunks are counted from the partial's 120,000 bytes on: 170,000 then 220,000 ...
    assert any(d - before == 170_000 for d in done for before in done if before < d)


def test_a_corrupt_partial_is_discarded_and_the_next_fetch_succeeds(s3, source, tmp_path):
    publish(source, URI, s3=s3)
    dest = tmp_path / "dest"
    part = dest / ".partial" / "shards" / "model-00001.safetensors.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(b"\0" * 1000)
    with pytest.raises(ChecksumMismatch):
        fetch(URI, dest, s3=s3)
    assert not part.exists()
    fetch(URI, dest, s3=s3)
    assert _same_tree(source, dest)


def test_files_already_present_and_verified_are_not_downloaded_again(s3, source, tmp_path):
    publish(source, URI, s3=s3)
    dest = tmp_path / "dest"
    fetch(URI, dest, s3=s3)
    recording = RecordingS3(s3)
    fetch(URI, dest, s3=recording)
    assert [g["Key"] for g in recording.gets] == [f"llama/v1/{MANIFEST_NAME}"]


def test_fetching_where_nothing_was_published_says_how_to_publish(s3, tmp_path):
    with pytest.raises(
        ArtifactError,
        match=r"flotilla-manifest.json not found.*"
        r"python -m runtime artifacts publish",
    ):
        fetch(URI, tmp_path / "dest", s3=s3)


def test_an_object_missing_from_the_bucket_is_named_before_any_download(s3, source, tmp_path):
    publish(source, URI, s3=s3)
    s3.delete_object(Bucket=BUCKET, Key="llama/v1/config.json")
    with pytest.raises(
        ArtifactError,
        match=r"s3://flotilla-models/llama/v1/config.json is "
        r"listed in the manifest but missing",
    ):
        fetch(URI, tmp_path / "dest", s3=s3)


@pytest.mark.parametrize("uri", ["llama/v1", "s3://", "https://bucket/x"])
def test_malformed_s3_uris_are_refused(s3, tmp_path, uri):
    with pytest.raises(ManifestError, match=r"use s3://bucket/prefix"):
        fetch(uri, tmp_path / "dest", s3=s3)


def test_compile_cache_miss_then_store_then_hit_on_a_restarted_node(s3, tmp_path):
    compiled = tmp_path / "compiled"
    compiled.mkdir()
    (compiled / "model.pt").write_bytes(os.urandom(5000))
    (compiled / "neuron_config.json").write_text("{}")
    cache = CompileCache(uri=f"s3://{BUCKET}/compiled", s3=s3)
    key = compile_cache_key(model_digest="a" * 64, nxdi_config={"tp_degree": 64}, neuron_sdk_version="2.31.1")
    assert cache.fetch(key, tmp_path / "first-node") is False
    cache.store(key, compiled)
    restarted = tmp_path / "restarted-node"
    assert cache.fetch(key, restarted) is True
    assert _same_tree(compiled, restarted)


def test_compile_cache_key_changes_with_model_config_and_sdk_version():
    base = {
        "model_digest": "a" * 64,
        "nxdi_config": {"tp_degree": 64, "start_rank_id": 0},
        "neuron_sdk_version": "2.31.1",
    }
    keys = {
        compile_cache_key(**base),
        compile_cache_key(**{**base, "model_digest": "b" * 64}),
        compile_cache_key(**{**base, "nxdi_config": {"tp_degree": 64, "start_rank_id": 32}}),
        compile_cache_key(**{**base, "neuron_sdk_version": "2.32.0"}),
    }
    assert len(keys) == 4
    reordered = {"start_rank_id": 0, "tp_degree": 64}
    assert compile_cache_key(**{**base, "nxdi_config": reordered}) == compile_cache_key(**base)


def test_artifacts_cli_publishes_and_fetches_printing_the_digest(s3, source, tmp_path):
    import argparse

    from runtime.artifacts import cli as artifacts_cli

    parser = argparse.ArgumentParser()
    artifacts_cli.add_parser(parser.add_subparsers(dest="command", required=True))
    out = io.StringIO()
    assert (
        run_artifacts(
            parser.parse_args(["artifacts", "publish", "--source", str(source), "--uri", URI]),
            out=out,
            err=io.StringIO(),
            s3=s3,
        )
        == 0
    )
    digest = out.getvalue().strip()
    out = io.StringIO()
    assert (
        run_artifacts(
            parser.parse_args(["artifacts", "fetch", "--uri", URI, "--dest", str(tmp_path / "d")]),
            out=out,
            err=io.StringIO(),
            s3=s3,
        )
        == 0
    )
    assert out.getvalue().strip() == digest == build_manifest(source).digest
    err = io.StringIO()
    assert (
        run_artifacts(
            parser.parse_args(["artifacts", "fetch", "--uri", f"{URI}-missing", "--dest", str(tmp_path / "e")]),
            out=io.StringIO(),
            err=err,
            s3=s3,
        )
        == 2
    )
    assert err.getvalue().startswith("error: s3://flotilla-models/llama/v1-missing/")
