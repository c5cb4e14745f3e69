"""What each Trainium instance type flotilla deploys offers, with the AWS page behind every figure.

The one table the config checks (stacks/), the Neuron launch plan (runtime/) and the capacity
planner (ops/) read. Standard library only. docs/hardware.md lists the same figures; a test keeps
the two in step.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

GIB = 2**30

TRN1_ARCH = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/arch/neuron-hardware/trn1-arch.html"
TRAINIUM_ARCH = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/arch/neuron-hardware/trainium.html"
MULTI_NODE_SETUP = (
    "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/frameworks/torch/torch-neuronx/"
    "setup-trn1-multi-node-execution.html"
)
TRN2_ARCH = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/arch/neuron-hardware/trn2-arch.html"
TRAINIUM2_ARCH = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/arch/neuron-hardware/trainium2.html"
LNC_CONFIG = (
    "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/about-neuron/arch/neuron-features/"
    "logical-neuroncore-config.html"
)
# The Neuron team's trn2 node-group template (linked from the Neuron EKS setup page): one EFA interface
# on each of network cards 0..15 (aws-neuron/aws-neuron-eks-samples@cecff9eb, commit ec8953f "Adding 8
# more efa devices for trn2"). EC2's own instance-type pages were not available to check it against.
TRN2_EFA_TEMPLATE = (
    "https://github.com/aws-neuron/aws-neuron-eks-samples/blob/cecff9eb48a91df0be2b277fb812827ba6092fbc/"
    "dp_bert_hf_pretrain/cfn/eks_trn2_ng_stack_al2023.yaml#L302-L415"
)


@dataclass(frozen=True)
class TrainiumInstance:
    """One Trainium instance type. `sources` names the page each figure comes from."""

    instance_type: str
    chips: int  # Trainium chips = Neuron devices, /dev/neuron0..chips-1
    # NeuronCores per chip as the Neuron runtime presents them: physical NeuronCore-v2 on trn1, logical
    # NeuronCores on trn2 (8 physical NeuronCore-v3 per chip, grouped in pairs at the default LNC=2).
    neuron_cores_per_chip: int
    hbm_bytes_per_chip: int  # device memory per chip
    hbm_bytes_per_s_per_chip: float  # device memory bandwidth per chip
    bf16_flops_per_chip: float  # dense FP16/BF16 peak per chip
    efa_interfaces: int  # one per network card: /dev/infiniband/uverbs0..N-1
    efa_gbps: int  # EFA network bandwidth of the instance
    vcpus: int
    memory_gib: int  # host memory
    sources: Mapping[str, str] = field(compare=False, repr=False)  # figure -> source URL

    @property
    def neuron_cores(self) -> int:
        """NeuronCores per node: also the node's local tensor-parallel degree."""
        return self.chips * self.neuron_cores_per_chip

    @property
    def hbm_bytes_per_core(self) -> int:
        # The cores of one chip share its HBM; the planner assumes an even split.
        return self.hbm_bytes_per_chip // self.neuron_cores_per_chip

    @property
    def hbm_bytes_per_s_per_core(self) -> float:
        return self.hbm_bytes_per_s_per_chip / self.neuron_cores_per_chip

    @property
    def efa_bytes_per_s(self) -> float:
        return self.efa_gbps * 1e9 / 8

    @property
    def bf16_flops(self) -> float:
        return self.bf16_flops_per_chip * self.chips


# Where each trn1 figure is stated. The trn1-arch instance table: 16 chips, 128 vCPUs, 512 GiB host
# memory, 800 / 1600 Gbps EFA. The Trainium page, per chip: 2 NeuronCore-v2, 32 GiB of device
# memory at 820 GiB/sec, 190 FP16/BF16 TFLOPS. The multi-node setup page: "trn1.32xlarge has 8 EFA
# devices, trn1n.32xlarge has 16 EFA devices".
_TRN1_SOURCES = {
    "chips": TRN1_ARCH,
    "neuron_cores_per_chip": TRAINIUM_ARCH,
    "hbm_bytes_per_chip": TRAINIUM_ARCH,
    "hbm_bytes_per_s_per_chip": TRAINIUM_ARCH,
    "bf16_flops_per_chip": TRAINIUM_ARCH,
    "efa_interfaces": MULTI_NODE_SETUP,
    "efa_gbps": TRN1_ARCH,
    "vcpus": TRN1_ARCH,
    "memory_gib": TRN1_ARCH,
}


def _trn1(instance_type: str, *, efa_interfaces: int, efa_gbps: int) -> TrainiumInstance:
    # Device memory bandwidth: the Trainium page gives 820 GiB/s per chip and the trn1 table 13,120
    # GiB/s per instance (16 x 820). Older pages wrote "820 GB/sec"; the larger reading (GiB) keeps
    # the capacity planner's latency figures true lower bounds.
    return TrainiumInstance(
        instance_type=instance_type,
        chips=16,
        neuron_cores_per_chip=2,
        hbm_bytes_per_chip=32 * GIB,
        hbm_bytes_per_s_per_chip=820 * GIB,
        bf16_flops_per_chip=190e12,
        efa_interfaces=efa_interfaces,
        efa_gbps=efa_gbps,
        vcpus=128,
        memory_gib=512,
        sources=dict(_TRN1_SOURCES),
    )


def _trn2() -> TrainiumInstance:
    # trn2-arch instance table (trn2.48xlarge column): 16 Trainium2 chips, 192 vCPUs, 2,048 GiB host
    # memory, 10.7 BF16 PFLOPS, 1,536 GiB device memory at 46.4 TB/s, EFAv3 3,200 Gbps. The Trainium2
    # page, per chip: eight NeuronCore-v3, 667 BF16 TFLOPS, 96 GiB at 2.9 TB/sec (TB, not TiB:
    # 16 x 2.9 = 46.4 in the instance table). LNC page: LNC=2 is the default and "a Trn2.48xlarge
    # instance presents 64 available NeuronCores"; AWS's 405B-on-one-trn2 tutorial uses TP 64.
    return TrainiumInstance(
        instance_type="trn2.48xlarge",
        chips=16,
        neuron_cores_per_chip=4,
        hbm_bytes_per_chip=96 * GIB,
        hbm_bytes_per_s_per_chip=2.9e12,
        bf16_flops_per_chip=667e12,
        efa_interfaces=16,
        efa_gbps=3200,
        vcpus=192,
        memory_gib=2048,
        sources={
            "chips": TRN2_ARCH,
            "neuron_cores_per_chip": LNC_CONFIG,
            "hbm_bytes_per_chip": TRAINIUM2_ARCH,
            "hbm_bytes_per_s_per_chip": TRAINIUM2_ARCH,
            "bf16_flops_per_chip": TRAINIUM2_ARCH,
            "efa_interfaces": TRN2_EFA_TEMPLATE,
            "efa_gbps": TRN2_ARCH,
            "vcpus": TRN2_ARCH,
            "memory_gib": TRN2_ARCH,
        },
    )


# Only the sizes with EFA: a unit spans nodes, and trn1.2xlarge has no EFA (multi-node setup page:
# "EFA is currently not available on the smaller instances sizes").
INSTANCES: Mapping[str, TrainiumInstance] = MappingProxyType(
    {
        "trn1.32xlarge": _trn1("trn1.32xlarge", efa_interfaces=8, efa_gbps=800),
        "trn1n.32xlarge": _trn1("trn1n.32xlarge", efa_interfaces=16, efa_gbps=1600),
        "trn2.48xlarge": _trn2(),
    }
)
