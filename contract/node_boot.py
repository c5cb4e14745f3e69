"""What a unit's node boots: the pinned ECS-optimized AMI releases, and the artifacts its user data
installs from the deployment's own S3 bucket (never from the internet), each with its SHA-256.

Declared once: the CDK app builds the launch template's user data and the instance role's read grant
from it, `flotilla node-artifacts stage` downloads and uploads exactly these files, `flotilla`'s AMI
check asks AWS about exactly these names, and the multi-node image installs the same EFA installer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# --- AMIs -----------------------------------------------------------------------------------------
# The ECS-optimized AL2023 Neuron AMI release the units run, never "recommended": that one moves its
# Neuron driver (aws/amazon-ecs-ami scripts/enable-ecs-agent-inferentia-support.sh installs the latest
# aws-neuronx-dkms at build time), while the containers' runtime stays at Neuron SDK 2.28, and driver
# 2.29 "requires Neuron Runtime Library 2.33 or later ... [else] nrt_init() [fails]" (aws-neuron/aws-neuron-sdk
# @81ce03ae:release-notes/components/runtime.rst:329). Release 20260403 (aws/amazon-ecs-ami@eb80a9f, built
# 2026-04-03) predates SDK 2.29 (2026-04-09), so it carries the SDK 2.28 driver line (2.26.10.0,
# runtime.rst:742-747). The variant segment is "neuron": the ECS developer guide, "Retrieving Amazon
# ECS-optimized Linux AMI metadata", lists "Amazon Linux 2023 (Neuron) AMI metadata:
# /aws/service/ecs/optimized-ami/amazon-linux-2023/neuron/<version>", and AWS's release script reads
# .../amazon-linux-2023/neuron/recommended (aws/amazon-ecs-ami@eb80a9f:generate-release-notes.sh:155;
# aws/aws-cdk#34689 moved CDK from "inf", the Amazon Linux 2 variant). The per-release child,
# .../neuron/<AMI name>/image_id, follows the guide's "metadata of a specific Amazon ECS-optimized AMI
# version by specifying the AMI name" (its example is Amazon Linux 2's) and the "sub-parameter
# image_id". That it exists: AWS's own GetParametersByPath listing of /aws/service/ecs/optimized-ami, as
# captured in moto 5.2.5 (getmoto/moto scripts/ssm_get_optimized_amis.py), holds it in 28 regions
# (docs/hardware.md, "The unit AMI"); `flotilla node-boot check` and preflight ask SSM before a deploy.
# The AMI name is the al2023neu build's, <prefix>-neuron-hvm-2023.0.<version><kernel>-x86_64
# (al2023neu.pkr.hcl:2) with version 20260403 and kernel -kernel-6.1 (release-al2023.auto.pkrvars.hcl:1,10)
# and the public prefix al2023-ami-ecs (the release notes name al2023-ami-ecs-neuron-hvm-... AMIs).
NEURON_AMI_NAME = "al2023-ami-ecs-neuron-hvm-2023.0.20260403-kernel-6.1-x86_64"
NEURON_AMI_PARAMETER = f"/aws/service/ecs/optimized-ami/amazon-linux-2023/neuron/{NEURON_AMI_NAME}/image_id"

# The x86 staging hosts run the plain ECS-optimized AL2023 AMI of the same release (aws/amazon-ecs-ami@eb80a9f
# builds every variant of 20260403), pinned the same way and for the same reason: a replacement node
# must boot what its peers booted. The x86_64 variant has no variant segment ("Amazon Linux 2023 AMI
# metadata: /aws/service/ecs/optimized-ami/amazon-linux-2023/<version>", same guide page).
X86_AMI_NAME = "al2023-ami-ecs-hvm-2023.0.20260403-kernel-6.1-x86_64"
X86_AMI_PARAMETER = f"/aws/service/ecs/optimized-ami/amazon-linux-2023/{X86_AMI_NAME}/image_id"


@dataclass(frozen=True)
class NodeAmi:
    """The ECS AMI release a host type boots: its name (what EC2's DescribeImages reports) and the
    public SSM parameter that resolves to its id in each region."""

    name: str
    parameter: str


NEURON_AMI = NodeAmi(name=NEURON_AMI_NAME, parameter=NEURON_AMI_PARAMETER)
X86_AMI = NodeAmi(name=X86_AMI_NAME, parameter=X86_AMI_PARAMETER)


def node_ami(*, trainium: bool) -> NodeAmi:
    """Trainium hosts boot the Neuron AMI (its driver exposes /dev/neuron*); x86 hosts the plain one."""
    return NEURON_AMI if trainium else X86_AMI


# --- Artifacts the boot installs ----------------------------------------------------------------------
# Under this prefix of the model bucket (model.s3_uri's bucket, which every deployment already owns and
# fills before its first deploy): the boot reads it through the VPC's S3 gateway endpoint, so a node
# boots with the NAT gateways and the internet gone.
NODE_ARTIFACTS_PREFIX = "flotilla-node-artifacts/"
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class BootArtifact:
    """One file a node's boot installs: fetched from s3://<model bucket>/<key>, refused unless its
    SHA-256 is `sha256`. `upstream_url` is where the staging command downloads it from; `source`
    is where AWS publishes the version, the URL and the checksum."""

    name: str
    version: str
    filename: str
    sha256: str
    upstream_url: str
    source: str

    def __post_init__(self) -> None:
        if not _HEX64.match(self.sha256):
            raise ValueError(f"{self.name}: sha256 must be 64 lowercase hexadecimal digits")

    @property
    def key(self) -> str:
        return NODE_ARTIFACTS_PREFIX + self.filename


# The EFA installer, host part (kernel driver and rdma-core, `--minimal`) on every node with EFA
# interfaces, and user space (libfabric, `--skip-kmod`) in the multi-node image. Version and URL: EC2
# user guide, "Get started with EFA and MPI" (efa-start.html), step "Install the EFA software": curl -O
# https://efa-installer.amazonaws.com/aws-efa-installer-1.47.0.tar.gz. SHA-256: the one AWS publishes for
# 1.47.0 (EC2 user guide, "Verify the EFA installer using a checksum", efa-verify.html: "If the checksums
# do not match, do not run the installation script").
EFA_INSTALLER = BootArtifact(
    name="EFA installer",
    version="1.47.0",
    filename="aws-efa-installer-1.47.0.tar.gz",
    sha256="2df4201e046833c7dc8160907bee7f52b76ff80ed147376a2d0ed8a0dd66b2db",
    upstream_url="https://efa-installer.amazonaws.com/aws-efa-installer-1.47.0.tar.gz",
    source="EC2 user guide: efa-start.html (version, URL), efa-verify.html (SHA-256)",
)

ALL_BOOT_ARTIFACTS: tuple[BootArtifact, ...] = (EFA_INSTALLER,)


def boot_artifacts(*, efa_interfaces: int) -> tuple[BootArtifact, ...]:
    """What a host with this many EFA interfaces installs at boot: the EFA installer where there is
    EFA (every Trainium type), nothing on an x86 staging host."""
    return (EFA_INSTALLER,) if efa_interfaces else ()
