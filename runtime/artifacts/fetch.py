"""Fetch a published artifact set from S3 to local disk: verified, resumable, atomic per file.

A file is downloaded into `<dest>/.partial/<path>.part`; an interrupted download resumes with a
Range GET from the partial file's size; the finished file is sha256-checked against the manifest
and only then renamed into place, so `<dest>/<path>` is always either absent or verified.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Callable

from runtime.artifacts.manifest import MANIFEST_NAME, PARTIAL_DIR, FileEntry, Manifest, parse_s3_uri, sha256_file

log = logging.getLogger("flotilla.artifacts")
CHUNK_SIZE = 8 << 20


class ArtifactError(RuntimeError):
    """The artifacts in S3 cannot be fetched as published; the message names the fix."""


class ChecksumMismatch(ArtifactError):
    """A downloaded file's sha256 differs from the manifest; the bad download was discarded."""


def _not_found(exc: Exception) -> bool:
    code = getattr(exc, "response", {}).get("Error", {}).get("Code", "")
    return code in ("NoSuchKey", "404", "NotFound")


def read_manifest(uri: str, *, s3) -> Manifest:
    bucket, prefix = parse_s3_uri(uri)
    key = prefix + MANIFEST_NAME
    try:
        body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    except Exception as exc:  # botocore ClientError; the type lives in the client's module
        if _not_found(exc):
            raise ArtifactError(
                f"s3://{bucket}/{key} not found: nothing is published at {uri}; "
                "publish it with `python -m runtime artifacts publish "
                f"--source <dir> --uri {uri}`"
            ) from None
        raise
    return Manifest.from_json(body, source=f"s3://{bucket}/{key}")


def _list_sizes(s3, bucket: str, prefix: str) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            sizes[obj["Key"]] = obj["Size"]
    return sizes


OnBytes = Callable[[int, int], None]  # (bytes of the set on disk, the set's total bytes)


def fetch(
    uri: str,
    dest: str | Path,
    *,
    s3,
    chunk_size: int = CHUNK_SIZE,
    manifest: Manifest | None = None,
    on_bytes: OnBytes | None = None,
) -> Manifest:
    """Make `dest` hold exactly the verified files of the set at `uri`; returns its manifest.

    `manifest`: the set's manifest when the caller has already read it (saves a GET). `on_bytes`:
    called after every chunk and file with the bytes on disk so far (resumed and already verified
    bytes count) and the set's total, so a node can say how far a long download is."""
    bucket, prefix = parse_s3_uri(uri)
    if manifest is None:
        manifest = read_manifest(uri, s3=s3)
    sizes = _list_sizes(s3, bucket, prefix)
    for entry in manifest.files:
        key = prefix + entry.path
        if key not in sizes:
            raise ArtifactError(
                f"s3://{bucket}/{key} is listed in the manifest but missing from the bucket; republish the artifacts"
            )
        if sizes[key] != entry.size:
            raise ArtifactError(
                f"s3://{bucket}/{key} is {sizes[key]} bytes but the manifest says {entry.size}; republish the artifacts"
            )
    root = Path(dest)
    root.mkdir(parents=True, exist_ok=True)
    started, done, counts = time.monotonic(), 0, {"fetched": 0, "resumed": 0, "verified": 0}
    log.info("fetch %s -> %s: %d files, %d bytes", uri, root, len(manifest.files), manifest.total_bytes)
    total = manifest.total_bytes
    if on_bytes is not None:
        on_bytes(0, total)
    for entry in manifest.files:
        file_bytes = None if on_bytes is None else (lambda got, before=done: on_bytes(before + got, total))
        counts[_fetch_file(s3, bucket, prefix, entry, root, chunk_size, file_bytes)] += 1
        done += entry.size
        if on_bytes is not None:
            on_bytes(done, total)
        log.info(
            "progress %d/%d bytes (%.0f%%)", done, manifest.total_bytes, 100.0 * done / max(1, manifest.total_bytes)
        )
    # Written last and atomically: its presence marks a complete, verified local copy.
    tmp = root / PARTIAL_DIR / MANIFEST_NAME
    tmp.parent.mkdir(exist_ok=True)  # absent when every file was already verified (a re-fetch)
    tmp.write_bytes(manifest.to_json())
    os.replace(tmp, root / MANIFEST_NAME)
    log.info(
        "fetched %s in %.1f s: %d downloaded, %d resumed, %d already verified; digest %s",
        uri,
        time.monotonic() - started,
        counts["fetched"],
        counts["resumed"],
        counts["verified"],
        manifest.digest,
    )
    return manifest


def _fetch_file(
    s3, bucket: str, prefix: str, entry: FileEntry, root: Path, chunk_size: int, on_bytes: Callable[[int], None] | None
) -> str:
    final = root / entry.path
    if final.is_file() and final.stat().st_size == entry.size and sha256_file(final) == entry.sha256:
        log.info("%s: already present and verified", entry.path)
        return "verified"
    part = root / PARTIAL_DIR / (entry.path + ".part")
    part.parent.mkdir(parents=True, exist_ok=True)
    offset = part.stat().st_size if part.is_file() else 0
    if offset > entry.size:  # a partial larger than the object cannot be a prefix of it
        part.unlink()
        offset = 0
    outcome = "resumed" if offset else "fetched"
    if offset < entry.size:
        args = {"Bucket": bucket, "Key": prefix + entry.path}
        if offset:
            args["Range"] = f"bytes={offset}-"
            log.info("%s: resuming at byte %d of %d", entry.path, offset, entry.size)
        body = s3.get_object(**args)["Body"]
        got, next_report = offset, entry.size // 10
        with open(part, "ab") as fh:
            while chunk := body.read(chunk_size):
                fh.write(chunk)
                got += len(chunk)
                if on_bytes is not None:
                    on_bytes(got)
                if got >= next_report and got < entry.size:
                    log.info("%s: %d/%d bytes (%.0f%%)", entry.path, got, entry.size, 100.0 * got / entry.size)
                    next_report = got + entry.size // 10
            fh.flush()
            os.fsync(fh.fileno())
    actual, actual_size = sha256_file(part), part.stat().st_size
    if actual_size != entry.size or actual != entry.sha256:
        part.unlink()
        raise ChecksumMismatch(
            f"{entry.path}: downloaded {actual_size} bytes with sha256 {actual}, but the manifest "
            f"says {entry.size} bytes with sha256 {entry.sha256}; the download was discarded. "
            "Re-run to download it again; if it repeats, the object in S3 changed after "
            "publishing: republish the artifacts"
        )
    final.parent.mkdir(parents=True, exist_ok=True)
    os.replace(part, final)
    log.info("%s: %d bytes verified (%s)", entry.path, entry.size, outcome)
    return outcome
