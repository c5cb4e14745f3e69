"""`flotilla preflight` against an account in moto: every check passes on an account ready for the
config, and each fails (or warns) when the one thing it checks is missing or wrong. moto has no EC2
quotas and no DescribeCapacityReservations, and its copy of the pinned AMI's public parameter cannot
be made to fail: those three answers come from botocore Stubbers, shaped and validated by botocore's
own service models."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import moto.settings
import pytest
import yaml
from botocore.stub import Stubber

from contract.apikeys import KeyEntry, KeySet, digest, new_key, secret_name
from contract.llama import preset
from contract.manifest import publish
from contract.node_boot import EFA_INSTALLER, NEURON_AMI_PARAMETER
from ops.cli import build_parser
from ops.commands.preflight import run as run_preflight
from ops.preflight import BOOTSTRAP_VERSION_PARAMETER, MIN_BOOTSTRAP_VERSION

ROOT = Path(__file__).resolve().parents[2]
REGION = "us-east-1"
ACCOUNT = "123456789012"  # moto's account
MODEL_URI = "s3://my-models/llama-3.1-8b-instruct/"
IMAGE = f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/flotilla:1.0"
RESERVATION = "cr-0123456789abcdef0"
CHECKS = (
    "account",
    "quota",
    "availability-zones",
    "capacity",
    "ami",
    "boot-artifacts",
    "model",
    "certificate",
    "api-keys",
    "image",
    "bootstrap",
)
# trn1.32xlarge: 128 vCPUs (contract/trainium.py). 2 units x 1 node: 256 vCPUs, 512 while surging.
NEED, PEAK = 256, 512
# The bootstrap template writes its version to SSM, as `cdk bootstrap`'s own template does.
BOOTSTRAP_TEMPLATE = {
    "Resources": {
        "CdkBootstrapVersion": {
            "Type": "AWS::SSM::Parameter",
            "Properties": {"Type": "String", "Name": BOOTSTRAP_VERSION_PARAMETER, "Value": "30"},
        }
    }
}


class Account:
    """An account in moto holding everything the base config needs, and the stubbed answers."""

    def __init__(self, aws, tmp_path: Path, run_cli) -> None:
        self.aws, self.tmp, self.run_cli = aws, tmp_path, run_cli
        self.quota: int | None = 1024  # None: AWS refuses the call
        self.default_quota: int | None = None  # set: no applied value, AWS's default is this
        self.ami = True
        self.reservation: dict | str | None = None  # the answer, or an error code
        cert = aws.acm.request_certificate(DomainName="llm.example.com", ValidationMethod="DNS")
        self.certificate_arn = cert["CertificateArn"]
        self.config: dict = {
            "deployment_name": "flotilla",
            "region": REGION,
            "availability_zones": ["us-east-1b", "us-east-1c"],  # moto offers trn1.32xlarge in b, c and f
            "instance_type": "trn1.32xlarge",
            "nodes_per_unit": 1,
            "units": 2,
            "model": {"s3_uri": MODEL_URI, "name": "llama-3.1-8b-instruct"},
            "certificate_arn": self.certificate_arn,
            "image": IMAGE,
        }
        model = tmp_path / "model"
        model.mkdir()
        # the model the config names (llama-3.1-8b-instruct: contract/llama.py's llama-3.1-8b)
        (model / "config.json").write_text(json.dumps(preset("llama-3.1-8b").to_hf_config()))
        (model / "model.safetensors").write_bytes(b"\0" * 100)
        aws.s3.create_bucket(Bucket="my-models")
        publish(model, MODEL_URI, s3=aws.s3)
        # The EFA installer, staged as `flotilla node-boot stage` leaves it: S3 recorded the pinned
        # SHA-256 (moto keeps the checksum the upload names; S3 itself would refuse other bytes).
        aws.s3.put_object(
            Bucket="my-models",
            Key=EFA_INSTALLER.key,
            Body=b"stand-in bytes",
            ChecksumAlgorithm="SHA256",
            ChecksumSHA256=base64.b64encode(bytes.fromhex(EFA_INSTALLER.sha256)).decode(),
        )
        _, key = new_key()
        keys = KeySet({"0badc0de": KeyEntry(name="smoke", sha256=digest(key))})
        aws.secretsmanager.create_secret(Name=secret_name("flotilla"), SecretString=keys.dumps())
        aws.ecr.create_repository(repositoryName="flotilla")
        manifest = {"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json"}
        aws.ecr.put_image(repositoryName="flotilla", imageManifest=json.dumps(manifest), imageTag="1.0")
        aws.cloudformation.create_stack(StackName="CDKToolkit", TemplateBody=json.dumps(BOOTSTRAP_TEMPLATE))

    def _stub(self, stubs: list[Stubber]) -> None:
        quotas, capacity, ami = stubs
        code = {"ServiceCode": "ec2", "QuotaCode": "L-2C3B7624"}
        if self.quota is None:
            quotas.add_client_error("get_service_quota", "AccessDeniedException", "not authorized", 403, None, code)
        elif self.default_quota is not None:  # no value applied to the account: the default is in force
            quotas.add_client_error("get_service_quota", "NoSuchResourceException", "not applied", 400, None, code)
            answer = {"Quota": {**code, "Value": float(self.default_quota)}}
            quotas.add_response("get_aws_default_service_quota", answer, code)
        else:
            answer = {"Quota": {**code, "QuotaName": "Running On-Demand Trn instances", "Value": float(self.quota)}}
            quotas.add_response("get_service_quota", answer, code)
        reservation_id = self.config.get("capacity", {}).get("reservation_id")
        if reservation_id and isinstance(self.reservation, str):
            capacity.add_client_error("describe_capacity_reservations", self.reservation, "no such reservation", 400)
        elif reservation_id:
            capacity.add_response(
                "describe_capacity_reservations",
                {"CapacityReservations": [self.reservation]},
                {"CapacityReservationIds": [reservation_id]},
            )
        if self.ami:
            param = {"Name": NEURON_AMI_PARAMETER, "Type": "String", "Value": "ami-0abcdef1234567890"}
            ami.add_response("get_parameter", {"Parameter": param}, {"Name": NEURON_AMI_PARAMETER})
        else:
            ami.add_client_error(
                "get_parameter", "ParameterNotFound", "not found", 400, None, {"Name": NEURON_AMI_PARAMETER}
            )

    def preflight(self, *extra: str) -> tuple[int, dict[str, list[dict]]]:
        """Run `flotilla preflight --config ... --json`; (exit status, findings by check)."""
        path = self.tmp / "prod.yaml"
        path.write_text(yaml.safe_dump(self.config))
        stubs = [Stubber(self.aws.servicequotas), Stubber(self.aws.capacity), Stubber(self.aws.ami)]
        for s in stubs:
            s.activate()
        try:
            self._stub(stubs)
            code, out = self.run_cli("preflight", "--config", str(path), "--json", *extra)
            for s in stubs:
                s.assert_no_pending_responses()
        finally:
            for s in stubs:
                s.deactivate()
        doc = json.loads(out)
        by_check: dict[str, list[dict]] = {}
        for f in doc["checks"]:
            by_check.setdefault(f["check"], []).append(f)
        assert (code == 1) == bool(doc["failed"])
        return code, by_check

    def status(self, check: str) -> tuple[int, str, str]:
        """(exit status, the check's worst status, its text) after one preflight run."""
        code, found = self.preflight()
        order = ("FAIL", "WARN", "PASS")
        worst = min((f["status"] for f in found[check]), key=order.index)
        return code, worst, " ".join(f"{f['saw']} | {f['fix']}" for f in found[check])


@pytest.fixture
def account(aws, s3, tmp_path, run_cli, monkeypatch):
    monkeypatch.chdir(ROOT)  # the config is read over ./cdk.json, as `cdk synth` reads it
    monkeypatch.setattr(moto.settings, "ACM_VALIDATION_WAIT", -1)  # moto: DNS validation done at once
    return Account(aws, tmp_path, run_cli)


def test_an_account_ready_for_the_config_passes_every_check(account, run_cli):
    code, found = account.preflight()
    assert code == 0
    assert tuple(found) == CHECKS
    assert {c: [f["status"] for f in fs] for c, fs in found.items()} == {c: ["PASS"] for c in CHECKS}
    assert f"is 1,024 vCPUs in {REGION}; this config needs {NEED}" in found["quota"][0]["saw"]
    assert "ami-0abcdef1234567890" in found["ami"][0]["saw"]
    assert f"version 30 ({BOOTSTRAP_VERSION_PARAMETER})" in found["bootstrap"][0]["saw"]


def test_the_text_report_is_a_line_per_check_with_its_fix_and_ends_with_the_verdict(account, capsys):
    account.quota = 100
    path = account.tmp / "prod.yaml"
    path.write_text(yaml.safe_dump(account.config))
    with Stubber(account.aws.servicequotas) as q, Stubber(account.aws.ami) as a:
        q.add_response("get_service_quota", {"Quota": {"Value": 100.0}})
        a.add_response("get_parameter", {"Parameter": {"Name": NEURON_AMI_PARAMETER, "Value": "ami-0abcdef1234567890"}})
        code, out = account.run_cli("preflight", "--config", str(path))
    assert code == 1
    text = " ".join(out.split())
    assert all(check in text for check in CHECKS)
    assert "FAIL: quota: fix these before deploying" in text
    assert f"--quota-code L-2C3B7624 --desired-value {PEAK} --region {REGION}" in text


@pytest.mark.parametrize(("quota", "status", "code"), [(NEED - 1, "FAIL", 1), (NEED, "WARN", 0), (PEAK, "PASS", 0)])
def test_the_trainium_vcpu_quota_must_cover_the_fleet_and_should_cover_a_surge(account, quota, status, code):
    account.quota = quota
    assert account.status("quota")[:2] == (code, status)


def test_a_quota_without_an_applied_value_is_judged_by_aws_default(account):
    account.default_quota = 0
    code, status, text = account.status("quota")
    assert (code, status) == (1, "FAIL") and "is 0 vCPUs" in text


def test_an_aws_refusal_is_a_failure_naming_the_iam_actions(account):
    account.quota = None
    code, status, text = account.status("quota")
    assert (code, status) == (1, "FAIL") and "AccessDeniedException" in text
    assert "allow servicequotas:GetServiceQuota" in text


def test_an_az_that_does_not_offer_the_instance_type_fails(account):
    account.config["availability_zones"] = ["us-east-1a", "us-east-1b"]
    code, status, text = account.status("availability-zones")
    assert (code, status) == (1, "FAIL")
    assert "trn1.32xlarge is not offered in us-east-1a (offered in us-east-1b, us-east-1c, us-east-1f)" in text
    account.config["availability_zones"] = []
    account.config.pop("region")  # an environment-agnostic config names no AZ
    assert account.status("availability-zones")[1] == "WARN"


def _reservation(**over) -> dict:
    now = datetime.now(UTC)
    r = {
        "CapacityReservationId": RESERVATION,
        "InstanceType": "trn1.32xlarge",
        "AvailabilityZone": "us-east-1b",
        "State": "active",
        "ReservationType": "default",
        "TotalInstanceCount": 4,
        "AvailableInstanceCount": 4,
        "StartDate": now - timedelta(days=1),
        "EndDate": now + timedelta(days=14),
    }
    return {**r, **over}


@pytest.fixture
def reserved(account):
    account.config["capacity"] = {
        "reservation_id": RESERVATION,
        "availability_zones": ["us-east-1b"],
        "placement_group": "none",
    }
    account.reservation = _reservation()
    return account


def test_a_reservation_that_fits_passes_and_its_state_type_az_and_size_are_checked(reserved):
    assert reserved.status("capacity")[:2] == (0, "PASS")
    for change, words in (
        ({"InstanceType": "trn1n.32xlarge"}, "holds trn1n.32xlarge, not trn1.32xlarge"),
        ({"AvailabilityZone": "us-east-1c"}, "is in us-east-1c, not us-east-1b"),
        ({"State": "expired"}, "is expired"),
        ({"AvailableInstanceCount": 1}, "has 1 free instance(s); the fleet needs 2"),
        (
            {"PlacementGroupArn": f"arn:aws:ec2:{REGION}:{ACCOUNT}:placement-group/trn1-pg"},
            "set capacity.placement_group",
        ),
    ):
        reserved.reservation = _reservation(**change)
        code, status, text = reserved.status("capacity")
        assert (code, status) == (1, "FAIL") and words in text, change
    reserved.reservation = _reservation(AvailableInstanceCount=3)  # 2 nodes, 4 while surging
    assert reserved.status("capacity")[:2] == (0, "WARN")


def test_a_capacity_block_that_has_not_started_fails_with_its_start_time(reserved):
    reserved.config["capacity"].update(market="capacity-block")
    del reserved.config["capacity"]["placement_group"]
    start = datetime.now(UTC) + timedelta(days=2)
    reserved.reservation = _reservation(ReservationType="capacity-block", State="scheduled", StartDate=start)
    code, status, text = reserved.status("capacity")
    assert (code, status) == (1, "FAIL")
    assert f"is scheduled (starts {start:%Y-%m-%d %H:%M} UTC)" in text and "capacity-block-not-started.md" in text
    reserved.reservation = _reservation(ReservationType="capacity-block")
    assert reserved.status("capacity")[:2] == (0, "PASS")
    reserved.reservation = _reservation()  # an ODCR named as a Capacity Block
    assert "set capacity.market on-demand" in reserved.status("capacity")[2]


def test_a_reservation_the_account_does_not_have_fails(reserved):
    reserved.reservation = "InvalidCapacityReservationId.NotFound"
    code, status, text = reserved.status("capacity")
    assert (code, status) == (1, "FAIL") and f"{RESERVATION} is not in account {ACCOUNT}, {REGION}" in text


def test_a_pinned_ami_the_region_does_not_publish_fails(account):
    account.ami = False
    code, status, text = account.status("ami")
    assert (code, status) == (1, "FAIL") and f"{NEURON_AMI_PARAMETER} does not resolve in {REGION}" in text


def test_an_efa_installer_not_staged_in_the_model_bucket_fails_with_the_command_that_stages_it(account):
    account.aws.s3.delete_object(Bucket="my-models", Key=EFA_INSTALLER.key)
    code, status, text = account.status("boot-artifacts")
    assert (code, status) == (1, "FAIL")
    assert f"s3://my-models/{EFA_INSTALLER.key} missing: nodes with EFA cannot boot" in text
    assert "flotilla node-boot stage --config" in text


def test_a_model_prefix_without_a_manifest_or_without_config_json_fails(account):
    account.config["model"]["s3_uri"] = "s3://my-models/llama-3.1-8b-synced/"
    account.aws.s3.put_object(Bucket="my-models", Key="llama-3.1-8b-synced/config.json", Body=b"{}")  # aws s3 sync
    code, status, text = account.status("model")
    assert (code, status) == (1, "FAIL") and "no flotilla-manifest.json at s3://my-models/llama-3.1-8b-synced/" in text
    assert "flotilla publish --source <model directory> --uri s3://my-models/llama-3.1-8b-synced/" in text
    weights = account.tmp / "weights-only"
    weights.mkdir()
    (weights / "model.safetensors").write_bytes(b"\1")
    publish(weights, "s3://my-models/llama-3.1-8b-synced/", s3=account.aws.s3)
    assert "lists no config.json" in account.status("model")[2]


def test_a_published_model_of_another_shape_than_the_config_gives_fails(account):
    other = account.tmp / "llama-3.1-70b"
    other.mkdir()
    (other / "config.json").write_text(json.dumps(preset("llama-3.1-70b").to_hf_config()))
    (other / "model.safetensors").write_bytes(b"\2")
    publish(other, "s3://my-models/llama-3.1-70b/", s3=account.aws.s3)
    account.config["model"]["s3_uri"] = "s3://my-models/llama-3.1-70b/"  # the config still says 8B
    code, status, text = account.status("model")
    assert (code, status) == (1, "FAIL") and "is another model than the config's" in text
    assert "num_hidden_layers 80 (the config: 32)" in text and "num_attention_heads 64 (the config: 32)" in text


def test_a_certificate_not_issued_or_in_another_region_fails_and_none_warns(account, monkeypatch):
    monkeypatch.setattr(moto.settings, "ACM_VALIDATION_WAIT", 3600)
    pending = account.aws.acm.request_certificate(DomainName="new.example.com", ValidationMethod="DNS")
    account.config["certificate_arn"] = pending["CertificateArn"]
    code, status, text = account.status("certificate")
    assert (code, status) == (1, "FAIL") and "new.example.com: PENDING_VALIDATION" in text
    account.config["certificate_arn"] = account.certificate_arn.replace(f":{REGION}:", ":us-west-2:")
    code, status, text = account.status("certificate")
    assert (code, status) == (1, "FAIL") and f"is in us-west-2; the ALB is in {REGION}" in text
    del account.config["certificate_arn"]
    assert account.status("certificate")[:2] == (0, "WARN")


def test_the_api_key_secret_must_exist_unless_keys_are_off(account):
    name = secret_name("flotilla")
    account.aws.secretsmanager.delete_secret(SecretId=name, RecoveryWindowInDays=7)
    code, status, text = account.status("api-keys")
    assert (code, status) == (1, "FAIL") and f"{name} is scheduled for deletion" in text
    account.aws.secretsmanager.delete_secret(SecretId=name, ForceDeleteWithoutRecovery=True)
    code, status, text = account.status("api-keys")
    assert (code, status) == (1, "FAIL") and "flotilla keys create --deployment flotilla" in text
    account.config["front"] = {"api_keys": False}
    assert account.status("api-keys")[:2] == (0, "PASS")


def test_an_image_not_in_ecr_fails_and_without_an_image_docker_must_be_here(account, monkeypatch):
    account.config["image"] = IMAGE.replace(":1.0", ":2.0")
    code, status, text = account.status("image")
    assert (code, status) == (1, "FAIL") and "ImageNotFoundException" in text
    del account.config["image"]
    monkeypatch.setattr(shutil, "which", lambda name: None)
    code, status, text = account.status("image")
    assert (code, status) == (1, "FAIL") and "docker is not on PATH" in text
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    assert account.status("image")[:2] == (0, "PASS")


def test_the_cdk_bootstrap_stack_must_exist_at_a_version_the_templates_accept(account):
    account.aws.ssm.put_parameter(
        Name=BOOTSTRAP_VERSION_PARAMETER, Value=str(MIN_BOOTSTRAP_VERSION - 1), Type="String", Overwrite=True
    )
    code, status, text = account.status("bootstrap")
    assert (code, status) == (1, "FAIL") and f"the templates need {MIN_BOOTSTRAP_VERSION} or later" in text
    account.aws.cloudformation.delete_stack(StackName="CDKToolkit")
    code, status, text = account.status("bootstrap")
    assert (code, status) == (1, "FAIL") and f"cdk bootstrap aws://{ACCOUNT}/{REGION}" in text


def test_credentials_of_another_account_than_the_config_names_fail(account):
    account.config["account"] = "210987654321"
    code, status, text = account.status("account")
    assert (code, status) == (1, "FAIL") and "the config names account 210987654321" in text


def test_a_region_flag_that_contradicts_the_config_is_bad_input(account, run_cli_err):
    path = account.tmp / "prod.yaml"
    path.write_text(yaml.safe_dump(account.config))
    code, _, err = run_cli_err("preflight", "--config", str(path), "--region", "us-west-2", "--json")
    assert code == 2 and "differs from the config's region us-east-1" in err


# --- make deploy runs it first ----------------------------------------------------------------------
def _make_n(*argv: str) -> list[str]:
    """The commands `make -n ARGV` would run, installs left out (stamps may be missing in a checkout)."""
    proc = subprocess.run(["make", "-n", *argv], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return [line for line in proc.stdout.splitlines() if "pip " not in line and "ops-requirements" not in line]


@pytest.mark.parametrize("target", ["deploy", "deploy-new-units"])
def test_make_deploy_runs_preflight_on_the_same_config_before_cdk_deploy(target):
    lines = _make_n(target, "CONFIG=examples/staging.yaml")
    (deploy,) = [i for i, line in enumerate(lines) if line.startswith("node_modules/.bin/cdk deploy")]
    (preflight,) = [i for i, line in enumerate(lines) if " -m ops preflight" in line]
    assert preflight < deploy and "-c config=examples/staging.yaml" in lines[deploy]
    argv = lines[preflight].split(" -m ops ", 1)[1].split()
    args = build_parser().parse_args(argv)  # the line is a real `flotilla` command
    assert args.handler is run_preflight and args.config == "examples/staging.yaml"
    # Make stops at the first command that fails: a FAIL (exit 1) never reaches cdk deploy.
    assert not lines[preflight].lstrip().startswith("-")


@pytest.mark.parametrize("target", ["deploy", "deploy-new-units"])
def test_preflight_0_skips_it_and_says_so(target):
    lines = _make_n(target, "PREFLIGHT=0")
    assert not any(" -m ops preflight" in line for line in lines)
    assert 'echo "preflight skipped (PREFLIGHT=0)"' in lines
    assert any(line.startswith("node_modules/.bin/cdk deploy --all") for line in lines)


def test_an_eagle_draft_the_published_model_does_not_hold_fails(account):
    account.config["speculation"] = {"method": "eagle", "draft": "eagle-draft"}
    account.config["node"] = {"neuron_sampling": "device"}  # what EAGLE needs (stacks/speculation.py)
    code, status, text = account.status("model")
    assert (code, status) == (1, "FAIL") and "lists no eagle-draft/config.json" in text
