"""Host EFA at boot: a Trainium unit's user data installs the pinned EFA installer's host part
(kernel driver, rdma-core) before the ECS agent starts, verified against AWS's published checksum,
and checks one verbs device per EFA interface. The script runs here under bash with stand-ins for
the download and the kernel tools; the synthesized templates carry it only where there is EFA."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import subprocess
import tarfile
from pathlib import Path

from stacks.unit import BOOT_PROLOGUE, EFA_INSTALLED_MARKER, EFA_INSTALLER_SHA256, efa_setup

# AWS's published SHA256 of aws-efa-installer-1.47.0.tar.gz (EC2 user guide, "Verify the EFA installer
# using a checksum", efa-verify.html, row "EFA 1.47.0"), typed from the page, not from stacks/unit.py.
AWS_SHA256_1_47_0 = "2df4201e046833c7dc8160907bee7f52b76ff80ed147376a2d0ed8a0dd66b2db"
AWS_URL_1_47_0 = "https://efa-installer.amazonaws.com/aws-efa-installer-1.47.0.tar.gz"
TOOLS = ("modprobe", "udevadm", "dnf", "poweroff")


def fake_installer_tarball(log: Path) -> bytes:
    """aws-efa-installer/efa_installer.sh that logs its arguments, as the real tarball lays it out."""
    script = f'#!/bin/bash\necho "efa_installer.sh $*" >> {log}\n'.encode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("aws-efa-installer/efa_installer.sh")
        info.size, info.mode = len(script), 0o755
        tar.addfile(info, io.BytesIO(script))
    return gzip.compress(buf.getvalue(), mtime=0)  # the same bytes on every call


def run_efa_setup(
    tmp_path: Path,
    *,
    interfaces: int = 8,
    devices: int = 8,
    published_sha256: str | None = None,
    installed: bool = False,
) -> tuple[subprocess.CompletedProcess, list[str], Path]:
    """BOOT_PROLOGUE + efa_setup + the ECS agent's config line, with curl serving a fake installer,
    /dev/infiniband and the marker moved under tmp_path. published_sha256=None keeps AWS's checksum
    (which the fake tarball does not match); otherwise the script is given that checksum.
    -> (process, tool calls, ecs.config path)"""
    bin_dir, ib = tmp_path / "bin", tmp_path / "infiniband"
    bin_dir.mkdir()
    ib.mkdir()
    for i in range(devices):
        (ib / f"uverbs{i}").touch()
    log = tmp_path / "calls.log"
    tarball = tmp_path / "served.tar.gz"
    tarball.write_bytes(fake_installer_tarball(log))
    for tool in TOOLS:
        (bin_dir / tool).write_text(f'#!/bin/bash\necho "{tool} $*" >> {log}\n')
    # curl: log the URL, write the served tarball to the -o path.
    (bin_dir / "curl").write_text(
        '#!/bin/bash\nout=""; url=""\n'
        'while [ $# -gt 0 ]; do case "$1" in -o) out="$2"; shift;; http*) url="$1";; esac; shift; done\n'
        f'echo "curl $url" >> {log}\ncp {tarball} "$out"\n'
    )
    for tool in (*TOOLS, "curl"):
        (bin_dir / tool).chmod(0o755)
    marker = tmp_path / "state" / "efa-installed"
    if installed:
        marker.parent.mkdir()
        marker.touch()
    ecs_config = tmp_path / "ecs.config"
    script = (
        BOOT_PROLOGUE + efa_setup(interfaces) + f"echo ECS_ENABLE_TASK_IAM_ROLE_NETWORK_HOST=true >> {ecs_config}\n"
    )
    script = script.replace(EFA_INSTALLED_MARKER, str(marker)).replace("/dev/infiniband/", f"{ib}/")
    if published_sha256 is not None:
        script = script.replace(EFA_INSTALLER_SHA256, published_sha256)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60)
    calls = log.read_text().splitlines() if log.exists() else []
    return proc, calls, ecs_config


def sha256_of_fake(tmp_path: Path) -> str:
    return hashlib.sha256((tmp_path / "served.tar.gz").read_bytes()).hexdigest()


def test_the_script_pins_the_installer_version_url_and_aws_published_checksum():
    script = efa_setup(8)
    assert AWS_URL_1_47_0 in script
    assert AWS_SHA256_1_47_0 in script
    assert "./efa_installer.sh --minimal -y" in script


def test_a_tarball_that_does_not_match_aws_checksum_powers_off_before_the_installer_or_ecs_agent(tmp_path):
    proc, calls, ecs_config = run_efa_setup(tmp_path)
    assert proc.returncode != 0
    assert "flotilla: boot failed" in proc.stderr and "sha256sum" in proc.stderr, proc.stderr
    assert [c.split()[0] for c in calls] == ["curl", "poweroff"]
    assert calls[0] == f"curl {AWS_URL_1_47_0}"
    assert not ecs_config.exists()
    assert not (tmp_path / "state" / "efa-installed").exists()


def test_a_verified_installer_runs_minimal_then_the_host_shows_one_verbs_device_per_interface(tmp_path):
    published = hashlib.sha256(fake_installer_tarball(tmp_path / "calls.log")).hexdigest()
    proc, calls, ecs_config = run_efa_setup(tmp_path, published_sha256=published)
    assert proc.returncode == 0, proc.stderr
    assert sha256_of_fake(tmp_path) == published
    names = [c.split()[0] for c in calls]
    assert names == ["curl", "efa_installer.sh", "modprobe", "udevadm"]
    assert "efa_installer.sh --minimal -y" in calls
    assert "modprobe efa" in calls
    assert (tmp_path / "state" / "efa-installed").exists()
    assert ecs_config.exists()  # the ECS agent gets its config only after EFA is up


def test_a_second_run_on_an_installed_host_only_checks_the_devices(tmp_path):
    proc, calls, ecs_config = run_efa_setup(tmp_path, installed=True)
    assert proc.returncode == 0, proc.stderr
    assert [c.split()[0] for c in calls] == ["modprobe", "udevadm"]
    assert ecs_config.exists()


def test_missing_verbs_devices_stop_the_boot_with_the_count_and_power_off(tmp_path):
    proc, calls, ecs_config = run_efa_setup(tmp_path, interfaces=16, devices=8, installed=True)
    assert proc.returncode != 0
    assert "flotilla: 8 EFA verbs devices, expected 16 (one per EFA interface)" in proc.stderr
    assert "poweroff" in [c.split()[0] for c in calls]
    assert not ecs_config.exists()


def _user_data(synth, stack: str = "Cell-0") -> str:
    lt = next(iter(synth.resources(stack, "AWS::EC2::LaunchTemplate").values()))
    parts = lt["Properties"]["LaunchTemplateData"]["UserData"]["Fn::Base64"]
    return parts if isinstance(parts, str) else "".join(p for p in parts["Fn::Join"][1] if isinstance(p, str))


def test_trainium_units_install_host_efa_after_the_prologue_and_before_the_ecs_agent(default_synth, trn1n_synth):
    # trn1.32xlarge: 8 EFA interfaces; trn1n.32xlarge: 16 (docs/hardware.md, Trainium figures).
    for synth, interfaces in ((default_synth, 8), (trn1n_synth, 16)):
        user_data = _user_data(synth)
        setup = efa_setup(interfaces).strip()
        assert setup in user_data
        assert user_data.startswith("#!/bin/bash\n" + BOOT_PROLOGUE.strip())
        assert user_data.index(setup) < user_data.index("/etc/ecs/ecs.config")


def test_x86_staging_units_have_no_efa_setup(staging_synth):
    cells = [s for s in staging_synth.templates if s.startswith("Cell-")]
    assert cells
    for stack in cells:
        user_data = _user_data(staging_synth, stack)
        assert "efa-installer" not in user_data and "uverbs" not in user_data
