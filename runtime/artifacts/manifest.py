"""The artifact manifest's format lives in contract/manifest.py (the operator's CLI publishes and
checks it without the runtime); these names stay importable from here for the runtime's own code."""

from contract.manifest import (
    FORMAT,
    MANIFEST_NAME,
    PARTIAL_DIR,
    FileEntry,
    Manifest,
    ManifestError,
    build_manifest,
    parse_s3_uri,
    publish,
    sha256_file,
)

__all__ = [
    "FORMAT",
    "MANIFEST_NAME",
    "PARTIAL_DIR",
    "FileEntry",
    "Manifest",
    "ManifestError",
    "build_manifest",
    "parse_s3_uri",
    "publish",
    "sha256_file",
]
