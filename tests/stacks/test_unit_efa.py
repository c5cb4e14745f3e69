"""Host EFA at boot: a Trainium unit's user data fetches the pinned EFA installer from the deployment's
bucket (never the internet), refuses it unless its SHA-256 is AWS's published one, installs its host
part (kernel driver, rdma-core) with every package repository hidden, and checks one verbs device per
EFA interface, all before the ECS agent starts. The script runs here under bash with the real fetch
helper against a local stand-in for the instance metadata service and S3, and stand-ins for the
kernel tools; the synthesized templates carry it only where there is EFA."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from contract.node_boot import EFA_INSTALLER
from stacks import node_fetch
from stacks.node_boot import (
    BOOT_PROLOGUE,
    ECS_AGENT_CONFIG,
    EFA_INSTALLED_MARKER,
    FETCH_HELPER,
    REPO_DIRS,
    efa_setup,
    node_boot_script,
)

# AWS's published SHA256 of aws-efa-installer-1.47.0.tar.gz (EC2 user guide, "Verify the EFA installer
# using a checksum", efa-verify.html, row "EFA 1.47.0"), typed from the page, not from contract/.
AWS_SHA256_1_47_0 = "2df4201e046833c7dc8160907bee7f52b76ff80ed147376a2d0ed8a0dd66b2db"
BUCKET = "flotilla-models-example"
TOOLS = ("modprobe", "udevadm", "poweroff", "mount", "umount")
CREDS = {"AccessKeyId": "ASIANODEROLE", "SecretAccessKey": "node-secret", "Token": "node-session-token"}
IMDS_TOKEN = "imds-session-token"


def fake_installer_tarball(log: Path) -> bytes:
    """aws-efa-installer/efa_installer.sh that logs its arguments, as the real tarball lays it out."""
    script = f'#!/bin/bash\necho "efa_installer.sh $*" >> {log}\n'.encode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("aws-efa-installer/efa_installer.sh")
        info.size, info.mode = len(script), 0o755
        tar.addfile(info, io.BytesIO(script))
    return gzip.compress(buf.getvalue(), mtime=0)  # the same bytes on every call


@dataclass
class FakeAws:
    """The instance metadata service (IMDSv2) and S3, as the fetch helper meets them on a node: S3
    answers 403 for a key it does not hold (the instance role may not list the bucket)."""

    objects: dict[str, bytes] = field(default_factory=dict)  # "/bucket/key" -> bytes
    s3_requests: list[dict] = field(default_factory=list)
    port: int = 0


@contextmanager
def fake_aws(objects: dict[str, bytes]) -> Iterator[FakeAws]:
    state = FakeAws(objects=objects)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # keep pytest's output clean
            pass

        def _send(self, status: int, body: bytes = b"") -> None:
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_PUT(self):  # noqa: N802 - http.server's name
            ok = self.path == "/latest/api/token" and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
            self._send(200, IMDS_TOKEN.encode()) if ok else self._send(403)

        def do_GET(self):  # noqa: N802
            if self.path.startswith("/s3/"):
                state.s3_requests.append({"path": self.path, **{k.lower(): v for k, v in self.headers.items()}})
                signed = (
                    self.headers.get("Authorization", "").startswith(
                        f"AWS4-HMAC-SHA256 Credential={CREDS['AccessKeyId']}/"
                    )
                    and self.headers.get("x-amz-security-token") == CREDS["Token"]
                )
                body = state.objects.get(self.path[len("/s3") :])
                self._send(200, body) if signed and body is not None else self._send(403)
                return
            if self.headers.get("X-aws-ec2-metadata-token") != IMDS_TOKEN:
                self._send(401)
                return
            answers = {
                "/latest/meta-data/placement/region": "us-east-1",
                "/latest/meta-data/services/domain": "amazonaws.com",
                "/latest/meta-data/iam/security-credentials/": "node-role\n",
                "/latest/meta-data/iam/security-credentials/node-role": json.dumps(CREDS),
            }
            self._send(200, answers[self.path].encode()) if self.path in answers else self._send(404)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@dataclass
class Boot:
    proc: subprocess.CompletedProcess
    calls: list[str]
    ecs_config: Path
    marker: Path
    s3_requests: list[dict]
    scratch_tmp: Path


def run_boot(
    tmp_path: Path,
    *,
    interfaces: int = 8,
    devices: int = 8,
    staged: bool = True,
    pinned_sha256: str | None = None,
    installed: bool = False,
) -> Boot:
    """The user data's commands for a host with EFA (node_boot_script, without the instance store),
    run under bash with the real fetch helper against fake_aws, /dev/infiniband, the repository
    directories, the marker and ecs.config moved under tmp_path. staged: the bucket holds a fake
    installer; pinned_sha256=None keeps AWS's checksum (which the fake does not match)."""
    bin_dir, ib, tmp = tmp_path / "bin", tmp_path / "infiniband", tmp_path / "tmp"
    for d in (bin_dir, ib, tmp):
        d.mkdir()
    for i in range(devices):
        (ib / f"uverbs{i}").touch()
    log = tmp_path / "calls.log"
    for tool in TOOLS:
        (bin_dir / tool).write_text(f'#!/bin/bash\necho "{tool} $*" >> {log}\n')
        (bin_dir / tool).chmod(0o755)
    (bin_dir / "python3").symlink_to(sys.executable)
    repo_dirs = [tmp_path / "etc" / d.strip("/").replace("/", "-") for d in REPO_DIRS]
    repo_dirs[0].mkdir(parents=True)  # AL2023 has /etc/yum.repos.d only
    marker = tmp_path / "state" / "efa-installed"
    if installed:
        marker.parent.mkdir()
        marker.touch()
    ecs_config = tmp_path / "ecs.config"
    objects = {f"/{BUCKET}/{EFA_INSTALLER.key}": fake_installer_tarball(log)} if staged else {}
    with fake_aws(objects) as aws:
        local = f"http://127.0.0.1:{aws.port}"
        script = (
            node_boot_script(instance_store=False, efa_interfaces=interfaces, artifact_bucket=BUCKET)
            .replace(node_fetch.IMDS, local)
            .replace(node_fetch.S3_VIRTUAL_HOSTED, local + "/s3/{bucket}/{key}")
            .replace(FETCH_HELPER, str(tmp_path / "boot" / "node_fetch.py"))
            .replace(EFA_INSTALLED_MARKER, str(marker))
            .replace("/dev/infiniband/", f"{ib}/")
            .replace(" ".join(REPO_DIRS), " ".join(map(str, repo_dirs)))
            .replace("/etc/ecs/ecs.config", str(ecs_config))
        )
        if pinned_sha256 is not None:
            script = script.replace(EFA_INSTALLER.sha256, pinned_sha256)
        env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "TMPDIR": str(tmp)}
        proc = subprocess.run(
            [shutil.which("bash"), "-c", script], env=env, capture_output=True, text=True, timeout=120
        )
        requests = list(aws.s3_requests)
    calls = log.read_text().splitlines() if log.exists() else []
    return Boot(proc, calls, ecs_config, marker, requests, tmp)


def test_the_pins_are_aws_published_version_and_checksum_and_the_script_fetches_them_from_the_bucket():
    assert EFA_INSTALLER.sha256 == AWS_SHA256_1_47_0
    assert EFA_INSTALLER.upstream_url == "https://efa-installer.amazonaws.com/aws-efa-installer-1.47.0.tar.gz"
    script = efa_setup(8, bucket=BUCKET)
    assert f"{FETCH_HELPER} {BUCKET} {EFA_INSTALLER.key} {AWS_SHA256_1_47_0} " in script
    assert "./efa_installer.sh --minimal -y" in script
    assert "efa-installer.amazonaws.com" not in script


def test_an_installer_whose_checksum_differs_stops_the_boot_with_the_reason_before_the_installer_or_ecs_agent(
    tmp_path,
):
    boot = run_boot(tmp_path)
    fake_sha256 = hashlib.sha256(fake_installer_tarball(tmp_path / "calls.log")).hexdigest()
    assert boot.proc.returncode == 3, boot.proc.stderr  # the fetch helper's "checksum differs"
    assert (
        f"flotilla: boot artifact s3://{BUCKET}/{EFA_INSTALLER.key}: its SHA-256 is {fake_sha256}, "
        f"the pinned one is {AWS_SHA256_1_47_0}; stage it with `flotilla node-artifacts stage`"
    ) in boot.proc.stderr
    assert "flotilla: boot failed (exit 3)" in boot.proc.stderr
    assert [c.split()[0] for c in boot.calls] == ["poweroff"]  # never the installer, never mount
    assert not boot.ecs_config.exists() and not boot.marker.exists()
    assert not [p for p in boot.scratch_tmp.rglob("*") if p.is_file()]  # nothing unverified left on disk


def test_a_missing_installer_stops_the_boot_with_the_reason_and_the_command_that_stages_it(tmp_path):
    boot = run_boot(tmp_path, staged=False)
    assert boot.proc.returncode == 2, boot.proc.stderr
    assert (
        f"flotilla: boot artifact s3://{BUCKET}/{EFA_INSTALLER.key}: HTTP 403: the object is missing or this "
        "instance's role may not read it; stage it with `flotilla node-artifacts stage`"
    ) in boot.proc.stderr
    assert [c.split()[0] for c in boot.calls] == ["poweroff"]
    assert not boot.ecs_config.exists()


def test_a_verified_installer_runs_minimal_with_every_repository_hidden_then_checks_the_verbs_devices(tmp_path):
    published = hashlib.sha256(fake_installer_tarball(tmp_path / "calls.log")).hexdigest()
    boot = run_boot(tmp_path, pinned_sha256=published)
    assert boot.proc.returncode == 0, boot.proc.stderr
    (request,) = boot.s3_requests
    assert request["path"] == f"/s3/{BUCKET}/{EFA_INSTALLER.key}"
    assert request["authorization"].startswith(f"AWS4-HMAC-SHA256 Credential={CREDS['AccessKeyId']}/")
    names = [c.split()[0] for c in boot.calls]
    assert names == ["mount", "efa_installer.sh", "umount", "modprobe", "udevadm"]
    repos = tmp_path / "etc" / "etc-yum.repos.d"
    assert boot.calls[0].startswith("mount --bind ") and boot.calls[0].endswith(f" {repos}")
    assert boot.calls[1] == "efa_installer.sh --minimal -y"
    assert boot.calls[2] == f"umount {repos}"
    assert boot.marker.exists()
    assert boot.ecs_config.exists()  # the ECS agent gets its config only after EFA is up


def test_a_second_run_on_an_installed_host_only_checks_the_devices(tmp_path):
    boot = run_boot(tmp_path, installed=True, staged=False)
    assert boot.proc.returncode == 0, boot.proc.stderr
    assert [c.split()[0] for c in boot.calls] == ["modprobe", "udevadm"]
    assert boot.s3_requests == []
    assert boot.ecs_config.exists()


def test_missing_verbs_devices_stop_the_boot_with_the_count_and_power_off(tmp_path):
    boot = run_boot(tmp_path, interfaces=16, devices=8, installed=True)
    assert boot.proc.returncode != 0
    assert "flotilla: 8 EFA verbs devices, expected 16 (one per EFA interface)" in boot.proc.stderr
    assert "poweroff" in [c.split()[0] for c in boot.calls]
    assert not boot.ecs_config.exists()


def _user_data(synth, stack: str = "Cell-0") -> str:
    lt = next(iter(synth.resources(stack, "AWS::EC2::LaunchTemplate").values()))
    parts = lt["Properties"]["LaunchTemplateData"]["UserData"]["Fn::Base64"]
    return parts if isinstance(parts, str) else "".join(p for p in parts["Fn::Join"][1] if isinstance(p, str))


def test_trainium_units_install_host_efa_after_the_prologue_and_before_the_ecs_agent(default_synth, trn1n_synth):
    # trn1.32xlarge: 8 EFA interfaces; trn1n.32xlarge: 16 (docs/hardware.md, Trainium figures).
    for synth, interfaces in ((default_synth, 8), (trn1n_synth, 16)):
        user_data = _user_data(synth)
        setup = efa_setup(interfaces, bucket=synth.deployment.config.model.bucket).strip()
        assert setup in user_data
        assert user_data.startswith("#!/bin/bash\n" + BOOT_PROLOGUE.strip())
        assert user_data.index(setup) < user_data.index(ECS_AGENT_CONFIG.strip())


def test_x86_staging_units_have_no_efa_setup_and_fetch_nothing(staging_synth):
    cells = [s for s in staging_synth.templates if s.startswith("Cell-")]
    assert cells
    for stack in cells:
        user_data = _user_data(staging_synth, stack)
        assert "efa_installer" not in user_data and "uverbs" not in user_data
        assert FETCH_HELPER not in user_data
