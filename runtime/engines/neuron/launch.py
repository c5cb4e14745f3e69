"""Turn a unit's membership and a model's shape into every rank's Neuron environment and command.

Two modes (contract/neuron.py): a one-node unit runs vLLM's OpenAI server on the supported V1
`vllm-neuron` plugin; a unit spanning nodes runs NxD Inference split over every node's NeuronCores
(global tp_degree, one start_rank_id per node) as NxD Inference's multi-node example does, driven by
flotilla's leader/follower loop (spmd.py). Every variable and flag carries the file and line it follows
(`SOURCES`, printed with the plan). Pure Python: nothing here imports vLLM, NxD Inference or torch.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import contract
from contract.layout import (
    AUTO,
    DEFAULT_BATCH_SIZE,
    DEFAULT_SEQ_LEN,
    RUNTIME_NAMES,
    LayoutError,
    Names,
    check_layout,
    describe_memory,
    splits,
)
from contract.llama import LlamaShape
from contract.neuron import (
    FORK_2_24,
    IMAGES,
    MULTI_NODE,
    NXD_2_28,
    NXDI_2_28,
    PLUGIN_0_4_1,
    SDK_DOCS_2_28_0,
    SINGLE_NODE,
    VLLM_0_13_0,
    NeuronImage,
    image_for,
    mode_for,
)
from contract.sizing import CoreMemory, core_memory
from contract.speculation import SOURCES as SPECULATION_SOURCES
from contract.speculation import Speculation
from contract.trainium import INSTANCES, TrainiumInstance
from runtime.engines.neuron.speculation import draft_dir, nxdi_speculation, speculative_flags
from runtime.membership import Membership

DEFAULT_COMPILED_DIR = "/var/cache/flotilla/neuron-compiled"
OPENAI_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
# Each node of a multi-node unit runs this file with the image's Python (the one that has NxD Inference).
SPMD_SCRIPT = str(Path(__file__).with_name("spmd.py"))
# NXDI_2_28:examples/multi_node.md:109,132 `NEURON_RT_ROOT_COMM_ID=<rank-0 host>:63423`: the Neuron
# runtime's collectives bootstrap on the leader. The unit's security group admits all traffic between members.
RT_ROOT_COMM_PORT = contract.NEURON_RT_ROOT_COMM_PORT
NXDI_CONFIG = "aws-neuron/neuronx-distributed-inference@fcb5a8688d237e1af429d6e72445db17277d630a"  # v0.7.14366

_QUICKSTART = f"{SDK_DOCS_2_28_0}:libraries/nxd-inference/vllm/quickstart-vllm-online-serving.rst"
_LOADER = f"{PLUGIN_0_4_1}:vllm_neuron/worker/neuronx_distributed_model_loader.py"

# Where every variable and flag of a single-node rank comes from.
SINGLE_NODE_SOURCES: Mapping[str, str] = {
    "command": f"{PLUGIN_0_4_1}:README.md:226-233 (python3 -m vllm.entrypoints.openai.api_server)",
    "VLLM_NEURON_FRAMEWORK": f"{_QUICKSTART}:57",
    "NEURON_COMPILED_ARTIFACTS": f"{_QUICKSTART}:156; {_LOADER}:221-223 (load from it, else compile into it)",
    "--model": f"{PLUGIN_0_4_1}:README.md:227",
    "--tensor-parallel-size": f"{_QUICKSTART}:61; {_LOADER}:1090 (NxD Inference tp_degree = tensor_parallel_size); "
    f"{PLUGIN_0_4_1}:README.md:215 (the instance's NeuronCore count)",
    "--max-model-len": f"{_QUICKSTART}:62",
    "--max-num-seqs": f"{_QUICKSTART}:63",
    "--no-enable-prefix-caching": f"{_QUICKSTART}:64; {VLLM_0_13_0}:vllm/engine/arg_utils.py:287-288,897-902",
    "--num-gpu-blocks-override": f"{PLUGIN_0_4_1}:README.md:288-291 (required; exactly max_num_seqs without "
    f"prefix caching); {VLLM_0_13_0}:vllm/engine/arg_utils.py:894-896",
    "--additional-config": f"{_QUICKSTART}:66-70 (override_neuron_config); {_LOADER}:1014",
    "--served-model-name": f"{VLLM_0_13_0}:vllm/engine/arg_utils.py:662",
    "--host": f"{VLLM_0_13_0}:vllm/entrypoints/openai/cli_args.py:76 (ours: 127.0.0.1, only our leader API calls it)",
    "--port": f"{VLLM_0_13_0}:vllm/entrypoints/openai/cli_args.py:78",
    "override_neuron_config.cp_degree": f"{NXDI_CONFIG}:src/neuronx_distributed_inference/models/config.py:334,342",
    "override_neuron_config.attention_dp_degree": f"{NXDI_CONFIG}:src/neuronx_distributed_inference/models/"
    "config.py:336,576-583",
    # Only with FLOTILLA_NEURON_SAMPLING=cpu: None makes the plugin sample on the host.
    "override_neuron_config.on_device_sampling_config": f"{PLUGIN_0_4_1}:vllm_neuron/worker/"
    "neuronx_distributed_model_runner.py:229-268 (host sampling only when None); "
    f"{_LOADER}:1213-1217 (the override is a plain dict.update)",
}

# The flags a single-node rank adds with prefix caching on (FLOTILLA_NEURON_PREFIX_CACHING_BLOCK). The
# release-0.4.1 branch could not be read where this was written (no such ref in the stored mirror of
# vllm-project/vllm-neuron, and 4fac6b7b is not stored): the plugin's lines are read at its newest stored
# revision, PLUGIN_MAIN, and must be checked against release-0.4.1 before the setting leaves opt-in.
PLUGIN_MAIN = "vllm-project/vllm-neuron@a5ef7c88c3e4e44bea9af9051d8fb113588c0a21"
PREFIX_CACHING_SOURCES: Mapping[str, str] = {
    "--enable-prefix-caching": f"{VLLM_0_13_0}:vllm/engine/arg_utils.py:897-902; {PLUGIN_MAIN}:README.md:92 "
    "(prefix caching functional), vllm_neuron/worker/neuronx_distributed_model_loader.py:779-782 "
    "(is_block_kv_layout and is_prefix_caching follow it), :837-839 (asserted)",
    "--block-size": f"{VLLM_0_13_0}:vllm/engine/arg_utils.py:885; {PLUGIN_MAIN}:vllm_neuron/platform.py:203-210 "
    "(required with prefix caching), neuronx_distributed_model_loader.py:777 (pa_block_size)",
    "--num-gpu-blocks-override": f"{PLUGIN_MAIN}:README.md:117 (ceil(max_model_len / block_size) x max_num_seqs), "
    "neuronx_distributed_model_loader.py:775 (pa_num_blocks), :796-830 (one more for vLLM's null block)",
    "--enable-prompt-tokens-details": f"{VLLM_0_13_0}:vllm/entrypoints/openai/cli_args.py:172 (off by default); "
    "vllm/entrypoints/openai/serving_completion.py:488-491 (cached_tokens in the streamed usage), "
    ":612-618 (non-streamed)",
    "stream_options.include_usage": f"{VLLM_0_13_0}:vllm/entrypoints/openai/serving_completion.py:493-500 "
    "(the usage chunk is sent only when asked)",
    "batch_size > 1": f"{PLUGIN_MAIN}:README.md:118 (known issue: prefix caching with batch_size=1 generates "
    "incorrect outputs)",
    "vllm:prefix_cache_queries, vllm:prefix_cache_hits": f"{VLLM_0_13_0}:vllm/v1/metrics/loggers.py:483-501, "
    "1028-1033 (prometheus_client Counters, in prompt tokens, exposed with the _total suffix)",
}

# Where every variable, flag and NxD Inference setting of a multi-node rank comes from.
_MULTI = f"{NXDI_2_28}:examples/multi_node.md"
_APP = f"{NXDI_2_28}:src/neuronx_distributed_inference/models/application_base.py"
_NXDI_CONF = f"{NXDI_2_28}:src/neuronx_distributed_inference/models/config.py"
MULTI_NODE_SOURCES: Mapping[str, str] = {
    "command": "runtime/engines/neuron/spmd.py (flotilla's leader/follower loop: one process per node, "
    f"as {_MULTI}:47-49,106-145 runs one inference_demo process per node; it calls {_APP}:292 compile and :317-318 "
    f"load, and {NXDI_2_28}:src/neuronx_distributed_inference/models/model_base.py:3355-3379 forward)",
    "NEURON_RT_ROOT_COMM_ID": f"{_MULTI}:109,132 (<rank-0 host>:63423 on every node)",
    "FI_PROVIDER": f"{FORK_2_24}:examples/neuron/multi_node/multi_node_launcher.sh:41 (EFA for the Neuron "
    "runtime's cross-node collectives)",
    "FI_EFA_USE_DEVICE_RDMA": f"{FORK_2_24}:examples/neuron/multi_node/multi_node_launcher.sh:42",
    "FI_EFA_FORK_SAFE": f"{FORK_2_24}:examples/neuron/multi_node/multi_node_launcher.sh:43",
    "MASTER_ADDR": f"{NXDI_2_28}:src/neuronx_distributed_inference/inference_demo.py:788-795 (the demo's gloo "
    "group, torch env://; flotilla's leader broadcasts each step's inputs over it)",
    "MASTER_PORT": f"{_MULTI}:56 (value: rendezvous gives it)",
    "NEURON_COMPILED_ARTIFACTS": f"{_MULTI}:114,137 (a compiled-model path per node)",
    "--model": f"{_MULTI}:113,136 (--model-path); {_APP}:73-78 (NeuronLlamaForCausalLM(model_path, config))",
    "--compiled-model-path": f"{_MULTI}:114,137; {_APP}:292,317-318",
    "--node-rank": f"{NXDI_2_28}:src/neuronx_distributed_inference/inference_demo.py:788-795 (the gloo rank; "
    "start_rank_id = node rank x local_ranks_size)",
    "--nodes": f"{NXDI_2_28}:src/neuronx_distributed_inference/inference_demo.py:788-795 (the gloo world size)",
    "--neuron-config": f"{_NXDI_CONF}:84,361-389 (NeuronConfig(**fields)); the fields are nxdi_config",
    "override_neuron_config.tp_degree": f"{_MULTI}:118,141 (--tp-degree 64 on two trn1: the unit's "
    f"NeuronCores); {_APP}:160",
    "override_neuron_config.start_rank_id": f"{_MULTI}:47-49 (a multiple of local_ranks_size), 116,139 "
    f"(0 / 32); {_NXDI_CONF}:385",
    "override_neuron_config.local_ranks_size": f"{_MULTI}:117,140 (32: one trn1's NeuronCores); {_NXDI_CONF}:386-389; "
    f"{NXD_2_28}:src/neuronx_distributed/trace/model_builder.py:837 (shards ranks start_rank_id .. "
    "start_rank_id + local_ranks_size - 1)",
    "world_size": f"{_NXDI_CONF}:381-383 (unset: tp_degree x pp_degree x ep_degree = tp_degree)",
    "is_continuous_batching": f"{_NXDI_CONF}:164,678-679 (batch slots are seq_ids; attention data "
    "parallelism requires it)",
    "partition of a global rank": f"{NXD_2_28}:src/neuronx_distributed/trace/trace.py:801 "
    "(partition_rank = rank % num_partitions)",
    "on_device_sampling_config": f"{_NXDI_CONF}:173-177,1023-1034 (a dict becomes OnDeviceSamplingConfig; "
    f"dynamic: each row's own top_k/top_p/temperature; global_topk 256 the default); {NXDI_2_28}:src/"
    "neuronx_distributed_inference/modules/generation/sampling.py:460-464 (dynamic or do_sample: per-row "
    "multinomial), :99-159 (rows validated: top_k -1 or 0..global_topk, 0 read as uniform), "
    "models/model_base.py:3863-3876 (outputs.logits None, tokens sampled); only with node.neuron_sampling device",
}
# NeuronConfig.on_device_sampling_config of a multi-node unit that samples on the device (MULTI_NODE_SOURCES).
MULTI_NODE_DEVICE_SAMPLING: Mapping[str, object] = {"do_sample": True, "dynamic": True, "global_topk": 256}


@dataclass(frozen=True)
class NeuronOptions:
    seq_len: int = DEFAULT_SEQ_LEN  # prompt + generated tokens, vLLM --max-model-len
    batch_size: int = DEFAULT_BATCH_SIZE  # sequences decoded together, vLLM --max-num-seqs
    cp_degree: int | str = AUTO  # single-node: context parallel (prefill); "auto": smallest that fits
    attention_dp_degree: int | str = AUTO  # single-node: attention data parallel (decode); "auto" likewise
    served_model_name: str | None = None
    compiled_artifacts_dir: str = DEFAULT_COMPILED_DIR
    engine_port: int = contract.NEURON_ENGINE_PORT  # leader's vLLM server, on 127.0.0.1 only
    # "cpu" (the default): vLLM's sampler on the host, each request with its own parameters, also
    # logprobs, structured output and penalties. "device": NxD Inference's on-device sampling (temperature,
    # top_k, top_p only), where the pinned plugin can give a request another request's parameters: it
    # fills the [batch, 3] tensor from every held request in insertion order, then cuts it to the batch
    # (vllm-project/vllm-neuron@84411ab: neuronx_distributed_model_runner.py get_nxd_sampling_params;
    # tests/neuron/test_neuron_sampling_rows.py). Neither mode seeds a request (requests.py).
    sampling: str = "cpu"
    # Single node: 0 runs without prefix caching; B > 0 runs vLLM's prefix caching over NxD Inference's
    # block KV layout in blocks of B tokens (opt-in: no trn1 run has checked outputs and memory with it).
    prefix_caching_block: int = 0
    speculation: Speculation = Speculation()  # EAGLE, one node only (contract/speculation.py)


def prefix_cache_blocks(seq_len: int, batch_size: int, block: int) -> int:
    """--num-gpu-blocks-override with prefix caching: the plugin asks for ceil(max_model_len /
    block_size) x max_num_seqs "to avoid a potential OOB error" (PREFIX_CACHING_SOURCES)."""
    return -(-seq_len // block) * batch_size


@dataclass(frozen=True)
class RankPlan:
    rank: int
    role: str  # leader | follower
    mode: str  # single-node | multi-node (contract/neuron.py)
    start_rank_id: int  # first global NeuronCore rank on this node
    env: Mapping[str, str]
    command: tuple[str, ...]
    override_neuron_config: Mapping[str, object]  # exactly what the command passes to NxD Inference
    nxdi_config: Mapping[str, object]  # what NxD Inference compiles for (vLLM flags + override): cache key

    @property
    def api(self) -> str:
        """What the leader's server speaks: 'openai' (/v1/completions) or 'generate' (the fork's /generate)."""
        return IMAGES[self.mode].api


@dataclass(frozen=True)
class NeuronUnitPlan:
    instance: TrainiumInstance
    nodes: int
    leader_host: str
    dist_port: int  # leader's gloo port (torch env://): the fork broadcasts each step's inputs over it
    tp_degree: int  # what NxD Inference gets as tp_degree
    world_size: int  # NeuronCore ranks over the unit
    cp_degree: int
    attention_dp_degree: int
    seq_len: int
    batch_size: int
    model: LlamaShape
    model_dir: str
    ranks: tuple[RankPlan, ...] = field(default_factory=tuple)

    @property
    def mode(self) -> str:
        return mode_for(self.nodes)

    @property
    def image(self) -> NeuronImage:
        return image_for(self.nodes)

    @property
    def prefill_attention_tp(self) -> int:
        """Ranks sharing one context-parallel group's attention heads during prefill."""
        return self.tp_degree // self.cp_degree

    @property
    def decode_attention_tp(self) -> int:
        """Ranks sharing one data-parallel group's attention heads during decode."""
        return self.tp_degree // self.attention_dp_degree

    def to_dict(self) -> dict:
        shape = self.model
        image = self.image
        return {
            "engine": "neuron",
            "mode": self.mode,
            "image": {
                "dockerfile": image.dockerfile,
                "base_image": image.base_image,
                "neuron_sdk": image.neuron_sdk,
                "vllm": image.vllm,
                "server": image.server,
                "api": image.api,
                "sources": dict(image.sources),
            },
            "instance_type": self.instance.instance_type,
            "nodes": self.nodes,
            "leader_host": self.leader_host,
            "model_dir": self.model_dir,
            "model": dataclasses.asdict(shape),
            "parallelism": {
                "local_tp": self.instance.neuron_cores,
                "tp_degree": self.tp_degree,
                "world_size": self.world_size,
                "cp_degree": self.cp_degree,
                "attention_dp_degree": self.attention_dp_degree,
                "prefill": _head_layout(shape, self.prefill_attention_tp),
                "decode": _head_layout(shape, self.decode_attention_tp),
                "intermediate_per_rank": shape.intermediate_size // self.tp_degree,
            },
            "seq_len": self.seq_len,
            "batch_size": self.batch_size,
            "ranks": [
                {
                    "rank": r.rank,
                    "role": r.role,
                    "start_rank_id": r.start_rank_id,
                    "global_core_ranks": [r.start_rank_id, r.start_rank_id + self.instance.neuron_cores - 1],
                    "env": dict(r.env),
                    "command": list(r.command),
                    "override_neuron_config": dict(r.override_neuron_config),
                    "nxdi_config": dict(r.nxdi_config),
                }
                for r in self.ranks
            ],
            "sources": {**SINGLE_NODE_SOURCES, **PREFIX_CACHING_SOURCES}
            if self.mode == SINGLE_NODE
            else dict(MULTI_NODE_SOURCES),
        }


def _head_layout(shape: LlamaShape, attention_tp: int) -> dict:
    return {
        "attention_tp": attention_tp,
        "q_heads_per_rank": shape.num_attention_heads // attention_tp,
        # KV heads are replicated when there are fewer of them than ranks (NxDI's
        # replicate-to-tp-degree GQA sharding), so each rank still holds at least one.
        "kv_heads_per_rank": max(1, shape.num_key_value_heads // attention_tp),
    }


def plan_unit(
    *,
    leader_host: str,
    nodes: int,
    instance_type: str,
    model: LlamaShape,
    model_dir: str,
    options: NeuronOptions = NeuronOptions(),
    dist_port: int = contract.DIST_PORT,
    model_name: str | None = None,
    names: Names = RUNTIME_NAMES,
    draft: LlamaShape | None = None,
) -> NeuronUnitPlan:
    """Check the layout (contract/layout.py, the check synth runs too) and build every rank's plan.
    Raises LayoutError naming the input and the fix. `draft`: the EAGLE draft's shape, whose memory the
    check counts beside the model's (without it, contract.sizing's estimate).

    Across nodes this is NxD Inference's multi-node mode: tp_degree is the whole unit's NeuronCores,
    each node loads ranks start_rank_id .. start_rank_id + local_ranks_size - 1 (NXDI_2_28:
    examples/multi_node.md:106-145, "two process with tp=64 on two Trn1 nodes"). A node-sized
    tp_degree would make every node load partitions 0..31 again (NXD_2_28:src/neuronx_distributed/
    trace/trace.py:801, partition_rank = rank % num_partitions): replicas that cannot hold a model too
    big for one node."""
    if not leader_host:
        raise LayoutError("leader_host", "", "is empty", "rendezvous must name the leader's address", names={})
    o = options
    if nodes > 1 and o.speculation.on:
        raise LayoutError(
            "nodes",
            nodes,
            f"with speculation {o.speculation.method}: speculation runs on one-node units only "
            f"({SPECULATION_SOURCES['one node']})",
            "use 1 node or no speculation",
            names=names,
        )
    layout = check_layout(
        model,
        instance_type=instance_type,
        nodes=nodes,
        seq_len=o.seq_len,
        batch_size=o.batch_size,
        cp_degree=o.cp_degree,
        attention_dp_degree=o.attention_dp_degree,
        prefix_caching_block=o.prefix_caching_block,
        model=model_name or model_dir,
        names=names,
        speculation=o.speculation.method,
        draft=draft,
    )
    instance = INSTANCES[instance_type]
    tp, cp, dp = layout.tp_degree, layout.cp_degree, layout.attention_dp_degree
    plan = NeuronUnitPlan(
        instance=instance,
        nodes=nodes,
        leader_host=leader_host,
        dist_port=dist_port,
        tp_degree=tp,
        world_size=tp,  # NxD Inference: tp_degree x pp_degree x ep_degree (pp = ep = 1)
        cp_degree=cp,
        attention_dp_degree=dp,
        seq_len=o.seq_len,
        batch_size=o.batch_size,
        model=model,
        model_dir=model_dir,
    )
    build = _single_node_rank if nodes == 1 else _multi_node_rank
    ranks = tuple(build(plan, rank, o) for rank in range(nodes))
    return dataclasses.replace(plan, ranks=ranks)


def _single_node_rank(plan: NeuronUnitPlan, rank: int, o: NeuronOptions) -> RankPlan:
    """vLLM's OpenAI server on the V1 plugin, as AWS's online-serving quickstart starts it."""
    override: dict[str, object] = {}
    # NxD Inference defaults both to 1; pass them only when the heads need them.
    if plan.cp_degree > 1:
        override["cp_degree"] = plan.cp_degree
    if plan.attention_dp_degree > 1:
        override["attention_dp_degree"] = plan.attention_dp_degree
    if o.sampling == "cpu":
        # vllm-neuron samples on the host only when on_device_sampling_config is None (PLUGIN_0_4_1:
        # vllm_neuron/worker/neuronx_distributed_model_runner.py:229-268); the override is a plain
        # dict.update (neuronx_distributed_model_loader.py:1213-1217).
        override["on_device_sampling_config"] = None
    env = {
        "VLLM_NEURON_FRAMEWORK": "neuronx-distributed-inference",
        "NEURON_COMPILED_ARTIFACTS": o.compiled_artifacts_dir,
    }
    command = [
        "python3",
        "-m",
        OPENAI_SERVER_MODULE,
        "--model",
        plan.model_dir,
        "--tensor-parallel-size",
        str(plan.tp_degree),
        "--max-model-len",
        str(plan.seq_len),
        "--max-num-seqs",
        str(plan.batch_size),
    ]
    block = o.prefix_caching_block
    blocks = prefix_cache_blocks(plan.seq_len, plan.batch_size, block) if block else plan.batch_size
    if block:
        # PREFIX_CACHING_SOURCES: the plugin derives the block KV layout from these flags, and vLLM
        # reports cached prompt tokens only with --enable-prompt-tokens-details.
        command += ["--enable-prefix-caching", "--block-size", str(block)]
        command += ["--num-gpu-blocks-override", str(blocks), "--enable-prompt-tokens-details"]
    else:
        command += ["--no-enable-prefix-caching", "--num-gpu-blocks-override", str(blocks)]
    if override:
        command += ["--additional-config", json.dumps({"override_neuron_config": override})]
    sp = o.speculation
    command += speculative_flags(sp.method, sp.num_speculative_tokens, draft_dir(plan.model_dir, sp.draft_dir))
    command += [
        "--served-model-name",
        o.served_model_name or plan.model_dir,
        # Only our leader API (same host) talks to vLLM; it never faces the network.
        "--host",
        "127.0.0.1",
        "--port",
        str(o.engine_port),
    ]
    # The plugin's default NxD Inference config from these flags (vllm-project/vllm-neuron@4fac6b7b, branch
    # release-0.4.1: vllm_neuron/worker/neuronx_distributed_model_loader.py:1071-1109, the dict at
    # :1089-1109; without prefix caching the platform sets block_size = max_model_len, platform.py:299-304).
    # That platform first adds 1 to --num-gpu-blocks-override for vLLM's null block (platform.py:239-253),
    # so NxD Inference is given pa_num_blocks batch_size + 1; the key records the flag's value.
    nxdi: dict[str, object] = {
        "tp_degree": plan.tp_degree,
        "batch_size": plan.batch_size,
        "max_context_length": plan.seq_len,
        "seq_len": plan.seq_len,
        "pa_num_blocks": blocks,
        "pa_block_size": block or plan.seq_len,
        "is_prefix_caching": bool(block),
        **override,
        **nxdi_speculation(sp.method, sp.num_speculative_tokens),
    }
    if block:  # the compiled model differs: NxD Inference's block KV layout (PREFIX_CACHING_SOURCES)
        nxdi["is_block_kv_layout"] = True
    return RankPlan(
        rank=rank,
        role="leader",
        mode=SINGLE_NODE,
        start_rank_id=0,
        env=env,
        command=tuple(command),
        override_neuron_config=override,
        nxdi_config=nxdi,
    )


def _multi_node_rank(plan: NeuronUnitPlan, rank: int, o: NeuronOptions) -> RankPlan:
    """One node of NxD Inference's multi-node layout, driven by flotilla's leader/follower loop."""
    local_ranks_size = plan.instance.neuron_cores
    start_rank_id = rank * local_ranks_size
    # The NeuronConfig fields the loop sets; everything else keeps NxD Inference's default.
    override = {
        "tp_degree": plan.tp_degree,
        "start_rank_id": start_rank_id,
        "local_ranks_size": local_ranks_size,
    }
    # Each node compiles and loads its own rank range into its own directory (the example's "compiled-model
    # path per node"); the compile cache keys it by nxdi_config, which holds this node's start_rank_id. The
    # buckets follow from it too: bucketing is off unless set, one bucket of seq_len, no context-encoding or
    # token-generation buckets (NXDI_2_28:src/neuronx_distributed_inference/models/config.py:186-191).
    compiled = o.compiled_artifacts_dir
    env = {
        "FI_PROVIDER": "efa",
        "FI_EFA_USE_DEVICE_RDMA": "1",
        "FI_EFA_FORK_SAFE": "1",
        "MASTER_ADDR": plan.leader_host,
        "MASTER_PORT": str(plan.dist_port),
        "NEURON_RT_ROOT_COMM_ID": f"{plan.leader_host}:{RT_ROOT_COMM_PORT}",
        "NEURON_COMPILED_ARTIFACTS": compiled,
    }
    nxdi: dict[str, object] = {
        "tp_degree": plan.tp_degree,
        "world_size": plan.world_size,
        "start_rank_id": start_rank_id,
        "local_ranks_size": local_ranks_size,
        "batch_size": plan.batch_size,
        "max_context_length": plan.seq_len,
        "seq_len": plan.seq_len,
        "is_continuous_batching": True,
    }
    if o.sampling == "device":
        # NxD Inference samples each row on the device with its own parameters; the leader's loop
        # turns "no top-k" into global_topk (spmd.py, device_sampling_rows). Default "cpu": host sampling.
        nxdi["on_device_sampling_config"] = dict(MULTI_NODE_DEVICE_SAMPLING)
    command = (
        "python3",
        SPMD_SCRIPT,
        f"--model={plan.model_dir}",
        f"--compiled-model-path={compiled}",
        f"--node-rank={rank}",
        f"--nodes={plan.nodes}",
        f"--neuron-config={json.dumps(nxdi, sort_keys=True)}",
    )
    return RankPlan(
        rank=rank,
        role="leader" if rank == 0 else "follower",
        mode=MULTI_NODE,
        start_rank_id=start_rank_id,
        env=env,
        command=command,
        override_neuron_config=override,
        nxdi_config=nxdi,
    )


def plan_member(
    membership: Membership,
    *,
    instance_type: str,
    model: LlamaShape,
    model_dir: str,
    options: NeuronOptions = NeuronOptions(),
    model_name: str | None = None,
    names: Names = RUNTIME_NAMES,
    draft: LlamaShape | None = None,
) -> RankPlan:
    """This process's plan: the whole unit is validated so every member fails the same way."""
    unit = plan_unit(
        leader_host=membership.dist_host,
        nodes=membership.world_size,
        instance_type=instance_type,
        model=model,
        model_dir=model_dir,
        options=options,
        dist_port=membership.dist_port,
        model_name=model_name,
        names=names,
        draft=draft,
    )
    return unit.ranks[membership.rank]


@dataclass(frozen=True)
class Recommendation:
    """The smallest unit whose NeuronCores hold the model and its KV cache, and the image it needs."""

    nodes: int | None  # None: no unit up to max_nodes fits
    mode: str | None
    image: NeuronImage | None
    memory: CoreMemory  # at `nodes`, or at the largest unit tried when nothing fits
    why: str


def recommend(
    model: LlamaShape, instance_type: str, *, seq_len: int, batch_size: int, max_nodes: int = 8
) -> Recommendation:
    """One node whenever the weights and the KV cache for batch_size x seq_len fit it; more only if not.

    Memory per NeuronCore follows contract/sizing.py (docs/hardware.md), the rule `flotilla plan` uses.
    """
    instance = INSTANCES[instance_type]
    gib = 2**30
    one = core_memory(model, instance, nodes=1, batch=batch_size, seq_len=seq_len)
    need = describe_memory(one, batch_size, seq_len)
    if one.fits:
        image = image_for(1)
        return Recommendation(
            nodes=1,
            mode=SINGLE_NODE,
            image=image,
            memory=one,
            why=f"fits one {instance_type}: {need} <= {one.usable / gib:.2f} GiB usable; "
            f"single-node units run {image.base_image} ({image.vllm}) with the OpenAI server",
        )
    memory = one
    skipped = []
    for nodes in range(2, max_nodes + 1):
        tp = instance.neuron_cores * nodes
        if not splits(model, tp):
            skipped.append(nodes)
            continue
        memory = core_memory(model, instance, nodes=nodes, batch=batch_size, seq_len=seq_len)
        if memory.fits:
            image = image_for(nodes)
            not_split = (
                f"; not {', '.join(map(str, skipped))} node(s): tp_degree would not split "
                f"num_attention_heads={model.num_attention_heads} evenly"
                if skipped
                else ""
            )
            return Recommendation(
                nodes=nodes,
                mode=MULTI_NODE,
                image=image,
                memory=memory,
                why=f"does not fit one {instance_type}: {need} > {one.usable / gib:.2f} GiB usable; "
                f"{nodes} nodes hold {memory.total / gib:.2f} GiB per NeuronCore with the weights sharded over "
                f"all {memory.tp_degree} NeuronCores (NxD Inference tp_degree={tp}){not_split}",
            )
    return Recommendation(
        nodes=None,
        mode=None,
        image=None,
        memory=memory,
        why=f"no unit of 1..{max_nodes} {instance_type} fits: {need} on one node, "
        f"{memory.total / gib:.2f} GiB per NeuronCore on {max_nodes}; lower --batch-size or --seq-len",
    )
