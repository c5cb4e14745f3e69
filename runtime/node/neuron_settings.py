"""The neuron engine's settings (FLOTILLA_ENGINE=neuron only): where the model and compile cache live,
and the unit's Neuron layout. A group of the node's settings (runtime/node/settings.py)."""

from __future__ import annotations

from pydantic import ValidationInfo, field_validator

import contract
from contract.declare import Integer, OneOf
from contract.trainium import INSTANCES
from runtime.engines.neuron.launch import AUTO, DEFAULT_COMPILED_DIR, NeuronOptions
from runtime.node.declared import DeclaredSettings, s3_uri, setting

VLLM_BLOCK_SIZES = contract.NEURON_PREFIX_CACHING_BLOCKS[1:]  # what vLLM 0.13.0's --block-size accepts


class NeuronSettings(DeclaredSettings):
    """engine=neuron: where the model and compile cache live, and the unit's Neuron layout."""

    model_uri: str = setting(
        None,
        "--model-uri",
        contract.ENV_MODEL_URI,
        "s3://bucket/prefix the checkpoint was published to (`python -m runtime artifacts publish`); "
        "replaces `FLOTILLA_MODEL`",
        shown="required",
    )
    compile_cache_uri: str | None = setting(
        None,
        "--compile-cache-uri",
        contract.ENV_COMPILE_CACHE_URI,
        "s3://bucket/prefix of the compiled-artifact cache",
        shown="none: compile on every start",
    )
    instance_type: str = setting(
        "trn1.32xlarge",
        "--instance-type",
        contract.ENV_INSTANCE_TYPE,
        "the node's instance type (its NeuronCores are the plan's tensor-parallel degree per node)",
        rule=OneOf(*sorted(INSTANCES)),
    )
    model_dir: str = setting(
        "/var/cache/flotilla/model",
        "--neuron-model-dir",
        "FLOTILLA_NEURON_MODEL_DIR",
        "absolute path the checkpoint is fetched to",
    )
    compiled_dir: str = setting(
        DEFAULT_COMPILED_DIR,
        "--neuron-compiled-dir",
        "FLOTILLA_NEURON_COMPILED_DIR",
        "absolute path of NxD Inference's compiled artifacts (`NEURON_COMPILED_ARTIFACTS`)",
    )
    seq_len: int = setting(
        NeuronOptions.seq_len,
        "--seq-len",
        contract.ENV_NEURON_SEQ_LEN,
        "prompt + output tokens (vLLM `--max-model-len`); also the API's context length",
        rule=Integer(1),
    )
    batch_size: int = setting(
        NeuronOptions.batch_size,
        "--batch-size",
        contract.ENV_NEURON_BATCH_SIZE,
        "sequences decoded together (vLLM `--max-num-seqs`)",
        rule=Integer(1),
    )
    cp_degree: int | str = setting(
        AUTO, "--cp-degree", contract.ENV_NEURON_CP_DEGREE, "context-parallel degree for prefill, or auto"
    )
    attention_dp_degree: int | str = setting(
        AUTO,
        "--attention-dp-degree",
        contract.ENV_NEURON_ATTENTION_DP_DEGREE,
        "attention data-parallel degree for decode, or auto",
    )
    engine_port: int = setting(
        contract.NEURON_ENGINE_PORT,
        "--neuron-engine-port",
        "FLOTILLA_NEURON_ENGINE_PORT",
        "the leader's vLLM server, bound to 127.0.0.1",
        rule=Integer(1, 65535),
    )
    sampling: str = setting(
        "cpu",
        "--neuron-sampling",
        contract.ENV_NEURON_SAMPLING,
        "where tokens are sampled: `cpu` (vLLM's sampler, each request with its own parameters: also logprobs, "
        "response_format, forced tool calls, penalties) or `device` (NxD Inference on-device sampling: "
        "temperature, top_p only; the pinned plugin can apply another request's parameters)",
        rule=OneOf(*contract.NEURON_SAMPLING_MODES),
    )
    prefix_caching_block: int = setting(
        0,
        "--neuron-prefix-caching-block",
        contract.ENV_NEURON_PREFIX_CACHING_BLOCK,
        "one node only, opt-in: 0 runs vLLM without prefix caching; a block size in tokens (1, 8, 16, 32, 64, "
        "128 or 256, e.g. 32) runs "
        "it with prefix caching over NxD Inference's block KV layout and reports cached prompt tokens "
        "(`--enable-prefix-caching --block-size B --num-gpu-blocks-override ceil(seq len / B) x batch size "
        "--enable-prompt-tokens-details`); needs a batch size of at least 2 (the plugin's known issue at 1); "
        "off by default: no trn1 run has checked its outputs and memory (docs/hardware.md)",
        rule=Integer(0),
    )
    launcher: str | None = setting(
        None,
        "--neuron-launcher",
        "FLOTILLA_NEURON_LAUNCHER",
        "**tests only**: a program that replaces the interpreter (`python`/`python3`) of the rank's command "
        "(the tests point it at a Python whose path holds a stand-in vLLM); never set it in a deployment",
    )

    @field_validator("model_uri", mode="before")
    @classmethod
    def _model_uri(cls, v: str | None) -> str:
        if not v or not v.strip():
            raise ValueError(
                "is required with engine=neuron: give the s3://bucket/prefix the checkpoint was "
                "published to (python -m runtime artifacts publish)"
            )
        return s3_uri(v)

    @field_validator("compile_cache_uri", mode="before")
    @classmethod
    def _compile_cache_uri(cls, v: str | None) -> str | None:
        return s3_uri(v) if v and v.strip() else None

    @field_validator("model_dir", "compiled_dir", mode="after")
    @classmethod
    def _absolute(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError("is not an absolute path: give a directory such as /var/cache/flotilla/...")
        return v

    @field_validator("cp_degree", "attention_dp_degree", mode="before")
    @classmethod
    def _degree(cls, v: int | str) -> int | str:
        if str(v).strip() == AUTO:
            return AUTO
        try:
            degree = int(v)
        except ValueError:
            degree = 0
        if degree < 1:
            raise ValueError("is not a degree: give an integer of at least 1, or auto")
        return degree

    @field_validator("prefix_caching_block", mode="after")
    @classmethod
    def _prefix_caching_needs_a_batch(cls, v: int, info: ValidationInfo) -> int:
        if v and info.data.get("batch_size") == 1:
            raise ValueError(
                "needs a batch size of at least 2: the pinned vllm-neuron's prefix caching generates incorrect "
                "outputs at batch size 1; raise FLOTILLA_NEURON_BATCH_SIZE or set this to 0"
            )
        if v and v not in VLLM_BLOCK_SIZES:
            # vLLM 0.13.0's --block-size takes only these (vllm/config/cache.py:22, BlockSize).
            raise ValueError(
                f"is not a vLLM block size: use one of {', '.join(map(str, VLLM_BLOCK_SIZES))}, or 0 (off)"
            )
        if v and v > info.data.get("seq_len", v):
            raise ValueError("is longer than the sequence (FLOTILLA_NEURON_SEQ_LEN): give a block of at most that")
        return v

    @field_validator("launcher", mode="after")
    @classmethod
    def _launcher(cls, v: str | None) -> str | None:
        return v or None
