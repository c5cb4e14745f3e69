"""A unit node's user data: what runs on the instance before the ECS agent starts. It installs
nothing from a package repository or the internet: the artifacts it installs come from the
deployment's own bucket through the VPC's S3 gateway endpoint, checked against the SHA-256 pinned in
contract/node_boot.py, and any failure powers the instance off with its reason on the console.
"""

from __future__ import annotations

import re
from pathlib import Path

from aws_cdk import aws_ec2 as ec2

from contract.node_boot import EFA_INSTALLER, BootArtifact, boot_artifacts

# Model artifacts and the compile cache: where the node container writes them (the image's
# FLOTILLA_CACHE_DIR and the parent of the node's default model and compiled-artifact directories,
# runtime/node/settings.py) and the host directory the instance store is mounted at.
SCRATCH_CONTAINER_PATH = "/var/cache/flotilla"
SCRATCH_HOST_PATH = "/mnt/flotilla"

# First lines of the user data: a failed boot step (a missing or altered artifact, a RAID that does
# not assemble) must not leave a node that joins its unit half-built and fails hours later. Every
# error stops the script, says which command failed on stderr (cloud-init copies it to
# /var/log/cloud-init-output.log and the console output,
# https://cloudinit.readthedocs.io/en/latest/reference/base_config_reference.html#output) and powers
# the instance off before the ECS agent starts (ecs.service runs after cloud-final.service on the ECS
# AMI, https://docs.aws.amazon.com/AmazonECS/latest/developerguide/bootstrap_container_instance.html).
# Auto Scaling counts an instance in any state but running as unhealthy and replaces it ("Amazon EC2
# Auto Scaling considers ... unhealthy" a stopped instance, ec2-auto-scaling-health-checks.html), so
# the failure shows as a replaced node in the group's activities, which `flotilla status` reads, and
# the instance never registers with the cluster, so the capacity provider never places a task on it.
# The ERR trap names the failed command; the EXIT trap catches what stops the script without ERR:
# under `set -u` an unset variable ends a non-interactive bash at once, running the EXIT trap and
# not the ERR one (bash manual, "The Set Builtin" -u and "Bourne Shell Builtins" trap; checked with
# bash 5), and the ECS agent would then start on a half-booted node: ecs.service is ordered After=
# cloud-final.service, an ordering only, which "is independent of the requirement dependencies"
# (systemd.unit(5), After=), so it starts whatever the user data's exit status.
BOOT_PROLOGUE = """\
set -euo pipefail
boot_failed() {
  trap - EXIT
  echo "flotilla: boot failed (exit $1) at line $2: $3; powering off" >&2
  poweroff
  exit "$1"
}
trap 'boot_failed $? $LINENO "$BASH_COMMAND"' ERR
trap 'status=$?; if [ "$status" -ne 0 ]; then boot_failed "$status" "$LINENO" "the script stopped"; fi' EXIT
"""

# Stripe the instance's NVMe instance-store volumes into one RAID0 XFS file system at
# SCRATCH_HOST_PATH. EC2 exposes them without a block device mapping ("NVMe instance store volumes
# are automatically enumerated and assigned a device name. Including them in your block device
# mapping has no effect." -- EC2 API reference, BlockDeviceMapping.VirtualName) under the NVMe
# model name "Amazon EC2 NVMe Instance Storage", which udev links as
# /dev/disk/by-id/nvme-Amazon_EC2_NVMe_Instance_Storage_* (the EKS AMI finds them the same way:
# awslabs/amazon-eks-ami@029ecebc:templates/shared/runtime/bin/setup-local-disks). User data runs
# before the ECS agent starts (the agent reads the /etc/ecs/ecs.config it writes,
# https://docs.aws.amazon.com/AmazonECS/latest/developerguide/bootstrap_container_instance.html),
# so no task starts before the mount. The fstab entry (by UUID, nofail) brings it back after a
# reboot; without instance-store volumes the directory stays on the root volume.
# RAID0 needs mdadm, which the boot never installs (no package repository at boot). The ECS AMI is
# built from the AL2023 minimal AMI plus a short package list without it (aws/amazon-ecs-ami@eb80a9f
# release-al2023.auto.pkrvars.hcl:8 source_ami_al2023, variables.pkr.hcl:12 packages_al2023; AWS's
# EKS AMI installs mdadm itself at image build, awslabs/amazon-eks-ami templates/al2023/provisioners/
# install-worker.sh), so on the stock AMI the directory takes one instance-store volume (1,900 GB on
# trn1/trn1n/trn2, far faster than the gp3 root); an AMI that carries mdadm gets the stripe.
SCRATCH_SETUP = f"""\
scratch={SCRATCH_HOST_PATH}
by_id=/dev/disk/by-id
mkdir -p "$scratch"
if ! mountpoint -q "$scratch"; then
  mapfile -t disks < <(for link in "$by_id"/*NVMe_Instance_Storage_*; do
    [ -e "$link" ] && readlink -f "$link"
  done | sort -u)
  device=""
  if [ "${{#disks[@]}}" -gt 1 ] && command -v mdadm >/dev/null; then
    mdadm --create /dev/md/flotilla --level=0 --raid-devices="${{#disks[@]}}" --run "${{disks[@]}}"
    device=/dev/md/flotilla
  elif [ "${{#disks[@]}}" -ge 1 ]; then
    if [ "${{#disks[@]}}" -gt 1 ]; then
      echo "flotilla: no mdadm on this AMI: $scratch uses 1 of ${{#disks[@]}} instance-store volumes" >&2
    fi
    device="${{disks[0]}}"
  fi
  if [ -n "$device" ]; then
    mkfs.xfs -f "$device"
    echo "UUID=$(blkid -s UUID -o value "$device") $scratch xfs defaults,noatime,nofail 0 2" >> /etc/fstab
    mount "$scratch"
  else
    echo "flotilla: no NVMe instance store found; $scratch stays on the root volume" >&2
  fi
fi
mkdir -p "$scratch/model" "$scratch/neuron-compiled"
"""

# The fetch helper (stacks/node_fetch.py) lands here and runs under the AMI's python3.
FETCH_HELPER = "/var/lib/flotilla/boot/node_fetch.py"


def code_only(source: str) -> str:
    """Python source without its comments, docstrings and blank lines: the user data must stay under
    EC2's 16 KB. Line-based, for the fetch helper's plain style (no "#" inside its strings);
    tests/stacks/test_node_boot.py checks the result parses to the same program."""
    out, in_docstring = [], False
    for line in source.splitlines():
        stripped = line.strip()
        if in_docstring:
            in_docstring = not stripped.endswith('"""')
            continue
        if stripped.startswith('"""'):
            in_docstring = not (len(stripped) > 3 and stripped.endswith('"""'))
            continue
        if stripped and not stripped.startswith("#"):
            out.append(re.sub(r"\s+#\s.*$", "", line))
    return "\n".join(out) + "\n"


def fetch_helper_setup() -> str:
    """Write the fetch helper to FETCH_HELPER (a quoted here-document: the shell expands nothing in it)."""
    source = code_only(Path(__file__).with_name("node_fetch.py").read_text())
    return (
        f'mkdir -p "$(dirname {FETCH_HELPER})"\n'
        f"cat > {FETCH_HELPER} <<'FLOTILLA_NODE_FETCH'\n"
        "# stacks/node_fetch.py of the flotilla revision this node runs, without its comments\n"
        f"{source}FLOTILLA_NODE_FETCH\n"
    )


def fetch_command(artifact: BootArtifact, *, bucket: str, dest: str) -> str:
    """The line that fetches one artifact into `dest` (a shell word) or stops the boot."""
    return f"python3 {FETCH_HELPER} {bucket} {artifact.key} {artifact.sha256} {dest}\n"


# Written once the installer has run: a second run of the script (cloud-init runs user data once per
# instance, but an operator may re-run it) goes straight to the checks. The DKMS-built module and
# rdma-core stay installed across reboots, and udev loads the module when the EFA devices appear.
EFA_INSTALLED_MARKER = f"/var/lib/flotilla/efa-installer-{EFA_INSTALLER.version}"
# Where dnf finds repository definitions on AL2023 (dnf.conf(5), reposdir: "/etc/yum.repos.d,
# /etc/yum/repos.d, /etc/distro.repos.d"); the ECS AMI deletes its Neuron repository after its build
# (aws/amazon-ecs-ami@eb80a9f scripts/enable-ecs-agent-inferentia-support.sh: "disable neuron package
# upgrades by deleting the yum repo"), which leaves the Amazon Linux ones.
REPO_DIRS = ("/etc/yum.repos.d", "/etc/yum/repos.d", "/etc/distro.repos.d")


def efa_setup(efa_interfaces: int, *, bucket: str) -> str:
    """User data for a host with EFA interfaces: install the pinned EFA installer's host part
    (kernel driver and rdma-core) from the deployment's bucket, verified against AWS's published
    checksum, then check that the host shows one verbs device per EFA interface, the devices the
    task definition maps (/dev/infiniband/uverbs0..N-1): without them ECS could not start the task.

    The installer runs with every package repository hidden (an empty directory bind-mounted over
    each repository directory), so its package manager sees only the RPMs in the tarball and what the
    AMI has: a dependency the AMI lacks fails the very first boot, with the installer's reason, instead
    of being fetched through the NAT gateways and failing only when they are gone. Runs under
    BOOT_PROLOGUE: any failure (artifact, checksum, installer, device count) powers the instance off
    before the ECS agent starts. Every wait is bounded (the fetch helper's retries, udevadm's
    --timeout). `tar` is on the ECS AMI: its own build runs `tar -xvf` (aws/amazon-ecs-ami@eb80a9f
    scripts/install-exec-dependencies.sh:50)."""
    tarball = '"$efa_dir/aws-efa-installer.tar.gz"'
    repo_dirs = " ".join(REPO_DIRS)
    return f"""\
efa_marker={EFA_INSTALLED_MARKER}
if [ ! -e "$efa_marker" ]; then
  efa_dir=$(mktemp -d)
  {fetch_command(EFA_INSTALLER, bucket=bucket, dest=tarball).strip()}
  tar -xzf {tarball} -C "$efa_dir"
  no_repos=$(mktemp -d)
  hidden=()
  for repos in {repo_dirs}; do
    if [ -d "$repos" ]; then mount --bind "$no_repos" "$repos"; hidden+=("$repos"); fi
  done
  cd "$efa_dir/aws-efa-installer"
  ./efa_installer.sh --minimal -y
  cd /
  for repos in "${{hidden[@]}}"; do umount "$repos"; done
  rm -rf "$efa_dir" "$no_repos"
  mkdir -p "$(dirname "$efa_marker")"
  touch "$efa_marker"
fi
modprobe efa
udevadm settle --timeout=60
shopt -s nullglob
uverbs=(/dev/infiniband/uverbs*)
shopt -u nullglob
if [ "${{#uverbs[@]}}" -ne {efa_interfaces} ]; then
  echo "flotilla: ${{#uverbs[@]}} EFA verbs devices, expected {efa_interfaces} (one per EFA interface)" >&2
  false
fi
"""


# Host-network tasks only get their task role credentials when the agent allows it; the last line,
# so the ECS agent gets its config only from a host that booted completely.
ECS_AGENT_CONFIG = "echo ECS_ENABLE_TASK_IAM_ROLE_NETWORK_HOST=true >> /etc/ecs/ecs.config\n"


def node_boot_script(*, instance_store: bool, efa_interfaces: int, artifact_bucket: str) -> str:
    """The user data's commands, in the order they run (after the #!/bin/bash line)."""
    artifacts = boot_artifacts(efa_interfaces=efa_interfaces)
    if artifacts and not artifact_bucket:
        raise ValueError("a host with EFA installs the EFA installer at boot: give the bucket that holds it")
    parts = [BOOT_PROLOGUE]
    if instance_store:
        parts.append(SCRATCH_SETUP)
    if artifacts:
        parts.append(fetch_helper_setup())
    # Only where the instance has EFA interfaces (every Trainium type; no x86 staging type).
    if efa_interfaces:
        parts.append(efa_setup(efa_interfaces, bucket=artifact_bucket))
    parts.append(ECS_AGENT_CONFIG)
    return "".join(parts)


def node_user_data(*, instance_store: bool, efa_interfaces: int, artifact_bucket: str) -> ec2.UserData:
    user_data = ec2.UserData.for_linux()
    user_data.add_commands(
        node_boot_script(instance_store=instance_store, efa_interfaces=efa_interfaces, artifact_bucket=artifact_bucket)
    )
    return user_data
