"""`flotilla node-boot stage | check` against moto: staging uploads exactly the pinned bytes with their
SHA-256 (and refuses others, uploading nothing), `check` finds a missing, altered or out-of-region
artifact and names the fix, and the AMI check follows the pinned release through SSM (moto ships
AWS's own captured /aws/service/ecs/optimized-ami listing) or the config's per-region pins."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

import pytest

import ops.node_boot
from contract.node_boot import EFA_INSTALLER, NEURON_AMI_NAME, NEURON_AMI_PARAMETER, BootArtifact
from ops.node_boot import ami_checks, artifact_checks, stage_artifacts

BUCKET = "boot-test-models"
PAYLOAD = b"aws-efa-installer stand-in\n"
TEST_ARTIFACT = BootArtifact(
    name="EFA installer",
    version="0.0.1",
    filename="aws-efa-installer-0.0.1.tar.gz",
    sha256=hashlib.sha256(PAYLOAD).hexdigest(),
    upstream_url="https://efa-installer.amazonaws.com/aws-efa-installer-0.0.1.tar.gz",
    source="a test stand-in",
)


def config_file(tmp_path: Path, extra: str = "") -> str:
    path = tmp_path / "flotilla.yaml"
    path.write_text(f"model:\n  s3_uri: s3://{BUCKET}/llama/\n{extra}")
    return str(path)


def read(path: str):
    from ops.deploy_config import read_config

    return read_config(path)


@pytest.fixture
def test_artifact(monkeypatch):
    """The nodes install TEST_ARTIFACT instead of the real installer (whose bytes a test cannot have)."""
    monkeypatch.setattr(
        ops.node_boot, "boot_artifacts", lambda efa_interfaces: (TEST_ARTIFACT,) if efa_interfaces else ()
    )
    return TEST_ARTIFACT


@pytest.fixture
def bucket(s3):
    s3.create_bucket(Bucket=BUCKET)
    return BUCKET


def test_stage_uploads_the_pinned_bytes_with_their_sha256_and_then_check_passes(
    run_cli, aws, bucket, test_artifact, tmp_path
):
    source = tmp_path / "downloads"
    source.mkdir()
    (source / test_artifact.filename).write_bytes(PAYLOAD)
    path = config_file(tmp_path)
    code, out = run_cli("node-boot", "stage", "--config", path, "--from", str(source), "--yes")
    assert code == 0, out
    head = aws.s3.head_object(Bucket=bucket, Key=test_artifact.key, ChecksumMode="ENABLED")
    assert head["ChecksumSHA256"] == base64.b64encode(hashlib.sha256(PAYLOAD).digest()).decode()
    assert head["ServerSideEncryption"] == "AES256"
    assert aws.s3.get_object(Bucket=bucket, Key=test_artifact.key)["Body"].read() == PAYLOAD
    assert test_artifact.key == "flotilla-node-artifacts/aws-efa-installer-0.0.1.tar.gz"
    checks = artifact_checks(read(path), s3=aws.s3, region="us-east-1")
    assert [(c.name, c.ok) for c in checks] == [(f"s3://{bucket}/{test_artifact.key}", True)]
    # A second run finds it in place and uploads nothing.
    code, out = run_cli("node-boot", "stage", "--config", path, "--from", str(source), "--yes")
    assert code == 0 and "already staged" in out


def test_stage_downloads_from_the_upstream_url_when_not_given_the_files(aws, bucket, test_artifact, tmp_path):
    fetched = []

    def fetch(url: str, dest: Path) -> None:
        fetched.append(url)
        dest.write_bytes(PAYLOAD)

    (check,) = stage_artifacts(read(config_file(tmp_path)), s3=aws.s3, region="us-east-1", fetch=fetch)
    assert check.ok, check.detail
    assert fetched == [test_artifact.upstream_url]


def test_stage_refuses_bytes_that_are_not_the_pinned_ones_and_uploads_nothing(run_cli, aws, bucket, tmp_path):
    """The real pin (AWS's published SHA-256 of the EFA installer) and other bytes under its name."""
    source = tmp_path / "downloads"
    source.mkdir()
    (source / EFA_INSTALLER.filename).write_bytes(b"not the installer AWS published")
    code, out = run_cli("node-boot", "stage", "--config", config_file(tmp_path), "--from", str(source), "--yes")
    assert code == 1
    text = " ".join(out.split())
    actual = hashlib.sha256(b"not the installer AWS published").hexdigest()
    assert f"SHA-256 {actual}, not the {EFA_INSTALLER.sha256} AWS publishes for EFA installer 1.47.0" in text
    assert "nothing was uploaded" in text
    assert aws.s3.list_objects_v2(Bucket=bucket).get("KeyCount") == 0


def test_check_names_a_missing_artifact_and_the_command_that_stages_it(run_cli, aws, bucket, tmp_path):
    path = config_file(tmp_path)
    code, out = run_cli("node-boot", "check", "--config", path)
    assert code == 1 and "FAIL" in out
    (check,) = artifact_checks(read(path), s3=aws.s3, region="us-east-1", config_path=path)
    assert not check.ok
    assert check.detail == "missing: nodes with EFA cannot boot"
    assert check.fix == (
        f"flotilla node-boot stage --config {path} --region us-east-1 (docs/runbooks/node-boot-artifacts.md)"
    )


def test_check_refuses_an_object_uploaded_without_the_pinned_checksum(aws, bucket, test_artifact, tmp_path):
    aws.s3.put_object(Bucket=bucket, Key=test_artifact.key, Body=PAYLOAD)  # right bytes, no checksum recorded
    (check,) = artifact_checks(read(config_file(tmp_path)), s3=aws.s3, region="us-east-1")
    assert not check.ok and check.detail.startswith("no SHA-256 recorded, not the pinned")
    other = b"other bytes"
    aws.s3.put_object(
        Bucket=bucket,
        Key=test_artifact.key,
        Body=other,
        ChecksumAlgorithm="SHA256",
        ChecksumSHA256=base64.b64encode(hashlib.sha256(other).digest()).decode(),
    )
    (check,) = artifact_checks(read(config_file(tmp_path)), s3=aws.s3, region="us-east-1")
    assert not check.ok and check.detail.startswith(f"SHA-256 {hashlib.sha256(other).hexdigest()}, not the pinned")


def test_a_model_bucket_in_another_region_is_refused_before_anything_is_uploaded(aws, s3, test_artifact, tmp_path):
    import boto3

    boto3.client("s3", region_name="eu-west-1").create_bucket(
        Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": "eu-west-1"}
    )
    (check,) = stage_artifacts(read(config_file(tmp_path)), s3=aws.s3, region="us-east-1", fetch=pytest.fail)
    assert not check.ok
    assert check.name == f"s3://{BUCKET}" and "in eu-west-1, not the deployment's region us-east-1" in check.detail


def test_x86_staging_hosts_need_no_boot_artifacts(run_cli, aws, s3, tmp_path):
    path = config_file(tmp_path, "instance_type: m6i.large\nnode:\n  engine: reference\n")
    code, out = run_cli("node-boot", "stage", "--config", path, "--yes")
    assert code == 0 and "install nothing at boot" in " ".join(out.split())
    assert artifact_checks(read(path), s3=aws.s3, region="us-east-1") == []


def test_the_pinned_release_resolves_through_aws_own_ssm_listing(aws, monkeypatch, tmp_path):
    """moto 5.2.5 ships what AWS's GetParametersByPath(/aws/service/ecs/optimized-ami) returned in each
    region (getmoto/moto scripts/ssm_get_optimized_amis.py) and the images it names."""
    monkeypatch.setenv("MOTO_EC2_LOAD_DEFAULT_AMIS", "true")  # before this test's first EC2 call
    checks = ami_checks(read(config_file(tmp_path)), ssm=aws.ssm, ec2=aws.ec2, region="us-east-1")
    assert [c.ok for c in checks] == [True, True], checks
    assert checks[0].name == NEURON_AMI_PARAMETER and checks[0].detail.startswith("resolves to ami-")
    assert checks[1].detail == NEURON_AMI_NAME
    # Without an EC2 client only the parameter is read (preflight's use).
    assert [c.ok for c in ami_checks(read(config_file(tmp_path)), ssm=aws.ssm, region="us-east-1")] == [True]


def test_a_region_without_the_parameter_fails_naming_the_release(aws, tmp_path):
    # moto's capture for me-south-1 predates release 20260403: the parameter is absent there.
    import boto3

    (check,) = ami_checks(
        read(config_file(tmp_path)), ssm=boto3.client("ssm", region_name="me-south-1"), region="me-south-1"
    )
    assert not check.ok and check.name == NEURON_AMI_PARAMETER
    assert (
        check.detail
        == f"does not resolve in me-south-1: the pinned AMI release {NEURON_AMI_NAME} is not published there"
    )
    assert check.fix.startswith("deploy to a region that has it")


def test_a_parameter_naming_another_image_fails(aws, tmp_path):
    from botocore.stub import Stubber

    other = aws.ec2.register_image(Name="my-own-image", RootDeviceName="/dev/xvda", BlockDeviceMappings=[])["ImageId"]
    ssm = __import__("boto3").client("ssm", region_name="us-east-1")
    with Stubber(ssm) as stub:
        stub.add_response("get_parameter", {"Parameter": {"Name": NEURON_AMI_PARAMETER, "Value": other}})
        checks = ami_checks(read(config_file(tmp_path)), ssm=ssm, ec2=aws.ec2, region="us-east-1")
    assert [c.ok for c in checks] == [True, False]
    assert f"is 'my-own-image' (available), not the available release {NEURON_AMI_NAME}" in checks[1].detail


def test_stage_without_yes_off_a_terminal_uploads_nothing_and_names_the_flag(
    run_cli, aws, bucket, test_artifact, tmp_path
):
    source = tmp_path / "downloads"
    source.mkdir()
    (source / test_artifact.filename).write_bytes(PAYLOAD)
    code, out = run_cli("node-boot", "stage", "--config", config_file(tmp_path), "--from", str(source))
    assert code == 1 and "--yes" in out
    assert aws.s3.list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0
