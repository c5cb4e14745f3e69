"""The x86 instance types a unit may run on besides Trainium (the staging fleet's hosts), and the
public SSM parameter of the pinned AMI release each kind of host boots.

A staging fleet deploys every stack and runbook of a Trainium fleet on small x86 instances running
the reference engine (examples/staging.yaml). Standard library only: stacks/config.py reads it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from contract.node_boot import node_ami
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


def ami_parameter(instance_type: str) -> str:
    """The public SSM parameter of the AMI a unit of this type boots (stacks/unit.py unit_ami): Trainium
    hosts the Neuron AMI (its driver exposes /dev/neuron*), x86 hosts the plain one. The pinned
    releases, and why these, are in contract/node_boot.py."""
    return node_ami(trainium=is_trainium(instance_type)).parameter
