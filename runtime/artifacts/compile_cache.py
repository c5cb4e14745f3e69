"""S3 cache of NxD Inference's compiled artifacts, so a restarted node loads instead of compiling.

The key is a hash of what decides the compiled graph: the model (its manifest digest), the exact
NxD Inference config a rank passes (which includes its start_rank_id: the vLLM Neuron plugin hashes
the same config for its own local cache), and the Neuron SDK version that compiled it.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Mapping

from runtime.artifacts.fetch import ArtifactError, OnBytes, fetch, read_manifest
from runtime.artifacts.manifest import Manifest, parse_s3_uri, publish

log = logging.getLogger("flotilla.artifacts")


def compile_cache_key(*, model_digest: str, nxdi_config: Mapping[str, object], neuron_sdk_version: str) -> str:
    if not model_digest or not neuron_sdk_version:
        raise ValueError(
            "compile cache key needs the model digest and the Neuron SDK version; "
            "set FLOTILLA_NEURON_SDK_VERSION (Dockerfile.neuron does)"
        )
    doc = {"model": model_digest, "nxdi_config": dict(nxdi_config), "neuron_sdk": neuron_sdk_version}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


class CompileCache:
    """Compiled artifacts for key K live under `<uri>/<K>/` as a published artifact set."""

    def __init__(self, *, uri: str, s3) -> None:
        parse_s3_uri(uri)  # fail at construction on a malformed URI
        self._uri = uri.rstrip("/")
        self._s3 = s3

    def location(self, key: str) -> str:
        return f"{self._uri}/{key}"

    def fetch(self, key: str, dest: str | Path, *, on_bytes: OnBytes | None = None) -> bool:
        """True and `dest` filled when the cache holds `key`; False on a miss (then compile)."""
        try:
            manifest = read_manifest(self.location(key), s3=self._s3)
        except ArtifactError:
            log.info("compile cache miss %s: this node compiles, then stores the result", key)
            return False
        fetch(self.location(key), dest, s3=self._s3, manifest=manifest, on_bytes=on_bytes)
        log.info("compile cache hit %s: loaded into %s, no compile needed", key, dest)
        return True

    def store(self, key: str, compiled_dir: str | Path) -> Manifest:
        """Upload after a successful compile; idempotent, so concurrent units may both store."""
        manifest = publish(compiled_dir, self.location(key), s3=self._s3)
        log.info("compile cache stored %s (%d files)", key, len(manifest.files))
        return manifest
