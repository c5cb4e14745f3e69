"""`flotilla publish`: upload a model checkpoint to S3 the way the nodes read it, with its manifest.

A node fetches `model.s3_uri` only through `flotilla-manifest.json` (every file's path, size and
sha256, contract/manifest.py) and reads the model's shape from the `config.json` it lists; a prefix
uploaded any other way (`aws s3 sync`) has no manifest and every node refuses it. The files go
first and the manifest last, so a prefix with a manifest is always complete. A prefix that already
holds another artifact set is refused: a fleet may be serving from it, and a rollback needs it.
"""

from __future__ import annotations

import argparse
import json

import botocore.exceptions
from rich.console import Console

from contract.manifest import MANIFEST_NAME, MODEL_CONFIG_NAME, Manifest, ManifestError, build_manifest, parse_s3_uri
from contract.manifest import publish as upload
from ops.aws import Aws, clients_for
from ops.commands import Subparsers
from ops.commands.common import add_confirm_options, add_json_option, confirmed, stderr_console
from ops.errors import Refused, bad_arg

GIB = 2**30


def add_parser(sub: Subparsers) -> list[argparse.ArgumentParser]:
    p = sub.add_parser(
        "publish",
        help="upload a model checkpoint to S3 with the manifest the nodes fetch it by",
        description="Hash every file of a model directory (a Hugging Face checkpoint with its config.json), "
        "upload the files to the S3 prefix the config's model.s3_uri names, then flotilla-manifest.json. "
        "Refuses a prefix that already holds another artifact set. Prints the set's digest. Dry run unless "
        "confirmed.",
    )
    p.add_argument("--source", required=True, metavar="DIR", help="the model directory (with config.json)")
    p.add_argument("--uri", required=True, metavar="S3_URI", help="s3://bucket/prefix/: the config's model.s3_uri")
    add_confirm_options(p)
    add_json_option(p)
    p.set_defaults(handler=run, data_on_stdout=True)
    return [p]


def published(aws: Aws, uri: str) -> Manifest | None:
    """The manifest at `uri`, None when nothing is published there yet."""
    bucket, prefix = parse_s3_uri(uri)
    try:
        body = aws.s3.get_object(Bucket=bucket, Key=prefix + MANIFEST_NAME)["Body"].read()
    except botocore.exceptions.ClientError as err:
        if err.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
            return None
        raise
    return Manifest.from_json(body, source=f"s3://{bucket}/{prefix}{MANIFEST_NAME}")


def local_manifest(source: str) -> Manifest:
    try:
        manifest = build_manifest(source)
    except ManifestError as err:
        raise bad_arg("--source", source, str(err).removeprefix(f"{source}: "), "give the model's directory") from None
    if MODEL_CONFIG_NAME not in {f.path for f in manifest.files}:
        raise bad_arg(
            "--source",
            source,
            f"has no {MODEL_CONFIG_NAME} at its top",
            "publish the whole Hugging Face checkpoint directory (the nodes read the model's shape from its "
            f"{MODEL_CONFIG_NAME})",
        )
    return manifest


def run(args: argparse.Namespace, console: Console) -> int:
    try:
        bucket, prefix = parse_s3_uri(args.uri)
    except ManifestError:
        raise bad_arg("--uri", args.uri, "is not an S3 URI", "give s3://bucket/prefix/") from None
    if not prefix:
        raise bad_arg("--uri", args.uri, "names no prefix", "give s3://bucket/<model>/, a prefix of its own")
    uri = f"s3://{bucket}/{prefix}"
    say = stderr_console()  # stdout carries only the digest (or --json), for scripts
    manifest = local_manifest(args.source)
    aws = clients_for(args)
    there = published(aws, uri)
    doc = {"uri": uri, "digest": manifest.digest, "files": len(manifest.files), "bytes": manifest.total_bytes}
    if there is not None and there.digest == manifest.digest:
        say.print(f"{uri} already holds this artifact set (digest {manifest.digest}): nothing to upload")
    elif there is not None:
        raise Refused(
            f"{uri}{MANIFEST_NAME} lists another artifact set (digest {there.digest}): publish to a new prefix "
            "(a fleet may be serving from this one, and a rollback needs it)"
        )
    else:
        say.print(
            f"publish {len(manifest.files)} file(s), {manifest.total_bytes / GIB:.2f} GiB, from {args.source} to "
            f"{uri}, then {MANIFEST_NAME} (digest {manifest.digest})"
        )
        if not confirmed(args, say, f"upload {len(manifest.files)} file(s) to {uri}"):
            return 0
        upload(args.source, uri, s3=aws.s3, manifest=manifest)
        say.print(f"published {uri}: set model.s3_uri to it; `flotilla preflight` checks it before a deploy")
    if args.json:
        console.print_json(json.dumps(doc))
    else:
        console.print(manifest.digest, markup=False, highlight=False)
    return 0
