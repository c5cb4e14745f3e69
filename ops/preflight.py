"""The checks `flotilla preflight` runs: a deployment config against the account it is about to be
deployed to, read-only. Each check reads what AWS says and returns findings (PASS, WARN or FAIL, what
it saw, the fix), so a deploy that would fail an hour in (no quota, no capacity, no model, no
bootstrap) fails here in seconds instead.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import botocore.exceptions

from contract import Engine
from contract.apikeys import KeySet, KeySetError, secret_name
from contract.llama import LlamaShape, ShapeError
from contract.manifest import MANIFEST_NAME, MODEL_CONFIG_NAME, Manifest, ManifestError, parse_s3_uri
from ops.aws import Aws
from ops.node_boot import BootCheck, ami_checks, artifact_checks

if TYPE_CHECKING:
    from stacks.config import FlotillaConfig

PASS, WARN, FAIL = "PASS", "WARN", "FAIL"
GIB = 2**30

# aws-cdk-lib 2.275.0, core/lib/stack-synthesizers/default-synthesizer.js: the default synthesizer's
# templates need bootstrap version >= MIN_BOOTSTRAP_STACK_VERSION=6 (their CheckBootstrapVersion rule
# refuses 1-5), read from DEFAULT_BOOTSTRAP_STACK_VERSION_SSM_PARAMETER "/cdk-bootstrap/${Qualifier}/version"
# with DEFAULT_QUALIFIER "hnb659fds"; the CLI's bootstrap stack is named CDKToolkit by default.
MIN_BOOTSTRAP_VERSION = 6
BOOTSTRAP_VERSION_PARAMETER = "/cdk-bootstrap/hnb659fds/version"
BOOTSTRAP_STACK = "CDKToolkit"
# ACM: "Certificates in ACM are regional resources. To use a certificate with Elastic Load Balancing
# ... in more than one AWS region, you must request or import a certificate for each region" (ACM user
# guide, acm-regions.html). A certificate that expires within this long gets a warning.
CERTIFICATE_WARN_DAYS = 30
_ECR_IMAGE_RE = re.compile(
    r"^(?P<account>\d{12})\.dkr\.ecr\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(\.cn)?/(?P<repo>[^:@]+)"
    r"(:(?P<tag>[\w.-]{1,128})|@(?P<digest>sha256:[0-9a-f]{64}))$"
)
_STACK_READY = ("CREATE_COMPLETE", "UPDATE_COMPLETE", "UPDATE_ROLLBACK_COMPLETE", "IMPORT_COMPLETE")


@dataclass(frozen=True)
class Finding:
    check: str
    status: str  # PASS, WARN or FAIL
    saw: str  # what AWS (or the config) said
    fix: str = ""  # what to do about a WARN or FAIL

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass(frozen=True)
class Target:
    """Where the config is about to go: the account and region the credentials reach."""

    account: str
    region: str


def _code(err: botocore.exceptions.ClientError) -> str:
    return str(err.response.get("Error", {}).get("Code", ""))


def nodes_needed(cfg: FlotillaConfig) -> tuple[int, int]:
    """Instances the fleet runs, and at most while every unit rolls with surge (ASG maxima)."""
    return cfg.units * cfg.nodes_per_unit, cfg.units * cfg.max_nodes_per_unit


def unit_azs(cfg: FlotillaConfig) -> tuple[str, ...]:
    """The AZs units launch in: capacity.availability_zones, else every AZ the VPC names."""
    return tuple(cfg.capacity.availability_zones) or tuple(cfg.availability_zones)


# --- the checks -----------------------------------------------------------------------------------
def check_account(cfg: FlotillaConfig, aws: Aws, target: Target) -> list[Finding]:  # noqa: ARG001 - every check has one signature
    saw = f"credentials for account {target.account}, region {target.region}"
    if cfg.account and cfg.account != target.account:
        return [
            Finding(
                "account",
                FAIL,
                f"{saw}; the config names account {cfg.account}",
                f"use credentials of account {cfg.account} (--profile), or correct `account`",
            )
        ]
    return [Finding("account", PASS, saw)]


def check_quota(cfg: FlotillaConfig, aws: Aws, target: Target) -> list[Finding]:
    from stacks.config import quota_notices  # noqa: PLC0415 - stacks/ only when a config is read

    notice = next(n for n in quota_notices(cfg) if n.key.endswith("vcpus"))
    try:
        quota = aws.servicequotas.get_service_quota(ServiceCode="ec2", QuotaCode=notice.code)["Quota"]
    except botocore.exceptions.ClientError as err:
        if _code(err) != "NoSuchResourceException":
            raise
        # GetServiceQuota: "For some quotas, only the default values are available. If the applied
        # quota value is not available for a quota, the quota is not retrieved" (Service Quotas API
        # reference): then AWS's default is what is in force.
        quota = aws.servicequotas.get_aws_default_service_quota(ServiceCode="ec2", QuotaCode=notice.code)["Quota"]
    value = int(quota["Value"])
    saw = (
        f'"{notice.quota}" ({notice.code}) is {value:,} vCPUs in {target.region}; this config needs {notice.needed:,} '
        f"({notice.counted}), {notice.peak:,} while units roll out with surge; other instances of the family "
        "in the account count against it too"
    )
    fix = (
        f"aws service-quotas request-service-quota-increase --service-code ec2 --quota-code {notice.code} "
        f"--desired-value {notice.peak} --region {target.region}"
    )
    if value < notice.needed:
        return [Finding("quota", FAIL, saw, fix)]
    if value < notice.peak:
        return [Finding("quota", WARN, saw, f"a surge rollout needs {notice.peak:,}: {fix}")]
    return [Finding("quota", PASS, saw)]


def check_offerings(cfg: FlotillaConfig, aws: Aws, target: Target) -> list[Finding]:
    offered: set[str] = set()
    pages = aws.ec2.get_paginator("describe_instance_type_offerings").paginate(
        LocationType="availability-zone", Filters=[{"Name": "instance-type", "Values": [cfg.instance_type]}]
    )
    for page in pages:
        offered.update(o["Location"] for o in page.get("InstanceTypeOfferings", []))
    where = ", ".join(sorted(offered)) or "no AZ"
    azs = unit_azs(cfg)
    if not azs:
        return [
            Finding(
                "availability-zones",
                WARN,
                f"no availability_zones: the VPC takes the first three AZs of {target.region} whatever they "
                f"offer; {cfg.instance_type} is offered in {where}",
                "name 2 to 6 of those AZs in availability_zones",
            )
        ]
    missing = [az for az in azs if az not in offered]
    if missing:
        return [
            Finding(
                "availability-zones",
                FAIL,
                f"{cfg.instance_type} is not offered in {', '.join(missing)} (offered in {where}); units placed "
                "there can never launch",
                "list only AZs that offer it in availability_zones (and capacity.availability_zones)",
            )
        ]
    return [Finding("availability-zones", PASS, f"{cfg.instance_type} is offered in {', '.join(azs)}")]


def _reservation_problems(cfg: FlotillaConfig, r: dict[str, Any], now: datetime) -> list[tuple[str, str, str]]:
    """(status, what is wrong, fix) for each way the reservation does not fit the config."""
    out: list[tuple[str, str, str]] = []
    block = r.get("ReservationType") == "capacity-block"
    if r.get("InstanceType") != cfg.instance_type:
        out.append((FAIL, f"holds {r.get('InstanceType')}, not {cfg.instance_type}", "name a reservation of that type"))
    azs = unit_azs(cfg)
    if azs and r.get("AvailabilityZone") not in azs:
        out.append(
            (FAIL, f"is in {r.get('AvailabilityZone')}, not {azs[0]}", "set capacity.availability_zones to its AZ")
        )
    if block != (cfg.capacity.market == "capacity-block"):
        want = "capacity-block" if block else "on-demand"
        out.append(
            (FAIL, f"is a {'Capacity Block' if block else 'Capacity Reservation'}", f"set capacity.market {want}")
        )
    state, start = r.get("State"), r.get("StartDate")
    if state in ("scheduled", "payment-pending", "pending", "assessing", "delayed"):
        when = f" (starts {start:%Y-%m-%d %H:%M} UTC)" if isinstance(start, datetime) else ""
        out.append(
            (
                FAIL,
                f"is {state}{when}: launches into it before it starts fail with insufficient capacity",
                "deploy once it is active (docs/runbooks/capacity-block-not-started.md)",
            )
        )
    elif state != "active":
        out.append((FAIL, f"is {state}", "name an active reservation, or remove capacity.reservation_id"))
    end = r.get("EndDate")
    if state == "active" and isinstance(end, datetime) and end - now < timedelta(days=1):
        out.append((WARN, f"ends {end:%Y-%m-%d %H:%M} UTC", "plan the fleet's capacity after it ends"))
    steady, peak = nodes_needed(cfg)
    free = int(r.get("AvailableInstanceCount", 0))
    if free < steady:
        out.append((FAIL, f"has {free} free instance(s); the fleet needs {steady}", "reserve more, or lower units"))
    elif free < peak:
        out.append((WARN, f"has {free} free instance(s): a surge rollout needs {peak}", "use unit_rollout: replace"))
    group = (r.get("PlacementGroupArn") or "").rsplit("/", 1)[-1] or None
    configured = cfg.unit_placement_group
    if group != configured:
        out.append(
            (
                FAIL,
                f"was created in placement group {group or '(none)'}, the config names {configured or 'none'}",
                f"set capacity.placement_group to {group or 'none'} (EC2 launches into a reservation only from "
                "its own placement group)",
            )
        )
    return out


def check_capacity(cfg: FlotillaConfig, aws: Aws, target: Target) -> list[Finding]:
    cap = cfg.capacity
    if cap.reservation_group_arn:
        return [
            Finding(
                "capacity",
                WARN,
                f"capacity.reservation_group_arn {cap.reservation_group_arn}: preflight does not read resource groups",
                f"check its reservations: aws resource-groups list-group-resources --group {cap.reservation_group_arn}",
            )
        ]
    if not cap.reservation_id:
        return [Finding("capacity", PASS, "no reservation named: On-Demand capacity, as EC2 has it at launch")]
    try:
        (r,) = aws.capacity.describe_capacity_reservations(CapacityReservationIds=[cap.reservation_id])[
            "CapacityReservations"
        ]
    except botocore.exceptions.ClientError as err:
        if not _code(err).startswith("InvalidCapacityReservationId"):
            raise
        return [
            Finding(
                "capacity",
                FAIL,
                f"capacity.reservation_id {cap.reservation_id} is not in account {target.account}, {target.region}",
                "name a reservation of this account and region",
            )
        ]
    start, end = r.get("StartDate"), r.get("EndDate")
    saw = (
        f"{cap.reservation_id}: {r.get('ReservationType', 'default')} {r.get('State')}, "
        f"{r.get('AvailableInstanceCount')}/{r.get('TotalInstanceCount')} x {r.get('InstanceType')} free in "
        f"{r.get('AvailabilityZone')}"
        + (f", from {start:%Y-%m-%d %H:%M}" if isinstance(start, datetime) else "")
        + (f" to {end:%Y-%m-%d %H:%M} UTC" if isinstance(end, datetime) else "")
    )
    problems = _reservation_problems(cfg, r, datetime.now(UTC))
    if not problems:
        return [Finding("capacity", PASS, saw)]
    return [Finding("capacity", status, f"{saw}: it {what}", fix) for status, what, fix in problems]


def _findings(check: str, boot_checks: list[BootCheck]) -> list[Finding]:
    return [Finding(check, PASS if c.ok else FAIL, f"{c.name} {c.detail}", c.fix) for c in boot_checks]


def check_ami(cfg: FlotillaConfig, aws: Aws, target: Target) -> list[Finding]:
    """The pinned AMI release's public parameter resolves in the region (ops/node_boot.py)."""
    return _findings("ami", ami_checks(cfg, ssm=aws.ami, region=target.region))


def check_boot_artifacts(cfg: FlotillaConfig, aws: Aws, target: Target) -> list[Finding]:
    """What the nodes' user data installs is staged in the model bucket with its pinned SHA-256, in
    the region: else every node powers off at boot (ops/node_boot.py)."""
    found = artifact_checks(cfg, s3=aws.s3, region=target.region)
    if not found:
        return [Finding("boot-artifacts", PASS, f"{cfg.instance_type} nodes install nothing at boot")]
    return _findings("boot-artifacts", found)


def check_model(cfg: FlotillaConfig, aws: Aws, target: Target) -> list[Finding]:  # noqa: ARG001 - every check has one signature
    if cfg.node.engine != Engine.NEURON:
        return [Finding("model", PASS, f"node.engine {cfg.node.engine} reads no model from S3")]
    uri = cfg.model.s3_uri
    bucket, prefix = parse_s3_uri(uri)
    publish = f"flotilla publish --source <model directory> --uri {uri}"
    try:
        body = aws.s3.get_object(Bucket=bucket, Key=prefix + MANIFEST_NAME)["Body"].read()
    except botocore.exceptions.ClientError as err:
        if _code(err) not in ("NoSuchKey", "NoSuchBucket", "404"):
            raise
        return [Finding("model", FAIL, f"no {MANIFEST_NAME} at {uri}: every node would refuse to start", publish)]
    try:
        manifest = Manifest.from_json(body, source=f"{uri}{MANIFEST_NAME}")
    except ManifestError as err:
        return [Finding("model", FAIL, str(err), publish)]
    listed = {f.path for f in manifest.files}
    if MODEL_CONFIG_NAME not in listed:
        return [
            Finding("model", FAIL, f"{uri} lists no {MODEL_CONFIG_NAME}: nodes read the model's shape there", publish)
        ]
    draft = cfg.speculation.draft
    if draft and f"{draft}/{MODEL_CONFIG_NAME}" not in listed:
        # The node refuses the same (runtime/engines/neuron/prepare.py): the draft comes in the manifest.
        return [
            Finding(
                "model",
                FAIL,
                f"{uri} lists no {draft}/{MODEL_CONFIG_NAME}: speculation.draft {draft!r} is not published with it",
                f"put the EAGLE draft checkpoint in the model directory's {draft}/, then {publish}",
            )
        ]
    saw = f"{uri}: {len(manifest.files)} files, {manifest.total_bytes / GIB:.2f} GiB, digest {manifest.digest[:12]}"
    body = aws.s3.get_object(Bucket=bucket, Key=prefix + MODEL_CONFIG_NAME)["Body"].read()
    mismatch = published_shape_mismatch(cfg, body, source=f"{uri}{MODEL_CONFIG_NAME}")
    if mismatch:
        return [Finding("model", FAIL, f"{saw}; {mismatch}", f"{publish} (the model the config describes)")]
    return [Finding("model", PASS, f"{saw}; its {MODEL_CONFIG_NAME} is the shape synth checked the layout of")]


def published_shape_mismatch(cfg: FlotillaConfig, body: bytes, *, source: str) -> str | None:
    """How the published config.json differs from the shape the config gives (None: it does not).
    Synth checks the units' layout against the config's shape (stacks/model_config.py); the nodes check
    it again at start against the config.json they fetch (runtime/engines/neuron/prepare.py), so the
    two must be one shape, or a layout synth accepted is refused by every node."""
    from stacks.model_config import model_shape  # noqa: PLC0415 - stacks/ only when a config is read

    resolved = model_shape(cfg)
    if resolved is None:
        return None
    try:
        published = LlamaShape.from_config(json.loads(body), source=source)
    except (ShapeError, ValueError) as err:
        return f"{source} is not a usable config.json ({err})"
    configured = resolved[0].layout_fields()
    differ = [
        f"{k} {v} (the config: {configured[k]})" for k, v in published.layout_fields().items() if v != configured[k]
    ]
    if differ:
        return f"{source} is another model than the config's: {', '.join(differ)}"
    return None


def check_certificate(cfg: FlotillaConfig, aws: Aws, target: Target) -> list[Finding]:
    arn = cfg.certificate_arn
    if not arn:
        return [
            Finding(
                "certificate",
                WARN,
                "no certificate_arn: the ALB serves plain HTTP",
                "request an ACM certificate in the deployment's region and set certificate_arn",
            )
        ]
    region = arn.split(":")[3]
    if region != target.region:
        return [
            Finding(
                "certificate",
                FAIL,
                f"{arn} is in {region}; the ALB is in {target.region} (ACM certificates are regional)",
                f"request or import a certificate in {target.region} and set certificate_arn to it",
            )
        ]
    try:
        cert = aws.acm.describe_certificate(CertificateArn=arn)["Certificate"]
    except botocore.exceptions.ClientError as err:
        if _code(err) != "ResourceNotFoundException":
            raise
        return [Finding("certificate", FAIL, f"{arn} does not exist", "set certificate_arn to an existing certificate")]
    status, not_after = cert.get("Status"), cert.get("NotAfter")
    saw = f"{cert.get('DomainName')}: {status}" + (f", valid to {not_after:%Y-%m-%d}" if not_after else "")
    if status != "ISSUED":
        return [
            Finding("certificate", FAIL, saw, "complete its validation (ACM console or DNS records), or replace it")
        ]
    if not_after and not_after - datetime.now(UTC) < timedelta(days=CERTIFICATE_WARN_DAYS):
        return [Finding("certificate", WARN, saw, "renew or replace it (docs/runbooks/certificate-rotation.md)")]
    return [Finding("certificate", PASS, saw)]


def check_api_keys(cfg: FlotillaConfig, aws: Aws, target: Target) -> list[Finding]:
    if not cfg.front.api_keys:
        return [Finding("api-keys", PASS, "front.api_keys is false: the routers take requests without a key")]
    name = secret_name(cfg.deployment_name)
    create = f"flotilla keys create --deployment {cfg.deployment_name} --region {target.region} --name <holder> --yes"
    try:
        secret = aws.secretsmanager.describe_secret(SecretId=name)
    except botocore.exceptions.ClientError as err:
        if _code(err) != "ResourceNotFoundException":
            raise
        return [Finding("api-keys", FAIL, f"no secret {name}: every router would refuse every request", create)]
    if secret.get("DeletedDate"):
        return [
            Finding(
                "api-keys",
                FAIL,
                f"{name} is scheduled for deletion ({secret['DeletedDate']:%Y-%m-%d}); the routers cannot read it",
                f"delete it for good (aws secretsmanager delete-secret --secret-id {name} "
                f"--force-delete-without-recovery), then {create}",
            )
        ]
    try:
        keys = KeySet.loads(aws.secretsmanager.get_secret_value(SecretId=name)["SecretString"])
    except KeySetError as err:
        return [Finding("api-keys", FAIL, f"{name} holds no key set ({err})", "restore a previous version of it")]
    if not keys.keys:
        return [Finding("api-keys", WARN, f"{name} holds no key: every request would get 401", create)]
    return [Finding("api-keys", PASS, f"{name} holds {len(keys.keys)} key(s)")]


def check_image(cfg: FlotillaConfig, aws: Aws, target: Target) -> list[Finding]:
    if not cfg.image:
        docker = shutil.which("docker")
        if docker is None:
            return [
                Finding(
                    "image",
                    FAIL,
                    "no image set: cdk deploy builds the images from runtime/ with Docker, and docker is not on PATH",
                    "install Docker here, or push an image and set `image` to it",
                )
            ]
        return [Finding("image", PASS, f"no image set: cdk deploy builds it from runtime/ with {docker}")]
    m = _ECR_IMAGE_RE.match(cfg.image)
    if m is None:
        return [Finding("image", WARN, f"{cfg.image} is not in ECR: preflight cannot see it", "check it by hand")]
    if m["region"] != target.region:
        return [
            Finding("image", WARN, f"{cfg.image} is in {m['region']}, not {target.region}", "push it to this region")
        ]
    ref = {"imageTag": m["tag"]} if m["tag"] else {"imageDigest": m["digest"]}
    try:
        (image,) = aws.ecr.describe_images(registryId=m["account"], repositoryName=m["repo"], imageIds=[ref])[
            "imageDetails"
        ]
    except botocore.exceptions.ClientError as err:
        if _code(err) not in ("ImageNotFoundException", "RepositoryNotFoundException"):
            raise
        return [
            Finding("image", FAIL, f"{cfg.image}: {_code(err)}", f"push it (docker push {cfg.image}) or fix `image`")
        ]
    pushed = image.get("imagePushedAt")
    return [Finding("image", PASS, f"{cfg.image}" + (f", pushed {pushed:%Y-%m-%d %H:%M}" if pushed else ""))]


def check_bootstrap(cfg: FlotillaConfig, aws: Aws, target: Target) -> list[Finding]:  # noqa: ARG001 - every check has one signature
    bootstrap = f"node_modules/.bin/cdk bootstrap aws://{target.account}/{target.region}"
    try:
        (stack,) = aws.cloudformation.describe_stacks(StackName=BOOTSTRAP_STACK)["Stacks"]
    except botocore.exceptions.ClientError as err:
        if _code(err) != "ValidationError":  # CloudFormation's answer for a stack that does not exist
            raise
        return [Finding("bootstrap", FAIL, f"no {BOOTSTRAP_STACK} stack in {target.region}", bootstrap)]
    status = stack["StackStatus"]
    if status not in _STACK_READY:
        return [Finding("bootstrap", FAIL, f"{BOOTSTRAP_STACK} is {status}", f"repair it, then {bootstrap}")]
    try:
        version = int(aws.ssm.get_parameter(Name=BOOTSTRAP_VERSION_PARAMETER)["Parameter"]["Value"])
    except botocore.exceptions.ClientError as err:
        if _code(err) != "ParameterNotFound":
            raise
        return [
            Finding("bootstrap", FAIL, f"{BOOTSTRAP_STACK} {status} but no {BOOTSTRAP_VERSION_PARAMETER}", bootstrap)
        ]
    saw = f"{BOOTSTRAP_STACK} {status}, version {version} ({BOOTSTRAP_VERSION_PARAMETER})"
    if version < MIN_BOOTSTRAP_VERSION:
        return [Finding("bootstrap", FAIL, f"{saw}; the templates need {MIN_BOOTSTRAP_VERSION} or later", bootstrap)]
    return [Finding("bootstrap", PASS, saw)]


Check = Callable[["FlotillaConfig", Aws, Target], list[Finding]]
# Each check with the IAM actions it needs: named in the finding when AWS refuses one.
CHECKS: tuple[tuple[str, Check, tuple[str, ...]], ...] = (
    ("account", check_account, ("sts:GetCallerIdentity",)),
    ("quota", check_quota, ("servicequotas:GetServiceQuota", "servicequotas:GetAWSDefaultServiceQuota")),
    ("availability-zones", check_offerings, ("ec2:DescribeInstanceTypeOfferings",)),
    ("capacity", check_capacity, ("ec2:DescribeCapacityReservations",)),
    ("ami", check_ami, ("ssm:GetParameter",)),
    ("boot-artifacts", check_boot_artifacts, ("s3:GetBucketLocation", "s3:GetObject")),
    ("model", check_model, ("s3:GetObject",)),
    ("certificate", check_certificate, ("acm:DescribeCertificate",)),
    ("api-keys", check_api_keys, ("secretsmanager:DescribeSecret", "secretsmanager:GetSecretValue")),
    ("image", check_image, ("ecr:DescribeImages",)),
    ("bootstrap", check_bootstrap, ("cloudformation:DescribeStacks", "ssm:GetParameter")),
)


def run_checks(cfg: FlotillaConfig, aws: Aws, target: Target) -> list[Finding]:
    """Every check in order; one AWS refuses or fails is a FAIL naming the error and the IAM actions."""
    out: list[Finding] = []
    for name, check, actions in CHECKS:
        try:
            out.extend(check(cfg, aws, target))
        except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as err:
            out.append(
                Finding(name, FAIL, f"could not read: {err}", f"allow {', '.join(actions)} to these credentials")
            )
    return out
