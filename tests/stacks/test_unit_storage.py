"""Model artifacts and the compile cache live on the instance store, not on the gp3 root volume:
the boot script that builds the RAID0 (run here under bash with stand-in disk tools), the task's
bind mount, and the directories the node writes to."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from synth_helpers import config_with, synthesize

from stacks.node_boot import BOOT_PROLOGUE, SCRATCH_CONTAINER_PATH, SCRATCH_HOST_PATH, SCRATCH_SETUP

TOOLS = ("mountpoint", "mdadm", "mkfs.xfs", "blkid", "mount", "poweroff")
# What SCRATCH_SETUP runs from the system besides bash builtins and the stand-ins above.
SYSTEM_TOOLS = ("mkdir", "readlink", "sort")


def run_setup(
    tmp_path: Path,
    devices: list[str],
    *,
    failing: str = "",
    prologue: str = "",
    after: str = "",
    mdadm: bool = True,
) -> tuple[list[str], Path, Path, str]:
    """Run SCRATCH_SETUP with /dev/disk/by-id, the mount point and /etc/fstab moved under tmp_path
    and the disk tools replaced by stand-ins that log their arguments; `failing` names a tool that
    exits 1; `prologue` / `after` run before / after it; mdadm=False: a host without mdadm (PATH holds
    only the stand-ins and the system tools the script needs). -> (tool calls, scratch, fstab, stderr)"""
    by_id, dev, bin_dir, system = tmp_path / "by-id", tmp_path / "dev", tmp_path / "bin", tmp_path / "system"
    for d in (by_id, dev, bin_dir, system):
        d.mkdir()
    for tool in SYSTEM_TOOLS:
        (system / tool).symlink_to(shutil.which(tool))
    for name in devices:
        (dev / name).touch()
        # udev links each instance-store volume twice (model+serial, and with a namespace suffix)
        serial = f"nvme-Amazon_EC2_NVMe_Instance_Storage_AWS{name}"
        (by_id / serial).symlink_to(dev / name)
        (by_id / f"{serial}_1").symlink_to(dev / name)
    (by_id / "nvme-Amazon_Elastic_Block_Store_vol0123").symlink_to(dev / "root")  # never the EBS root
    log = tmp_path / "calls.log"
    for tool in (t for t in TOOLS if mdadm or t != "mdadm"):
        body = f'echo "{tool} $*" >> {log}\n'
        if tool == "mountpoint":
            body += "exit 1\n"  # nothing mounted yet
        if tool == "blkid":
            body += "echo 0d5c-uuid\n"
        if tool == failing:
            body += "exit 1\n"
        (bin_dir / tool).write_text("#!/bin/bash\n" + body)
        (bin_dir / tool).chmod(0o755)
    scratch, fstab = tmp_path / "mnt-flotilla", tmp_path / "fstab"
    script = (
        (prologue + SCRATCH_SETUP + after)
        .replace(SCRATCH_HOST_PATH, str(scratch))
        .replace("/dev/disk/by-id", str(by_id))
        .replace("/etc/fstab", str(fstab))
    )
    path = f"{bin_dir}{os.pathsep}{system}" if not mdadm else f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
    env = {**os.environ, "PATH": path}
    proc = subprocess.run([shutil.which("bash"), "-c", script], env=env, capture_output=True, text=True, timeout=30)
    assert (proc.returncode != 0) == bool(failing), proc.stderr
    if failing:
        assert "flotilla: boot failed (exit 1) at line" in proc.stderr and failing in proc.stderr, proc.stderr
    calls = log.read_text().splitlines() if log.exists() else []
    return calls, scratch, fstab, proc.stderr


def test_four_nvme_volumes_become_one_raid0_xfs_mounted_at_boot_and_after_reboots(tmp_path):
    calls, scratch, fstab, _ = run_setup(tmp_path, ["nvme1n1", "nvme2n1", "nvme3n1", "nvme4n1"])
    dev = tmp_path / "dev"
    raid = [c for c in calls if c.startswith("mdadm")]
    assert raid == [
        "mdadm --create /dev/md/flotilla --level=0 --raid-devices=4 --run "
        + " ".join(str(dev / f"nvme{i}n1") for i in range(1, 5))
    ]
    assert "mkfs.xfs -f /dev/md/flotilla" in calls
    assert f"mount {scratch}" in calls
    assert fstab.read_text() == f"UUID=0d5c-uuid {scratch} xfs defaults,noatime,nofail 0 2\n"
    assert (scratch / "model").is_dir() and (scratch / "neuron-compiled").is_dir()


def test_a_failed_raid_stops_the_boot_loudly_and_powers_off_before_the_ecs_agent_config(tmp_path):
    after = f"echo ECS_ENABLE_TASK_IAM_ROLE_NETWORK_HOST=true >> {tmp_path / 'ecs.config'}\n"
    calls, scratch, fstab, _ = run_setup(
        tmp_path, ["nvme1n1", "nvme2n1"], failing="mdadm", prologue=BOOT_PROLOGUE, after=after
    )
    assert [c.split()[0] for c in calls] == ["mountpoint", "mdadm", "poweroff"]
    assert not (tmp_path / "ecs.config").exists()  # the ECS agent never gets its config
    assert not fstab.exists() and not (scratch / "model").exists()


def test_the_boot_prologue_lets_a_healthy_boot_through(tmp_path):
    calls, scratch, _, _ = run_setup(tmp_path, ["nvme1n1", "nvme2n1"], prologue=BOOT_PROLOGUE)
    assert "poweroff" not in [c.split()[0] for c in calls]
    assert (scratch / "model").is_dir()


@pytest.mark.parametrize(
    "step, reported",
    [
        ("mkfs.xfs -f /dev/md/flotilla", "at line"),  # a command that fails
        ("mkfs.xfs -f /dev/md/flotilla | cat", "at line"),  # ... at the head of a pipeline (pipefail)
        ('echo "$flotilla_never_set"', "the script stopped"),  # an unset variable: set -u exits without ERR
    ],
)
def test_every_way_a_boot_step_can_fail_powers_the_node_off_before_the_ecs_agent_config(tmp_path, step, reported):
    bin_dir, log, ecs_config = tmp_path / "bin", tmp_path / "calls.log", tmp_path / "ecs.config"
    bin_dir.mkdir()
    for tool, body in (("mkfs.xfs", "exit 1"), ("poweroff", "exit 0")):
        (bin_dir / tool).write_text(f'#!/bin/bash\necho "{tool} $*" >> {log}\n{body}\n')
        (bin_dir / tool).chmod(0o755)
    script = BOOT_PROLOGUE + step + "\n" + f"echo ECS_ENABLE_TASK_IAM_ROLE_NETWORK_HOST=true >> {ecs_config}\n"
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode != 0, proc.stderr
    assert "flotilla: boot failed" in proc.stderr and reported in proc.stderr, proc.stderr
    assert log.read_text().splitlines()[-1] == "poweroff " and log.read_text().count("poweroff") == 1
    assert not ecs_config.exists()  # the ECS agent never gets its config


def test_without_mdadm_on_the_ami_the_boot_installs_nothing_and_takes_one_volume(tmp_path):
    """The stock ECS AMI has no mdadm and the boot installs no package: the scratch directory takes
    the first instance-store volume, says so on the console, and the boot goes on."""
    calls, scratch, fstab, stderr = run_setup(
        tmp_path, ["nvme1n1", "nvme2n1", "nvme3n1", "nvme4n1"], prologue=BOOT_PROLOGUE, mdadm=False
    )
    assert [c.split()[0] for c in calls] == ["mountpoint", "mkfs.xfs", "blkid", "mount"]
    assert f"mkfs.xfs -f {tmp_path / 'dev' / 'nvme1n1'}" in calls
    assert f"flotilla: no mdadm on this AMI: {scratch} uses 1 of 4 instance-store volumes" in stderr
    assert fstab.read_text() == f"UUID=0d5c-uuid {scratch} xfs defaults,noatime,nofail 0 2\n"
    assert (scratch / "model").is_dir()


def test_a_single_volume_is_formatted_without_raid(tmp_path):
    calls, scratch, _, _ = run_setup(tmp_path, ["nvme1n1"])
    assert not [c for c in calls if c.startswith("mdadm")]
    assert f"mkfs.xfs -f {tmp_path / 'dev' / 'nvme1n1'}" in calls


def test_without_instance_store_the_directory_stays_on_the_root_volume(tmp_path):
    calls, scratch, fstab, _ = run_setup(tmp_path, [])
    assert not [c for c in calls if c.split()[0] in ("mdadm", "mkfs.xfs", "mount")]
    assert not fstab.exists()
    assert (scratch / "model").is_dir()


@pytest.fixture(scope="module")
def synths(default_synth, tmp_path_factory):
    return default_synth, synthesize(config_with(node={"instance_store": False}), tmp_path_factory.mktemp("no-store"))


def _task_and_user_data(synth) -> tuple[dict, str]:
    (task,) = synth.resources("Cell-0", "AWS::ECS::TaskDefinition").values()
    (lt,) = synth.resources("Cell-0", "AWS::EC2::LaunchTemplate").values()
    parts = lt["Properties"]["LaunchTemplateData"]["UserData"]["Fn::Base64"]
    text = parts if isinstance(parts, str) else "".join(p for p in parts["Fn::Join"][1] if isinstance(p, str))
    return task["Properties"], text


def test_the_node_container_writes_model_and_compile_cache_to_the_instance_store(synths):
    task, user_data = _task_and_user_data(synths[0])
    assert SCRATCH_SETUP.strip() in user_data
    # Error handling first: the shebang, then the prologue, before any step that can fail.
    assert user_data.startswith("#!/bin/bash\n" + BOOT_PROLOGUE.strip())
    # The RAID is ready before the ECS agent reads its config (and so before any task starts).
    assert user_data.index(SCRATCH_SETUP.strip()) < user_data.index("/etc/ecs/ecs.config")
    assert task["Volumes"] == [{"Name": "scratch", "Host": {"SourcePath": SCRATCH_HOST_PATH}}]
    (container,) = task["ContainerDefinitions"]
    assert container["MountPoints"] == [
        {"ContainerPath": SCRATCH_CONTAINER_PATH, "SourceVolume": "scratch", "ReadOnly": False}
    ]


def test_the_mount_covers_every_directory_the_node_writes_model_bytes_to():
    """stacks/ may not import runtime/; the test reads the runtime's defaults and checks each sits
    under the mounted path (and both images point FLOTILLA_CACHE_DIR there)."""
    from runtime.node.settings import NeuronSettings

    defaults = NeuronSettings.model_fields
    for name in ("model_dir", "compiled_dir"):
        assert Path(defaults[name].default).parent == Path(SCRATCH_CONTAINER_PATH), name
    root = Path(__file__).resolve().parents[2]
    for dockerfile in ("runtime/Dockerfile", "runtime/Dockerfile.neuron"):
        assert f"FLOTILLA_CACHE_DIR={SCRATCH_CONTAINER_PATH}" in (root / dockerfile).read_text(), dockerfile


def test_instance_store_false_keeps_everything_on_the_root_volume(synths):
    task, user_data = _task_and_user_data(synths[1])
    assert "NVMe_Instance_Storage" not in user_data
    assert "Volumes" not in task or task["Volumes"] == []
    assert "MountPoints" not in task["ContainerDefinitions"][0] or not task["ContainerDefinitions"][0]["MountPoints"]
