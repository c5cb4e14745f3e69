"""The x86 instance types a unit may run on besides Trainium (the staging fleet's hosts), and the
pinned AMI release each kind of host boots.

A staging fleet deploys every stack and runbook of a Trainium fleet on small x86 instances running
the reference engine (examples/staging.yaml). Standard library only: stacks/config.py reads it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from contract.trainium import INSTANCES as TRAINIUM_INSTANCES
from contract.trainium import TrainiumInstance

# EC2 instance types guide, general purpose specifications (m6i.large: 2 vCPUs, 8 GiB; m6i.xlarge:
# 4 vCPUs, 16 GiB; neither has instance store or EFA, which M6i offers only at 32xlarge and metal):
# https://docs.aws.amazon.com/ec2/latest/instancetypes/gp.html
GENERAL_PURPOSE_SPECS = "https://docs.aws.amazon.com/ec2/latest/instancetypes/gp.html"
# Cluster placement groups take "current generation instances, except for burstable performance
# instances (for example, T2) and Mac1 instances" (EC2 user guide, "Placement group rules and
# limitations", limitations-placement-groups.html): every type below is current generation and not
# burstable, so a staging unit gets the same cluster placement group as a Trainium unit.
PLACEMENT_GROUP_RULES = "https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/limitations-placement-groups.html"


@dataclass(frozen=True)
class X86Instance:
    """One x86 instance type: no Neuron devices, and EFA interfaces only where the type has them."""

    instance_type: str
    vcpus: int
    memory_gib: int
    efa_interfaces: int = 0
    chips: int = 0  # Trainium chips: none

    @property
    def sources(self) -> Mapping[str, str]:
        return {"vcpus": GENERAL_PURPOSE_SPECS, "memory_gib": GENERAL_PURPOSE_SPECS, "placement": PLACEMENT_GROUP_RULES}


X86_INSTANCES: Mapping[str, X86Instance] = MappingProxyType(
    {
        "m6i.large": X86Instance("m6i.large", vcpus=2, memory_gib=8),
        "m6i.xlarge": X86Instance("m6i.xlarge", vcpus=4, memory_gib=16),
    }
)

UnitHost = TrainiumInstance | X86Instance
HOST_INSTANCES: Mapping[str, UnitHost] = MappingProxyType({**TRAINIUM_INSTANCES, **X86_INSTANCES})


def is_trainium(instance_type: str) -> bool:
    return instance_type in TRAINIUM_INSTANCES


# The ECS-optimized AL2023 Neuron AMI release the units run, never "recommended": that one moves its
# Neuron driver (aws/amazon-ecs-ami scripts/enable-ecs-agent-inferentia-support.sh installs the latest
# aws-neuronx-dkms at build time), while the containers' runtime stays at Neuron SDK 2.28, and driver
# 2.29 "requires Neuron Runtime Library 2.33 or later ... [else] nrt_init() [fails]" (aws-neuron/aws-neuron-sdk
# @81ce03ae:release-notes/components/runtime.rst:329). Release 20260403 (aws/amazon-ecs-ami@eb80a9f, built
# 2026-04-03) predates SDK 2.29 (2026-04-09), so it carries the SDK 2.28 driver line (2.26.10.0,
# runtime.rst:742-747). The parameter is ECS's per-release form, /<variant>/<AMI name>/image_id
# (Amazon ECS developer guide, "Retrieving Amazon ECS-optimized Linux AMI metadata": ".../amazon-linux-2023/
# <version>"). The variant is "neuron": AWS's own release script reads .../amazon-linux-2023/neuron/recommended
# (aws/amazon-ecs-ami@eb80a9f:generate-release-notes.sh:155; aws/aws-cdk#34689 moved CDK from "inf", the
# Amazon Linux 2 variant, for this reason; some copies of the ECS guide still print "inf" for AL2023).
# The AMI name is the al2023neu build's, <prefix>-neuron-hvm-2023.0.<version><kernel>-x86_64
# (al2023neu.pkr.hcl:2) with version 20260403 and kernel -kernel-6.1 (release-al2023.auto.pkrvars.hcl:1,10)
# and the public prefix al2023-ami-ecs (the releases' notes name al2023-ami-ecs-neuron-hvm-... AMIs).
# docs/hardware.md.
NEURON_AMI_NAME = "al2023-ami-ecs-neuron-hvm-2023.0.20260403-kernel-6.1-x86_64"
NEURON_AMI_PARAMETER = f"/aws/service/ecs/optimized-ami/amazon-linux-2023/neuron/{NEURON_AMI_NAME}/image_id"


# The x86 staging hosts run the plain ECS-optimized AL2023 AMI of the same ECS AMI release
# (aws/amazon-ecs-ami@eb80a9f builds every variant of 20260403), pinned the same way and for the same
# reason: a replacement node must boot what its peers booted. Parameter form: Amazon ECS developer
# guide, "Retrieving Amazon ECS-optimized Linux AMI metadata"
# (https://docs.aws.amazon.com/AmazonECS/latest/developerguide/retrieve-ecs-optimized_AMI.html),
# section "Systems Manager Parameter Store parameter format": "Amazon Linux 2023 AMI metadata:
# /aws/service/ecs/optimized-ami/amazon-linux-2023/<version>" (the x86_64 variant has no variant
# segment; arm64, neuron and gpu do); "the metadata of a specific Amazon ECS-optimized AMI version
# [is retrieved] by specifying the AMI name" (its example is Amazon Linux 2's
# .../amazon-linux-2/amzn2-ami-ecs-hvm-2.0.20181112-x86_64-ebs); and the AMI ID alone is the
# "sub-parameter image_id" (.../amazon-linux-2023/recommended/image_id). Together:
# /aws/service/ecs/optimized-ami/amazon-linux-2023/<AMI name>/image_id.
X86_AMI_NAME = "al2023-ami-ecs-hvm-2023.0.20260403-kernel-6.1-x86_64"
X86_AMI_PARAMETER = f"/aws/service/ecs/optimized-ami/amazon-linux-2023/{X86_AMI_NAME}/image_id"


def ami_parameter(instance_type: str) -> str:
    """The public SSM parameter of the AMI a unit of this type boots (stacks/unit.py unit_ami): Trainium
    hosts the Neuron AMI (its driver exposes /dev/neuron*), x86 hosts the plain one."""
    return NEURON_AMI_PARAMETER if is_trainium(instance_type) else X86_AMI_PARAMETER
