"""Turn a unit's membership and a model's shape into every rank's Neuron environment and command.

Pure Python: nothing here imports vLLM, NxD Inference or torch, so the exact contract the trn1
container receives is computed, validated and tested on any machine, Neuron devices or not.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Mapping

import contract
from contract.trainium import INSTANCES, TrainiumInstance
from runtime.engines.neuron.model import ModelShape
from runtime.membership import Membership


class NeuronPlanError(ValueError):
    """The requested layout cannot run; the message names the input and the fix."""


AUTO = "auto"
VLLM_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
FOLLOWER_MODULE = "runtime.engines.neuron.worker"
DEFAULT_COMPILED_DIR = "/var/cache/flotilla/neuron-compiled"


@dataclass(frozen=True)
class NeuronOptions:
    seq_len: int = 4096  # prompt + generated tokens, vLLM --max-model-len
    batch_size: int = 8  # sequences decoded together, vLLM --max-num-seqs
    cp_degree: int | str = AUTO  # context parallel (prefill); "auto": smallest that fits
    attention_dp_degree: int | str = AUTO  # attention data parallel (decode); "auto" likewise
    served_model_name: str | None = None
    dtype: str = "bfloat16"
    compiled_artifacts_dir: str = DEFAULT_COMPILED_DIR
    engine_port: int = contract.NEURON_ENGINE_PORT  # leader's vLLM server, on 127.0.0.1 only
    # "device": NxD Inference's on-device sampling (the default; applies only temperature, top_k, top_p);
    # "cpu": vLLM's sampler on the host, which also applies logprobs, structured output, seed and
    # penalties (see runtime/engines/neuron/requests.py).
    sampling: str = "device"


@dataclass(frozen=True)
class RankPlan:
    rank: int
    role: str  # leader | follower
    start_rank_id: int  # first global NeuronCore rank on this node
    env: Mapping[str, str]
    command: tuple[str, ...]
    nxdi_config: Mapping[str, object]  # override_neuron_config this rank passes to NxD Inference


@dataclass(frozen=True)
class NeuronUnitPlan:
    instance: TrainiumInstance
    nodes: int
    leader_host: str
    dist_port: int  # leader's gloo port (torch env://) for the input broadcast
    tp_degree: int
    cp_degree: int
    attention_dp_degree: int
    seq_len: int
    batch_size: int
    model: ModelShape
    model_dir: str
    ranks: tuple[RankPlan, ...] = field(default_factory=tuple)

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
        return {
            "engine": "neuron",
            "instance_type": self.instance.instance_type,
            "nodes": self.nodes,
            "leader_host": self.leader_host,
            "model_dir": self.model_dir,
            "model": dataclasses.asdict(shape),
            "parallelism": {
                "local_tp": self.instance.neuron_cores,
                "tp_degree": self.tp_degree,
                "cp_degree": self.cp_degree,
                "attention_dp_degree": self.attention_dp_degree,
                "prefill": _head_layout(shape, self.prefill_attention_tp),
                "decode": _head_layout(shape, self.decode_attention_tp),
                "layers_per_rank": shape.num_hidden_layers,
                "intermediate_per_rank": shape.intermediate_size // self.tp_degree,
                "vocab_per_rank": -(-shape.vocab_size // self.tp_degree),
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
                    "nxdi_config": dict(r.nxdi_config),
                }
                for r in self.ranks
            ],
        }


def _head_layout(shape: ModelShape, attention_tp: int) -> dict:
    return {
        "attention_tp": attention_tp,
        "q_heads_per_rank": shape.num_attention_heads // attention_tp,
        # KV heads are replicated when there are fewer of them than ranks (NxDI's
        # replicate-to-tp-degree GQA sharding), so each rank still holds at least one.
        "kv_heads_per_rank": max(1, shape.num_key_value_heads // attention_tp),
    }


def _heads_fit(shape: ModelShape, attention_tp: int) -> bool:
    """Heads split evenly and KV heads replicate evenly: no padded heads, no MHA fallback."""
    kv = shape.num_key_value_heads
    return shape.num_attention_heads % attention_tp == 0 and (attention_tp % kv == 0 or kv % attention_tp == 0)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _fitting_degrees(
    shape: ModelShape, tp: int, *, batch_size: int | None = None, seq_len: int | None = None
) -> list[int]:
    out = []
    for d in _divisors(tp):
        if not _heads_fit(shape, tp // d):
            continue
        if batch_size is not None and batch_size % d:
            continue
        if seq_len is not None and seq_len % d:
            continue
        out.append(d)
    return out


def _check_degree(name: str, value: int | str) -> int | str:
    if value == AUTO:
        return value
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise NeuronPlanError(f"{name}={value!r} must be a positive integer or 'auto'")
    return value


def plan_unit(
    *,
    leader_host: str,
    nodes: int,
    instance_type: str,
    model: ModelShape,
    model_dir: str,
    options: NeuronOptions = NeuronOptions(),
    dist_port: int = contract.DIST_PORT,
) -> NeuronUnitPlan:
    """Validate the layout and build every rank's plan. Raises NeuronPlanError naming the fix."""
    instance = INSTANCES.get(instance_type)
    if instance is None:
        raise NeuronPlanError(
            f"instance_type={instance_type!r} cannot host a multi-node Neuron unit; use one of "
            f"{', '.join(sorted(INSTANCES))} (32 NeuronCores per node)"
        )
    if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 1:
        raise NeuronPlanError(f"nodes={nodes!r} must be a positive integer (trn1 nodes per unit)")
    if not leader_host:
        raise NeuronPlanError("leader_host is empty; rendezvous must name the leader's address")
    o = options
    if not isinstance(o.seq_len, int) or o.seq_len < 1:
        raise NeuronPlanError(f"seq_len={o.seq_len!r} must be a positive integer")
    if o.seq_len > model.max_position_embeddings:
        raise NeuronPlanError(
            f"seq_len={o.seq_len} exceeds the model's max_position_embeddings="
            f"{model.max_position_embeddings}; lower --seq-len to at most "
            f"{model.max_position_embeddings}"
        )
    if not isinstance(o.batch_size, int) or o.batch_size < 1:
        raise NeuronPlanError(f"batch_size={o.batch_size!r} must be a positive integer")
    cp = _check_degree("cp_degree", o.cp_degree)
    dp = _check_degree("attention_dp_degree", o.attention_dp_degree)

    local_tp = instance.neuron_cores
    tp = local_tp * nodes
    where = f"{nodes} x {instance_type} (tp_degree={tp})"

    if cp == AUTO:
        fits = _fitting_degrees(model, tp, seq_len=o.seq_len)
        if not fits:
            raise NeuronPlanError(
                f"no cp_degree lets prefill attention split num_attention_heads="
                f"{model.num_attention_heads} (num_key_value_heads={model.num_key_value_heads}) "
                f"evenly on {where} with seq_len={o.seq_len}; use fewer nodes"
            )
        cp = fits[0]
    if dp == AUTO:
        fits = [d for d in _fitting_degrees(model, tp, batch_size=o.batch_size) if cp == 1 or d == 1 or cp % d == 0]
        if not fits:
            needed = [d for d in _fitting_degrees(model, tp) if cp == 1 or d == 1 or cp % d == 0]
            fix = f"raise --batch-size to a multiple of {needed[0]}" if needed else "use fewer nodes"
            raise NeuronPlanError(
                f"no attention_dp_degree lets decode attention split num_attention_heads="
                f"{model.num_attention_heads} evenly on {where} with batch_size={o.batch_size}; "
                f"{fix}"
            )
        dp = fits[0]

    _validate_degrees(model, tp=tp, cp=cp, dp=dp, seq_len=o.seq_len, batch_size=o.batch_size, where=where)

    plan = NeuronUnitPlan(
        instance=instance,
        nodes=nodes,
        leader_host=leader_host,
        dist_port=dist_port,
        tp_degree=tp,
        cp_degree=cp,
        attention_dp_degree=dp,
        seq_len=o.seq_len,
        batch_size=o.batch_size,
        model=model,
        model_dir=model_dir,
    )
    ranks = tuple(_rank_plan(plan, rank, o) for rank in range(nodes))
    return dataclasses.replace(plan, ranks=ranks)


def _validate_degrees(
    model: ModelShape, *, tp: int, cp: int, dp: int, seq_len: int, batch_size: int, where: str
) -> None:
    # The first four mirror NxD Inference's own NeuronConfig checks, caught here with a fix.
    if tp % cp:
        raise NeuronPlanError(f"cp_degree={cp} must divide tp_degree={tp} on {where}; use one of {_divisors(tp)}")
    if tp % dp:
        raise NeuronPlanError(
            f"attention_dp_degree={dp} must divide tp_degree={tp} on {where}; use one of {_divisors(tp)}"
        )
    if batch_size % dp:
        raise NeuronPlanError(
            f"batch_size={batch_size} must be a multiple of attention_dp_degree="
            f"{dp} (each data-parallel group decodes batch_size/{dp} "
            f"sequences); raise --batch-size to {dp * -(-batch_size // dp)} "
            "or lower --attention-dp-degree"
        )
    if cp > 1 and dp > 1 and cp % dp:
        raise NeuronPlanError(
            f"attention_dp_degree={dp} must divide cp_degree={cp} when both "
            "are above 1 (NxD Inference re-uses the context-parallel groups "
            "for decode); pick attention_dp_degree from "
            f"{[d for d in _divisors(cp) if d > 1]} or set cp_degree=1"
        )
    # Ours: each context-parallel rank takes an equal slice of the prompt.
    if seq_len % cp:
        raise NeuronPlanError(
            f"seq_len={seq_len} must be a multiple of cp_degree={cp} so every "
            f"context-parallel rank holds an equal slice; use "
            f"--seq-len {cp * (seq_len // cp) or cp}"
        )
    for phase, flag, degree in (("prefill", "cp_degree", cp), ("decode", "attention_dp_degree", dp)):
        attention_tp = tp // degree
        if not _heads_fit(model, attention_tp):
            good = _fitting_degrees(
                model,
                tp,
                batch_size=batch_size if phase == "decode" else None,
                seq_len=seq_len if phase == "prefill" else None,
            )
            hint = f"use --{flag.replace('_', '-')} one of {good}" if good else "use fewer nodes"
            raise NeuronPlanError(
                f"{flag}={degree} leaves {attention_tp} ranks to share {phase} attention, which "
                f"does not split num_attention_heads={model.num_attention_heads} / "
                f"num_key_value_heads={model.num_key_value_heads} evenly on {where} "
                f"(it would pad heads); {hint}"
            )
    if model.intermediate_size % tp:
        raise NeuronPlanError(
            f"intermediate_size={model.intermediate_size} does not split over tp_degree={tp} "
            f"on {where}; use a node count whose 32 x nodes divides {model.intermediate_size}"
        )


def _rank_plan(plan: NeuronUnitPlan, rank: int, o: NeuronOptions) -> RankPlan:
    local_tp = plan.instance.neuron_cores
    start_rank_id = rank * local_tp
    nxdi = {
        "tp_degree": plan.tp_degree,
        "world_size": plan.tp_degree,
        "local_ranks_size": local_tp,
        "start_rank_id": start_rank_id,
        "cp_degree": plan.cp_degree,
        "attention_dp_degree": plan.attention_dp_degree,
        "seq_len": plan.seq_len,
        "max_context_length": plan.seq_len,
        "batch_size": plan.batch_size,
        "ctx_batch_size": 1,
        "tkg_batch_size": plan.batch_size,
        "is_continuous_batching": plan.batch_size > 1,
        "torch_dtype": o.dtype,
    }
    if o.sampling == "cpu":
        # vllm-neuron samples on the host only when on_device_sampling_config is None (vllm-project/vllm-neuron
        # 0.5.0: vllm_neuron/worker/neuronx_distributed_model_runner.py:557-592); the override is a plain
        # dict.update (neuronx_distributed_model_loader.py:1217-1221).
        nxdi["on_device_sampling_config"] = None
    env = {
        "VLLM_NEURON_FRAMEWORK": "neuronx-distributed-inference",
        "NEURON_COMPILED_ARTIFACTS": o.compiled_artifacts_dir,
    }
    if plan.nodes > 1:
        env.update(
            {
                "ENABLE_NEURON_MULTI_NODE": "true",
                "NEURON_RANK_ID": str(rank),
                "NEURON_LOCAL_TP": str(local_tp),
                "NEURON_RT_ROOT_COMM_ID": f"{plan.leader_host}:{contract.NEURON_RT_ROOT_COMM_PORT}",
                # torch.distributed env:// (gloo): one process per node; the leader broadcasts
                # each step's inputs to the followers over it.
                "WORLD_SIZE": str(plan.nodes),
                "MASTER_ADDR": plan.leader_host,
                "MASTER_PORT": str(plan.dist_port),
                "FI_PROVIDER": "efa",
                "FI_EFA_USE_DEVICE_RDMA": "1",
                "FI_EFA_FORK_SAFE": "1",
            }
        )
    engine_args = [
        "--model",
        plan.model_dir,
        "--tensor-parallel-size",
        str(plan.tp_degree),
        "--max-num-seqs",
        str(plan.batch_size),
        "--max-model-len",
        str(plan.seq_len),
        "--dtype",
        o.dtype,
        "--additional-config",
        json.dumps({"override_neuron_config": nxdi}, sort_keys=True, separators=(",", ":")),
    ]
    if rank == 0:
        command = (
            "python3",
            "-m",
            VLLM_SERVER_MODULE,
            *engine_args,
            "--served-model-name",
            o.served_model_name or plan.model_dir,
            # Only our leader API (same host) talks to vLLM; it never faces the network.
            "--host",
            "127.0.0.1",
            "--port",
            str(o.engine_port),
        )
    else:
        command = ("python3", "-m", FOLLOWER_MODULE, *engine_args)
    return RankPlan(
        rank=rank,
        role="leader" if rank == 0 else "follower",
        start_rank_id=start_rank_id,
        env=env,
        command=command,
        nxdi_config=nxdi,
    )


def plan_member(
    membership: Membership,
    *,
    instance_type: str,
    model: ModelShape,
    model_dir: str,
    options: NeuronOptions = NeuronOptions(),
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
    )
    return unit.ranks[membership.rank]
