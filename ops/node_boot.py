"""What a unit's node needs from the account before it can boot, checked and staged: the artifacts its
user data installs (in the model bucket under flotilla-node-artifacts/, with their SHA-256, in the
deployment's region so the VPC's S3 gateway endpoint reaches them) and the AMI it boots (the pinned
release's public SSM parameter and the image it names). `flotilla node-boot` and `flotilla preflight`
call ami_checks / artifact_checks; stage_artifacts uploads what is missing.
"""

from __future__ import annotations

import base64
import hashlib
import shutil
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import botocore.exceptions

from contract.node_boot import BootArtifact, boot_artifacts, node_ami
from ops.errors import OpsError

if TYPE_CHECKING:
    from stacks.config import FlotillaConfig

RUNBOOK = "docs/runbooks/node-boot-artifacts.md"
DOWNLOAD_TIMEOUT_S = 60  # per socket read; the EFA installer is a few hundred MB
CHUNK = 1 << 20


@dataclass(frozen=True)
class BootCheck:
    """One thing a node's boot needs, as found in the account: ok, or what is wrong and the fix."""

    name: str
    ok: bool
    detail: str  # what was found
    fix: str = ""  # what to do when not ok


def _sha256_b64(hex_digest: str) -> str:
    """S3's ChecksumSHA256: the base64 of the digest's bytes (S3 API reference, PutObject)."""
    return base64.b64encode(bytes.fromhex(hex_digest)).decode()


def _error_code(err: botocore.exceptions.ClientError) -> str:
    return str(err.response.get("Error", {}).get("Code", ""))


def bucket_region(s3: Any, bucket: str) -> str:
    """The bucket's region; GetBucketLocation answers None for us-east-1 (S3 API reference)."""
    return s3.get_bucket_location(Bucket=bucket).get("LocationConstraint") or "us-east-1"


def needed_artifacts(config: FlotillaConfig) -> tuple[BootArtifact, ...]:
    return boot_artifacts(efa_interfaces=config.shape.efa_interfaces)


def _object_check(s3: Any, bucket: str, artifact: BootArtifact, stage_hint: str) -> BootCheck:
    name = f"s3://{bucket}/{artifact.key}"
    try:
        head = s3.head_object(Bucket=bucket, Key=artifact.key, ChecksumMode="ENABLED")
    except botocore.exceptions.ClientError as err:
        if _error_code(err) in ("404", "NoSuchKey", "NotFound"):
            return BootCheck(name, False, "missing: nodes with EFA cannot boot", stage_hint)
        raise
    recorded = head.get("ChecksumSHA256")
    if recorded != _sha256_b64(artifact.sha256):
        found = f"SHA-256 {base64.b64decode(recorded).hex()}" if recorded else "no SHA-256 recorded"
        return BootCheck(
            name,
            False,
            f"{found}, not the pinned {artifact.sha256} of {artifact.name} {artifact.version}: every node "
            "would refuse it",
            stage_hint,
        )
    return BootCheck(name, True, f"{artifact.name} {artifact.version}, SHA-256 {artifact.sha256}")


def artifact_checks(config: FlotillaConfig, *, s3: Any, region: str, config_path: str = "CONFIG") -> list[BootCheck]:
    """Each artifact this config's nodes install at boot: present in the model bucket with the pinned
    SHA-256 (as S3 recorded it at upload), and the bucket in the deployment's region."""
    artifacts = needed_artifacts(config)
    if not artifacts:
        return []
    bucket = config.model.bucket
    stage_hint = f"flotilla node-boot stage --config {config_path} --region {region} ({RUNBOOK})"
    where = bucket_region(s3, bucket)
    if where != region:
        return [
            BootCheck(
                f"s3://{bucket}",
                False,
                f"in {where}, not the deployment's region {region}: the S3 gateway endpoint reaches only buckets "
                "of its own region, so the boot would need the NAT gateways",
                f"use a model bucket in {region} (model.s3_uri)",
            )
        ]
    return [_object_check(s3, bucket, artifact, stage_hint) for artifact in artifacts]


def ami_checks(config: FlotillaConfig, *, ssm: Any, region: str, ec2: Any = None) -> list[BootCheck]:
    """The AMI this config's nodes boot resolves in `region`: the pinned release's public SSM parameter
    exists there (a missing one fails every Cell stack at change-set creation) and, given an EC2
    client, names an available image of that release (its name is the release's AMI name)."""
    from stacks.hosts import is_trainium  # noqa: PLC0415 - stacks/ only when a config is read

    ami = node_ami(trainium=is_trainium(config.instance_type))
    try:
        image_id = ssm.get_parameter(Name=ami.parameter)["Parameter"]["Value"]
    except botocore.exceptions.ClientError as err:
        if _error_code(err) != "ParameterNotFound":
            raise
        return [
            BootCheck(
                ami.parameter,
                False,
                f"does not resolve in {region}: the pinned AMI release {ami.name} is not published there",
                "deploy to a region that has it, or pin a release published there (contract/node_boot.py, "
                "docs/hardware.md, The unit AMI)",
            )
        ]
    checks = [BootCheck(ami.parameter, True, f"resolves to {image_id} in {region}")]
    if ec2 is None:
        return checks
    try:
        images = ec2.describe_images(ImageIds=[image_id]).get("Images", [])
    except botocore.exceptions.ClientError as err:
        if not _error_code(err).startswith("InvalidAMIID"):
            raise
        images = []
    name = f"AMI {image_id}"
    if not images:
        return [*checks, BootCheck(name, False, f"not found in {region}", "ask AWS support: the parameter is theirs")]
    image = images[0]
    if image.get("Name") != ami.name or image.get("State") != "available":
        return [
            *checks,
            BootCheck(
                name,
                False,
                f"is {image.get('Name')!r} ({image.get('State')}), not the available release {ami.name}",
                "the public parameter moved: check docs/hardware.md, The unit AMI, before deploying",
            ),
        ]
    return [*checks, BootCheck(name, True, ami.name)]


# --- staging ---------------------------------------------------------------------------------------
Download = Callable[[str, Path], None]


def download(url: str, dest: Path) -> None:
    """Stream `url` to `dest` (HTTPS, bounded socket waits)."""
    if not url.startswith("https://"):
        raise OpsError(f"{url}: only HTTPS downloads are allowed")
    try:
        with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response, dest.open("wb") as out:  # noqa: S310
            shutil.copyfileobj(response, out, CHUNK)
    except (urllib.error.URLError, OSError) as err:
        raise OpsError(
            f"{url}: download failed ({err}); from a machine without internet access, download it elsewhere "
            "and pass its directory with --from"
        ) from None


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _local_copy(artifact: BootArtifact, *, source_dir: Path | None, work: Path, fetch: Download) -> Path:
    """The artifact's bytes on disk, verified against the pinned SHA-256 before anything is uploaded."""
    if source_dir is not None:
        path = source_dir / artifact.filename
        if not path.is_file():
            raise OpsError(f"--from {source_dir}: no {artifact.filename} there (download {artifact.upstream_url})")
    else:
        path = work / artifact.filename
        fetch(artifact.upstream_url, path)
    actual = sha256_of(path)
    if actual != artifact.sha256:
        raise OpsError(
            f"{path}: SHA-256 {actual}, not the {artifact.sha256} AWS publishes for {artifact.name} "
            f"{artifact.version} ({artifact.source}); nothing was uploaded. Download it again from "
            f"{artifact.upstream_url}"
        )
    return path


def stage_artifacts(
    config: FlotillaConfig,
    *,
    s3: Any,
    region: str,
    source_dir: Path | None = None,
    fetch: Download = download,
    config_path: str = "CONFIG",
) -> Iterable[BootCheck]:
    """Upload each artifact this config's nodes install that is not already in place with its pinned
    SHA-256; yields one BootCheck per artifact as it is done. One PutObject (up to 5 GB; a multipart
    upload would record a checksum of part checksums instead) carries the checksum, so S3 itself
    refuses bytes that differ and records it for HeadObject (S3 API reference, PutObject
    x-amz-checksum-sha256; "Checking object integrity" in the S3 user guide), and SSE-S3 encryption,
    so the node's role needs no KMS key whatever the bucket's default."""
    before = artifact_checks(config, s3=s3, region=region, config_path=config_path)
    bucket = config.model.bucket
    for check, artifact in zip(before, needed_artifacts(config)):
        if check.ok:
            yield BootCheck(check.name, True, f"already staged: {check.detail}")
            continue
        if check.name == f"s3://{bucket}":  # the bucket's region: nothing to upload can fix it
            yield check
            return
        with tempfile.TemporaryDirectory(prefix="flotilla-stage-") as work:
            path = _local_copy(artifact, source_dir=source_dir, work=Path(work), fetch=fetch)
            with path.open("rb") as body:
                s3.put_object(
                    Bucket=bucket,
                    Key=artifact.key,
                    Body=body,
                    ChecksumAlgorithm="SHA256",
                    ChecksumSHA256=_sha256_b64(artifact.sha256),
                    ServerSideEncryption="AES256",
                    Metadata={"sha256": artifact.sha256, "source": artifact.upstream_url},
                )
        yield _object_check(s3, bucket, artifact, "stage it again")
