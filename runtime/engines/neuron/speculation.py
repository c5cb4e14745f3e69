"""EAGLE speculative decoding on a one-node neuron unit: the flag vLLM 0.13.0 takes and what NxD
Inference compiles for it (contract/speculation.py holds the rules and where the pinned stack says them)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import PurePosixPath

from contract.neuron import VLLM_0_13_0
from contract.speculation import EAGLE, EAGLE3, NONE, PLUGIN_MAIN

_LOADER = f"{PLUGIN_MAIN}:vllm_neuron/worker/neuronx_distributed_model_loader.py"
SOURCES: Mapping[str, str] = {
    "--speculative-config": f"{VLLM_0_13_0}:vllm/engine/arg_utils.py (--speculative-config, a JSON "
    "SpeculativeConfig: method, model, num_speculative_tokens); "
    f"{PLUGIN_MAIN}:test/tiny/test_eagle_speculative_decoding.py:50-54 (the plugin's own EAGLE run passes "
    "model, num_speculative_tokens 5, method eagle)",
    "speculative_config.model": f"{_LOADER}:292-301 (the draft's config is read from the draft model's "
    "directory, and its weights fused into the target's compiled model)",
    "enable_fused_speculation, speculation_length": f"{_LOADER}:785-791",
    "enable_eagle_speculation": f"{_LOADER}:790-791 (method eagle); EAGLE3 per the SDK 2.28 vLLM V1 guide "
    "(contract.speculation.SOURCES)",
}


def speculative_flags(method: str, tokens: int, draft_dir: str) -> list[str]:
    """vLLM's --speculative-config for an EAGLE draft at `draft_dir` (none: no flag)."""
    if method == NONE:
        return []
    if method not in (EAGLE, EAGLE3):
        raise ValueError(f"speculation method {method!r} is not one the neuron engine runs (eagle, eagle3)")
    config = {"method": method, "model": draft_dir, "num_speculative_tokens": tokens}
    return ["--speculative-config", json.dumps(config, sort_keys=True)]


def nxdi_speculation(method: str, tokens: int) -> dict[str, object]:
    """What NxD Inference compiles differently with speculation on (part of the compile-cache key)."""
    if method == NONE:
        return {}
    return {
        "enable_fused_speculation": True,
        "speculation_length": tokens,
        "enable_eagle_speculation": True,
        **({"is_eagle3": True} if method == EAGLE3 else {}),
    }


def draft_dir(model_dir: str, draft: str) -> str:
    """The EAGLE draft's local directory: inside the model's, where the model's manifest put it."""
    return str(PurePosixPath(model_dir) / draft)
