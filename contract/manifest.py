"""The manifest that says what a published artifact set is: every file's path, size and sha256.
Shared by the node that fetches a model (runtime/artifacts), the operator who publishes it and the
preflight that checks it (`flotilla publish`, `flotilla preflight`): standard library only.

Format (`flotilla-manifest.json` beside the files under the S3 prefix):
    {"format": 1, "files": [{"path": "config.json", "size": 654, "sha256": "<64 hex>"}, ...]}
Paths are relative, '/'-separated, sorted. The manifest is uploaded last, so a reader that finds
it can trust every file it lists is already in place. Its own sha256 is the set's digest.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

MANIFEST_NAME = "flotilla-manifest.json"
MODEL_CONFIG_NAME = "config.json"  # a model's shape: every node reads it from the published set
FORMAT = 1
PARTIAL_DIR = ".partial"  # in-progress downloads live here, never beside finished files
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
log = logging.getLogger("flotilla.artifacts")


class ManifestError(ValueError):
    """A manifest or S3 URI is malformed; the message names it and the fix."""


@dataclass(frozen=True)
class FileEntry:
    path: str
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    files: tuple[FileEntry, ...]

    def to_json(self) -> bytes:
        doc = {
            "format": FORMAT,
            "files": [
                {"path": f.path, "size": f.size, "sha256": f.sha256} for f in sorted(self.files, key=lambda f: f.path)
            ],
        }
        return (json.dumps(doc, sort_keys=True, indent=1) + "\n").encode()

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.to_json()).hexdigest()

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    @classmethod
    def from_json(cls, data: bytes, *, source: str) -> "Manifest":
        try:
            doc = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ManifestError(f"{source}: not valid JSON ({exc}); republish the artifacts") from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise ManifestError(
                f'{source}: expected an object with "format": {FORMAT}; republish with `flotilla publish`'
            )
        files = []
        for i, item in enumerate(doc.get("files") or []):
            try:
                entry = FileEntry(path=str(item["path"]), size=int(item["size"]), sha256=str(item["sha256"]))
            except (KeyError, TypeError, ValueError):
                raise ManifestError(f"{source}: files[{i}] needs path, size and sha256") from None
            _check_relative(entry.path, source)
            if entry.size < 0 or not _HEX64.match(entry.sha256):
                raise ManifestError(
                    f"{source}: files[{i}] ({entry.path}) has a bad size or sha256 (64 lowercase hex digits)"
                )
            files.append(entry)
        if not files:
            raise ManifestError(f"{source}: lists no files; publish a non-empty directory")
        return cls(files=tuple(files))


def _check_relative(path: str, source: str) -> None:
    p = PurePosixPath(path)
    if p.is_absolute() or ".." in p.parts or not p.parts or p.parts[0] == PARTIAL_DIR:
        raise ManifestError(f"{source}: path {path!r} must be relative and stay inside the artifact directory")


def sha256_file(path: Path, chunk_size: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(chunk_size):
            h.update(chunk)
    return h.hexdigest()


def build_manifest(local_dir: str | Path) -> Manifest:
    """Hash every regular file under local_dir (except a previous manifest and partial files)."""
    root = Path(local_dir)
    if not root.is_dir():
        raise ManifestError(
            f"{local_dir}: not a directory; pass the checkpoint or compiled artifact directory to publish"
        )
    files = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if not path.is_file() or rel == MANIFEST_NAME or rel.split("/")[0] == PARTIAL_DIR:
            continue
        files.append(FileEntry(path=rel, size=path.stat().st_size, sha256=sha256_file(path)))
    if not files:
        raise ManifestError(f"{local_dir}: holds no files to publish")
    return Manifest(files=tuple(files))


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """`s3://bucket/some/prefix` -> ("bucket", "some/prefix/"); the prefix always ends in '/'."""
    if not isinstance(uri, str) or not uri.startswith("s3://"):
        raise ManifestError(f"{uri!r} is not an S3 URI; use s3://bucket/prefix")
    bucket, _, prefix = uri[len("s3://") :].partition("/")
    if not bucket:
        raise ManifestError(f"{uri!r} names no bucket; use s3://bucket/prefix")
    prefix = prefix.strip("/")
    return bucket, (prefix + "/") if prefix else ""


def publish(local_dir: str | Path, uri: str, *, s3: Any, manifest: Manifest | None = None) -> Manifest:
    """Upload every file, then the manifest (last: its presence means the set is complete).
    `manifest`: build_manifest(local_dir) already computed (hashing a model takes minutes)."""
    bucket, prefix = parse_s3_uri(uri)
    manifest = manifest or build_manifest(local_dir)
    root = Path(local_dir)
    for entry in manifest.files:
        s3.upload_file(str(root / entry.path), bucket, prefix + entry.path)
        log.info("published %s (%d bytes)", entry.path, entry.size)
    s3.put_object(Bucket=bucket, Key=prefix + MANIFEST_NAME, Body=manifest.to_json(), ContentType="application/json")
    log.info(
        "published manifest s3://%s/%s%s: %d files, %d bytes, digest %s",
        bucket,
        prefix,
        MANIFEST_NAME,
        len(manifest.files),
        manifest.total_bytes,
        manifest.digest,
    )
    return manifest
