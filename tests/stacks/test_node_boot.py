"""A node boots without the internet: the synthesized user data names no host outside the
deployment's own bucket, the instance metadata service and S3's regional endpoint (which the VPC's
gateway endpoint carries), runs no package manager or downloader, fits EC2's user-data limit, and the
instance role may read exactly the artifacts it installs. The fetch helper signs its request as
botocore (AWS's own SDK) signs it, and parses as the AMI's Python 3.9."""

from __future__ import annotations

import ast
import datetime
import re
from pathlib import Path

import pytest

from contract.node_boot import ALL_BOOT_ARTIFACTS, EFA_INSTALLER, boot_artifacts
from stacks import node_fetch

# Every "scheme://" the user data may hold: the instance metadata service (a link-local address,
# EC2 user guide, "Access instance metadata") and S3's regional endpoints, whose bucket, region and
# domain the helper fills in on the node (the bucket from its command line, region and domain from
# the metadata service).
ALLOWED_URLS = {
    "http://169.254.169.254",
    "https://{bucket}.s3.{region}.{domain}/{key}",
    "https://s3.{region}.{domain}/{bucket}/{key}",
    "s3://{bucket}/{key}",  # the object's name in the helper's messages
}
URL = re.compile(r"[a-z][a-z0-9+.-]*://[^\s\"'<>)]*")
# A DNS name written out (the S3 domain comes from the metadata service, so none is needed).
HOSTNAME = re.compile(r"\b[a-z0-9-]+(?:\.[a-z0-9-]+)*\.(?:com|net|org|io|dev|aws|cn|gov|sh)\b", re.I)
# Commands that fetch or install from somewhere else than the bucket.
FETCHERS = re.compile(r"(?:^|[\s;&|(`$])(dnf|yum|rpm|curl|wget|pip3?|aws|git|apt-get)\s", re.M)
# "User data is limited to 16 KB, in raw form, before it is base64-encoded" (EC2 user guide,
# instancedata-add-user-data.html); the cluster name CDK appends counts as one character here.
EC2_USER_DATA_LIMIT = 16 * 1024


def user_data_of(synth, stack: str) -> list[str]:
    out = []
    for lt in synth.resources(stack, "AWS::EC2::LaunchTemplate").values():
        parts = lt["Properties"]["LaunchTemplateData"]["UserData"]["Fn::Base64"]
        # Tokens (the cluster name CDK appends) become a placeholder: they are names, not hosts.
        out.append(
            parts if isinstance(parts, str) else "".join(p if isinstance(p, str) else "X" for p in parts["Fn::Join"][1])
        )
    return out


def fetched_buckets(user_data: str) -> set[str]:
    return set(re.findall(rf"python3 {re.escape('/var/lib/flotilla/boot/node_fetch.py')} (\S+) ", user_data))


def boot_urls_problems(user_data: str, buckets: set[str]) -> list[str]:
    problems = [f"URL {u}" for u in URL.findall(user_data) if u.rstrip(":;,.") not in ALLOWED_URLS]
    problems += [f"host name {h}" for h in HOSTNAME.findall(user_data)]
    problems += [f"command {c}" for c in FETCHERS.findall(user_data)]
    problems += [f"bucket {b} is not the deployment's" for b in fetched_buckets(user_data) - buckets]
    return problems


SYNTHS = ["default_synth", "trn1n_synth", "staging_synth", "fleet_synth"]


@pytest.mark.parametrize("synth_name", SYNTHS)
def test_the_boot_reaches_only_the_deployments_bucket_and_aws_endpoints(synth_name, request):
    synth = request.getfixturevalue(synth_name)
    config = synth.deployment.config
    buckets = {config.model.bucket}
    cells = [s for s in synth.templates if s.startswith("Cell-")]
    texts = [text for stack in cells for text in user_data_of(synth, stack)]
    assert texts
    for text in texts:
        assert boot_urls_problems(text, buckets) == []
        assert len(text.encode()) < EC2_USER_DATA_LIMIT
        if config.shape.efa_interfaces:
            assert fetched_buckets(text) == buckets


def test_the_url_check_catches_an_internet_download_a_package_install_and_a_foreign_bucket(default_synth):
    """The check above is only as good as what it refuses: the boot as it was (the installer from
    AWS's download host, mdadm from the package repositories) and a bucket outside the config."""
    (text,) = user_data_of(default_synth, "Cell-0")
    buckets = {default_synth.deployment.config.model.bucket}
    assert boot_urls_problems(text, buckets) == []
    mutated = {
        "curl -O https://efa-installer.amazonaws.com/aws-efa-installer-1.47.0.tar.gz\n": ["URL", "command", "host"],
        "command -v mdadm >/dev/null || dnf install -y mdadm\n": ["command"],
        f"python3 /var/lib/flotilla/boot/node_fetch.py other-bucket {EFA_INSTALLER.key} x /tmp/x\n": ["bucket"],
    }
    for line, kinds in mutated.items():
        problems = boot_urls_problems(text.replace("modprobe efa\n", line + "modprobe efa\n"), buckets)
        assert sorted({p.split()[0] for p in problems}) == sorted(kinds), (line, problems)


def _instance_role_s3_statements(synth, stack: str) -> list[dict]:
    out = []
    for logical_id, policy in synth.resources(stack, "AWS::IAM::Policy").items():
        if not logical_id.startswith("InstanceRole"):
            continue
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            if any(a.startswith("s3:") for a in actions):
                out.append(statement)
    return out


def _arn(resource) -> str:
    return "".join(p if isinstance(p, str) else "<partition>" for p in resource["Fn::Join"][1])


def test_the_instance_role_reads_exactly_the_artifacts_the_boot_installs(default_synth, staging_synth):
    config = default_synth.deployment.config
    (statement,) = _instance_role_s3_statements(default_synth, "Cell-0")
    assert statement["Action"] == "s3:GetObject" and statement["Effect"] == "Allow"
    resources = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
    assert [_arn(r) for r in resources] == [
        f"arn:<partition>:s3:::{config.model.bucket}/{a.key}" for a in boot_artifacts(efa_interfaces=8)
    ]
    # x86 staging hosts install nothing, so their role reads nothing.
    for stack in (s for s in staging_synth.templates if s.startswith("Cell-")):
        assert _instance_role_s3_statements(staging_synth, stack) == []


def test_the_network_routes_s3_through_a_gateway_endpoint_on_every_private_subnet(default_synth):
    template = default_synth.template("Network")
    resources = template["Resources"]
    (endpoint,) = [
        r
        for r in resources.values()
        if r["Type"] == "AWS::EC2::VPCEndpoint" and "s3" in str(r["Properties"]["ServiceName"])
    ]
    assert endpoint["Properties"].get("VpcEndpointType", "Gateway") == "Gateway"
    routed = {t["Ref"] for t in endpoint["Properties"]["RouteTableIds"]}
    private_tables = {
        r["Properties"]["RouteTableId"]["Ref"]
        for logical_id, r in resources.items()
        if r["Type"] == "AWS::EC2::SubnetRouteTableAssociation" and "Private" in logical_id
    }
    assert private_tables and private_tables <= routed


def test_the_fetch_helper_signs_its_request_as_botocore_signs_it():
    """Signature Version 4 from the standard library must equal AWS's own SDK's for the same request
    (botocore.auth.SigV4Auth, the signer the AWS CLI uses), or S3 refuses it at boot."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    creds = {"AccessKeyId": "ASIAEXAMPLE", "SecretAccessKey": "wJalrXUtnFEMI/K7MDENG", "Token": "FwoGZXIvYXdzEXAMPLE"}
    now = datetime.datetime(2026, 5, 4, 3, 2, 1, tzinfo=datetime.timezone.utc)
    for bucket in ("flotilla-models-example", "models.example.com"):
        url = node_fetch.object_url(bucket, EFA_INSTALLER.key, "eu-west-1", "amazonaws.com")
        ours = node_fetch.signed_headers(url, "eu-west-1", creds, now)
        request = AWSRequest(
            method="GET",
            url=url,
            headers={k: v for k, v in ours.items() if k != "authorization"},
        )
        request.context["timestamp"] = now.strftime("%Y%m%dT%H%M%SZ")
        signer = SigV4Auth(
            Credentials(creds["AccessKeyId"], creds["SecretAccessKey"], creds["Token"]), "s3", "eu-west-1"
        )
        canonical = signer.canonical_request(request)
        signature = signer.signature(signer.string_to_sign(request, canonical), request)
        assert ours["authorization"] == (
            f"AWS4-HMAC-SHA256 Credential={creds['AccessKeyId']}/20260504/eu-west-1/s3/aws4_request, "
            f"SignedHeaders={signer.signed_headers(signer.headers_to_sign(request))}, Signature={signature}"
        )


def test_the_fetch_helper_addresses_dotted_buckets_in_the_path():
    # "When you use virtual-hosted-style buckets with SSL, the SSL wildcard certificate only matches
    # buckets that do not contain periods" (S3 user guide, "Virtual hosting of buckets").
    assert node_fetch.object_url("models", "a/b.tar.gz", "us-east-1", "amazonaws.com") == (
        "https://models.s3.us-east-1.amazonaws.com/a/b.tar.gz"
    )
    assert node_fetch.object_url("models.example", "a/b.tar.gz", "us-east-1", "amazonaws.com") == (
        "https://s3.us-east-1.amazonaws.com/models.example/a/b.tar.gz"
    )


def test_the_fetch_helper_is_python_3_9_and_standard_library_only():
    """AL2023's python3 is 3.9, and the ECS AMI has no boto3."""
    source = Path(node_fetch.__file__).read_text()
    tree = ast.parse(source, feature_version=(3, 9))
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= {"datetime", "hashlib", "hmac", "json", "os", "sys", "time", "urllib"}


def test_the_embedded_helper_is_the_same_program_without_comments_and_docstrings():
    from stacks.node_boot import code_only

    def without_docstrings(tree: ast.Module) -> str:
        for node in ast.walk(tree):
            body = getattr(node, "body", None)
            if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
                if isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
                    node.body = body[1:]
        return ast.dump(tree)

    source = Path(node_fetch.__file__).read_text()
    embedded = code_only(source)
    assert "#" not in embedded and '"""' not in embedded
    assert ast.dump(ast.parse(embedded, feature_version=(3, 9))) == without_docstrings(ast.parse(source))


def test_every_pinned_artifact_lives_under_the_node_artifacts_prefix_with_its_upstream_name():
    for artifact in ALL_BOOT_ARTIFACTS:
        assert artifact.key == f"flotilla-node-artifacts/{artifact.filename}"
        assert artifact.upstream_url.rsplit("/", 1)[1] == artifact.filename
