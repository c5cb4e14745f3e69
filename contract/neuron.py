"""The two ways a `neuron` unit serves, and the AWS container image each one is built on.

One node: the supported V1 `vllm-neuron` plugin with vLLM's OpenAI server. More than one node: NxD
Inference itself, split over every node's NeuronCores and driven by flotilla's leader/follower loop
(vLLM's plugin runs one node only). Both on the SDK 2.28 container, the last that supports trn1. The CDK app picks the
Dockerfile, the runtime the launch, the planners the advice, all from this one table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

SINGLE_NODE = "single-node"
MULTI_NODE = "multi-node"

# Repositories at the revisions every citation below refers to.
DLC_2_28_0 = "aws-neuron/deep-learning-containers@6776548882d6fc2cefc979eb941a6a76095aeb2d"  # tag 2.28.0
SDK_DOCS_2_28_0 = "aws-neuron/aws-neuron-sdk@86a9286833dc2a1cd23b674f7081061924aa587a"  # tag v2.28.0
SDK_DOCS_HEAD = "aws-neuron/aws-neuron-sdk@81ce03ae261e12925e53437a0f690478e6366155"
PLUGIN_0_4_1 = "vllm-project/vllm-neuron@4fac6b7b922288325cf1d06ca3b1d990255230e2"  # branch release-0.4.1
FORK_2_24 = "aws-neuron/upstreaming-to-vllm@490ab20f123913937456e9ff8047a88f0b18a623"  # neuron-2.24-vllm-v0.7.2
# NxD Inference and NxD at the Neuron SDK 2.28.0 component release (the multi-node engine's pins).
NXDI_2_28 = "aws-neuron/neuronx-distributed-inference@cd3abf30558fe1a14dadfb1397c2118e3fcfcc11"  # SDK 2.28.0
NXD_2_28 = "aws-neuron/neuronx-distributed@73ab227d1a76936f763a6631b324e2fc6650e0ba"  # SDK 2.28.0
VLLM_0_13_0 = "vllm==0.13.0 wheel (sha256 12b3d0a3b91c32a0091349de64b464f1c3d499a5b3a5d0ec387fef94ed5df6ee)"


@dataclass(frozen=True)
class NeuronImage:
    """An AWS Neuron vLLM container and how flotilla runs it. `sources`: claim -> where it is stated."""

    mode: str  # SINGLE_NODE | MULTI_NODE
    dockerfile: str  # repository path of the Dockerfile that adds the flotilla runtime
    base_image: str  # the AWS Deep Learning Container it starts FROM
    neuron_sdk: str  # also FLOTILLA_NEURON_SDK_VERSION, part of the compile-cache key
    vllm: str  # what serves the model inside it
    server: str  # the module the leader runs
    api: str  # what the leader's engine process talks to
    python: str  # the image's Python, which runs vLLM
    sources: Mapping[str, str] = field(compare=False, repr=False)


SINGLE_NODE_IMAGE = NeuronImage(
    mode=SINGLE_NODE,
    dockerfile="runtime/Dockerfile.neuron",
    base_image="public.ecr.aws/neuron/pytorch-inference-vllm-neuronx:0.13.0-neuronx-py312-sdk2.28.0-ubuntu24.04",
    neuron_sdk="2.28.0",
    vllm="vLLM 0.13.0 (V1 engine) + vllm-neuron plugin release-0.4.1 + NxD Inference 0.8.16251",
    server="vllm.entrypoints.openai.api_server",
    api="openai",
    python="3.12",
    sources={
        "base_image": f"{DLC_2_28_0}:README.md:78 (platforms trn1,trn2,trn3,inf2)",
        "vllm": f"{DLC_2_28_0}:vllm/inference/0.13.0/Dockerfile.neuronx:166,170-171 (NxDI pin, plugin branch); "
        f"{PLUGIN_0_4_1}:requirements/core.txt (vllm==0.13.0)",
        "why this SDK": f"{SDK_DOCS_HEAD}:release-notes/components/nxd-inference.rst:58-61 (2.29.0: NxD Inference "
        "models are only supported on Trn2 and newer; Trn1 users should pin to release 2.28)",
        "single node only": f"{PLUGIN_0_4_1}:vllm_neuron/worker/neuron_worker.py:181-182 (world_size=1)",
        "server": f"{PLUGIN_0_4_1}:README.md:226-233 (python3 -m vllm.entrypoints.openai.api_server)",
    },
)

MULTI_NODE_IMAGE = NeuronImage(
    mode=MULTI_NODE,
    dockerfile="runtime/Dockerfile.neuron-multinode",
    base_image="public.ecr.aws/neuron/pytorch-inference-vllm-neuronx:0.13.0-neuronx-py312-sdk2.28.0-ubuntu24.04",
    neuron_sdk="2.28.0",
    vllm="NxD Inference 0.8.16251 + NxD 0.17.26814 under flotilla's leader/follower loop (vLLM unused)",
    server="runtime/engines/neuron/spmd.py",
    api="spmd",
    python="3.12",
    sources={
        "base_image": f"{DLC_2_28_0}:README.md:78 (platforms trn1,trn2,trn3,inf2)",
        "vllm": f"{DLC_2_28_0}:vllm/inference/0.13.0/Dockerfile.neuronx:165-166 (NxD and NxD Inference pins)",
        "multi node": f"{NXDI_2_28}:examples/multi_node.md:47-49,106-145 (one process per node, global "
        "--tp-degree, --start_rank_id, --local_ranks_size, NEURON_RT_ROOT_COMM_ID)",
        "efa": f"{DLC_2_28_0}:vllm/inference/0.13.0/Dockerfile.neuronx:92-105 (efa_installer.sh --skip-kmod); "
        f"{SDK_DOCS_2_28_0}:neuron-runtime/nrt-troubleshoot.rst:510-511",
        "server": "runtime/engines/neuron/spmd.py (the leader's loop; followers mirror each step)",
    },
)

IMAGES: Mapping[str, NeuronImage] = {SINGLE_NODE: SINGLE_NODE_IMAGE, MULTI_NODE: MULTI_NODE_IMAGE}


def mode_for(nodes: int) -> str:
    """A unit of one node serves on the supported plugin; a unit that spans nodes runs NxD Inference directly."""
    return SINGLE_NODE if nodes == 1 else MULTI_NODE


def image_for(nodes: int) -> NeuronImage:
    return IMAGES[mode_for(nodes)]
