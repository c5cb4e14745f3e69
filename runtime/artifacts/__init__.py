"""Model artifacts on S3: publish a checkpoint with a checksum manifest, fetch it to a node with
resume and verification, and cache NxD Inference's compiled artifacts so restarts skip compiling.
"""

from runtime.artifacts.compile_cache import CompileCache, compile_cache_key
from runtime.artifacts.fetch import ArtifactError, ChecksumMismatch, fetch
from runtime.artifacts.manifest import (
    MANIFEST_NAME,
    FileEntry,
    Manifest,
    ManifestError,
    build_manifest,
    parse_s3_uri,
    publish,
)

__all__ = [
    "MANIFEST_NAME",
    "ArtifactError",
    "ChecksumMismatch",
    "CompileCache",
    "FileEntry",
    "Manifest",
    "ManifestError",
    "build_manifest",
    "compile_cache_key",
    "fetch",
    "parse_s3_uri",
    "publish",
]
