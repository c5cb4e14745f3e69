"""Hardware figures the capacity planner uses, each with the AWS page it comes from.

docs/hardware.md lists the same figures with their sources; a test keeps the two in step.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 2**30

NEURON_TRN1_ARCH = (
    "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/arch/neuron-hardware/trn1-arch.html"
)
NEURON_TRAINIUM_ARCH = (
    "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/arch/neuron-hardware/trainium.html"
)
NEURON_MULTI_NODE = (
    "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/frameworks/torch/torch-neuronx/"
    "setup-trn1-multi-node-execution.html"
)


@dataclass(frozen=True)
class InstanceSpec:
    """One trn1 instance type, as the Neuron architecture pages describe it."""

    instance_type: str
    chips: int                       # Trainium (v1) chips per instance
    neuron_cores_per_chip: int       # NeuronCore-v2 per Trainium chip
    hbm_bytes_per_chip: int          # device memory per chip
    hbm_bytes_per_s_per_chip: float  # device memory bandwidth per chip
    bf16_flops_per_chip: float       # dense FP16/BF16 peak per chip
    efa_gbps: int                    # EFA network bandwidth of the instance
    efa_interfaces: int
    sources: tuple[str, ...]

    @property
    def neuron_cores(self) -> int:
        return self.chips * self.neuron_cores_per_chip

    @property
    def hbm_bytes_per_core(self) -> int:
        # Two NeuronCores share one chip's HBM; the compiler gives each its half.
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


# Device memory bandwidth: the Trainium page gives 820 GiB/s per chip and the trn1 table 13,120
# GiB/s per instance (16 x 820). Older pages wrote "820 GB/sec"; the planner takes the larger
# reading (GiB) so that its latency figure stays a true lower bound.
_TRN1_COMMON = dict(
    chips=16,
    neuron_cores_per_chip=2,
    hbm_bytes_per_chip=32 * GIB,
    hbm_bytes_per_s_per_chip=820 * GIB,
    bf16_flops_per_chip=190e12,
    sources=(NEURON_TRN1_ARCH, NEURON_TRAINIUM_ARCH, NEURON_MULTI_NODE),
)

INSTANCES: dict[str, InstanceSpec] = {
    "trn1.32xlarge": InstanceSpec(instance_type="trn1.32xlarge", efa_gbps=800, efa_interfaces=8, **_TRN1_COMMON),
    "trn1n.32xlarge": InstanceSpec(instance_type="trn1n.32xlarge", efa_gbps=1600, efa_interfaces=16, **_TRN1_COMMON),
}


def instance_spec(instance_type: str) -> InstanceSpec:
    try:
        return INSTANCES[instance_type]
    except KeyError:
        raise ValueError(
            f"instance type {instance_type!r} is not supported: use one of {', '.join(sorted(INSTANCES))} "
            "(multi-node units need EFA, which trn1.2xlarge lacks)"
        ) from None
