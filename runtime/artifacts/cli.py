"""`python -m runtime artifacts {publish,fetch,manifest}`: move model artifacts to and from S3.

publish: hash a local directory, upload its files, then its manifest. fetch: download and verify
(resumes a partial download). manifest: print the manifest of a local directory (no S3).
"""

from __future__ import annotations

import argparse
import sys

from runtime.artifacts.fetch import ArtifactError, fetch
from runtime.artifacts.manifest import ManifestError, build_manifest, publish
from runtime.logs import setup_logging


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register `artifacts` on `python -m runtime`."""
    parser = subparsers.add_parser("artifacts", help="publish / fetch model artifacts on S3")
    sub = parser.add_subparsers(dest="artifacts_command", required=True)
    pub = sub.add_parser("publish", help="upload a directory and its checksum manifest")
    pub.add_argument("--source", required=True, help="local checkpoint or compiled directory")
    pub.add_argument("--uri", required=True, help="s3://bucket/prefix to publish to")
    get = sub.add_parser("fetch", help="download and verify a published directory")
    get.add_argument("--uri", required=True, help="s3://bucket/prefix published before")
    get.add_argument("--dest", required=True, help="local directory to fill")
    man = sub.add_parser("manifest", help="print the manifest of a local directory")
    man.add_argument("--source", required=True)
    parser.set_defaults(func=run_artifacts)
    return parser


def run_artifacts(args: argparse.Namespace, out=None, err=None, s3=None) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    setup_logging(stream=err)
    try:
        if args.artifacts_command == "manifest":
            out.write(build_manifest(args.source).to_json().decode())
            return 0
        if s3 is None:
            import boto3  # noqa: PLC0415 - only the S3 commands need it

            s3 = boto3.client("s3")
        if args.artifacts_command == "publish":
            manifest = publish(args.source, args.uri, s3=s3)
        else:
            manifest = fetch(args.uri, args.dest, s3=s3)
    except (ArtifactError, ManifestError) as exc:
        print(f"error: {exc}", file=err)
        return 2
    print(manifest.digest, file=out)
    return 0
