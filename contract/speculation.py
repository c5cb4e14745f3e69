"""Speculative decoding as a deployment may ask for it: which method each engine runs, the limits, and
the one check the deployment config (at synth) and the node (at start) both apply.

reference engine: `ngram` (prompt lookup, runtime/engines/speculative.py). neuron engine, one node:
`eagle` / `eagle3` through the vllm-neuron plugin, with an EAGLE draft checkpoint published inside the
model's own artifact directory (so the model's one manifest lists and verifies it). Every neuron rule
below names where the pinned stack says it.

`Speculation` is the one declaration of the setting: the deployment config's `speculation` section
(stacks/speculation.py), the node's FLOTILLA_SPECULATIVE_* variables (runtime/node/speculation.py) and the
neuron engine's options (runtime/engines/neuron/launch.py) are all this model. Standard library and pydantic.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated

from pydantic import BaseModel, ConfigDict

from contract import Engine
from contract.bad_input import Allowed, BadInput
from contract.declare import OUT_OF_RANGE, Integer
from contract.neuron import NXDI_2_28, SDK_DOCS_2_28_0

# What a neuron unit's vLLM reads (PLUGIN_MAIN: the newest stored revision of vllm-project/vllm-neuron;
# its release-0.4.1 branch, the pinned one, was not stored where this was written, as for prefix caching
# in runtime/engines/neuron/launch.py: check these lines against release-0.4.1 before a trn1 run).
PLUGIN_MAIN = "vllm-project/vllm-neuron@a5ef7c88c3e4e44bea9af9051d8fb113588c0a21"
_V1_GUIDE = f"{SDK_DOCS_2_28_0}:libraries/nxd-inference/developer_guides/vllm-user-guide-v1.rst"
_FEATURES = f"{SDK_DOCS_2_28_0}:libraries/nxd-inference/developer_guides/feature-guide.rst"
_LOADER = f"{PLUGIN_MAIN}:vllm_neuron/worker/neuronx_distributed_model_loader.py"
_MODEL_BASE = f"{NXDI_2_28}:src/neuronx_distributed_inference/models/model_base.py"

NONE = "none"
NGRAM = "ngram"
EAGLE, EAGLE3 = "eagle", "eagle3"
METHODS = (NONE, NGRAM, EAGLE, EAGLE3)
METHODS_BY_ENGINE: dict[str, tuple[str, ...]] = {
    Engine.REFERENCE: (NONE, NGRAM),
    Engine.NEURON: (NONE, EAGLE, EAGLE3),
    Engine.ECHO: (NONE,),
}
MAX_SPECULATIVE_TOKENS = 16  # flotilla's bound: verifying more rows a step stops paying long before
TOKENS_RULE = Integer(1, MAX_SPECULATIVE_TOKENS)  # checked in check_speculation, worded as every range
DEFAULT_SPECULATIVE_TOKENS = 4

# The node's settings (the stacks set them from the deployment config's `speculation` section).
ENV_SPECULATIVE_METHOD = "FLOTILLA_SPECULATIVE_METHOD"
ENV_SPECULATIVE_TOKENS = "FLOTILLA_SPECULATIVE_TOKENS"
ENV_SPECULATIVE_DRAFT = "FLOTILLA_SPECULATIVE_DRAFT"

SOURCES = {
    "neuron methods": f"{_V1_GUIDE}:141-143 (Speculative Decoding: Eagle V1 and V3 are supported), :602 (a draft "
    f"model, not EAGLE, only in the unsupported V0 fork); {_LOADER}:785-791 (num_speculative_tokens becomes "
    "speculation_length, method eagle sets enable_eagle_speculation)",
    "draft holds the LM head": f"{_FEATURES}:643-646 (the EAGLE draft must include the target's LM head weights)",
    "device sampling": f"{_MODEL_BASE}:1676-1677 (the fused draft's sampler is built from a copy of "
    f"on_device_sampling_config); {_LOADER}:350-363 (the plugin reads fused speculation's accepted tokens "
    "only under on_device_sampling_config; host sampling takes logits[:, -1])",
    "eagle3 without prefix caching": f"{_MODEL_BASE}:1700 (EAGLE3 and prefix caching not integrated)",
    # A risk, not a rule: the SDK guide lists EAGLE3, but the plugin revision read here turns NxD Inference's
    # EAGLE path on for method "eagle" alone, so an "eagle3" draft would compile as a plain fused draft
    # model. The runbook's EAGLE step (docs/runbooks/trainium-smoke-test.md) checks release-0.4.1 first.
    "eagle3 (unverified)": f"{_LOADER}:789-791 (enable_eagle_speculation only when method == 'eagle'; nothing "
    f"in the file sets is_eagle3); {_V1_GUIDE}:141-143 (Eagle V1 and V3 supported)",
    "one node": "flotilla's multi-node loop (runtime/engines/neuron/spmd.py) drives NxD Inference's "
    "token-generation model one token per step; NxD Inference's multi-node example runs no speculation "
    f"({NXDI_2_28}:examples/multi_node.md) and its fused speculation returns accepted tokens and positions the "
    "loop does not read",
}


def draft_path_problem(draft: str) -> str | None:
    """Why `draft` cannot name a directory inside the model's artifact directory, or None."""
    parts = draft.strip("/").split("/")
    if not draft.strip("/") or any(p in ("", ".", "..") for p in parts) or draft.startswith("/"):
        return "is not a relative directory inside the model's artifact directory"
    return None


def check_speculation(
    *,
    method: str,
    tokens: int,
    draft: str,
    engine: str,
    nodes: int,
    neuron_sampling: str,
    prefix_caching_block: int,
    key: str = "speculation",
) -> None:
    """Refuse a speculation layout the engine cannot run, naming the key (`key`.method, ...) and the fix."""
    allowed = METHODS_BY_ENGINE.get(engine, (NONE,))
    if method not in allowed:
        raise BadInput(
            f"{key}.method", method, f"is not a method engine {engine} runs", f"use one of {', '.join(allowed)}"
        )
    if not 1 <= tokens <= MAX_SPECULATIVE_TOKENS:
        raise BadInput(f"{key}.num_speculative_tokens", tokens, OUT_OF_RANGE, TOKENS_RULE.fix)
    if method in (EAGLE, EAGLE3):
        if nodes > 1:
            raise BadInput(
                f"{key}.method",
                method,
                f"cannot run on a unit of {nodes} nodes",
                "use nodes_per_unit 1 or method none (flotilla's multi-node loop decodes one token per step; "
                "NxD Inference's multi-node example runs no speculation)",
            )
        problem = draft_path_problem(draft)
        if problem:
            raise BadInput(
                f"{key}.draft",
                draft,
                problem,
                "name the EAGLE draft checkpoint's directory inside model.s3_uri, e.g. eagle-draft (published with "
                "the model, in its manifest; the draft must hold the target's LM head weights)",
            )
        if neuron_sampling != "device":
            raise BadInput(
                f"{key}.method",
                method,
                f"needs node.neuron_sampling device, not {neuron_sampling}",
                "set node.neuron_sampling device (NxD Inference's fused speculation samples on the NeuronCores)",
            )
        if method == EAGLE3 and prefix_caching_block:
            raise BadInput(
                f"{key}.method",
                method,
                "cannot run with prefix caching",
                "use method eagle, or node.neuron_prefix_caching_block 0 (NxD Inference does not combine EAGLE3 "
                "with prefix caching)",
            )
    elif draft:
        raise BadInput(f"{key}.draft", draft, f"is not used by method {method}", "leave it empty")


class Speculation(BaseModel):
    """A unit's speculative decoding: method (METHODS), draft tokens per step (vLLM's
    num_speculative_tokens, 1..MAX_SPECULATIVE_TOKENS) and, for eagle / eagle3, the EAGLE draft
    checkpoint's directory inside the model's artifact directory (so the model's manifest lists and
    verifies it). check() holds it to what the unit's engine runs."""

    # A field's docstring is its description in docs/configuration.md (stacks/config_doc.py).
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, use_attribute_docstrings=True)

    method: Annotated[str, Allowed("one of " + ", ".join(METHODS) + ", as the units' engine runs it")] = NONE
    """Speculative decoding: `ngram` (prompt lookup) on the reference engine, EAGLE (`eagle`, `eagle3`) on
    one-node `neuron` units; `none` decodes one token a step ([engine.md](engine.md))."""
    num_speculative_tokens: Annotated[int, Allowed(TOKENS_RULE.allowed)] = DEFAULT_SPECULATIVE_TOKENS
    """Tokens proposed per step."""
    draft: Annotated[str, Allowed("a directory inside model.s3_uri")] = ""
    """`eagle`, `eagle3`: the draft checkpoint's directory inside `model.s3_uri`, so the model's manifest
    lists and verifies it (publish the model directory with the draft in it)."""

    @property
    def on(self) -> bool:
        return self.method != NONE

    @property
    def eagle(self) -> bool:
        return self.method in (EAGLE, EAGLE3)

    def check(
        self, *, engine: str, nodes: int, neuron_sampling: str, prefix_caching_block: int, key: str = "speculation"
    ) -> Speculation:
        """self, or BadInput naming `key`.<field> and the fix (check_speculation)."""
        check_speculation(
            method=self.method,
            tokens=self.num_speculative_tokens,
            draft=self.draft,
            engine=engine,
            nodes=nodes,
            neuron_sampling=neuron_sampling,
            prefix_caching_block=prefix_caching_block,
            key=key,
        )
        return self

    def environment(self) -> dict[str, str]:
        """The node's variables for it (none while it is off)."""
        if not self.on:
            return {}
        env = {ENV_SPECULATIVE_METHOD: self.method, ENV_SPECULATIVE_TOKENS: str(self.num_speculative_tokens)}
        if self.draft:
            env[ENV_SPECULATIVE_DRAFT] = self.draft.strip("/")
        return env

    @classmethod
    def from_environment(cls, env: Mapping[str, str]) -> Speculation:
        """What the node's variables say (unchecked: check() it against the node's engine), or BadInput
        naming the variable."""
        raw = env.get(ENV_SPECULATIVE_TOKENS, str(DEFAULT_SPECULATIVE_TOKENS))
        try:
            tokens = int(raw)
        except ValueError:
            raise BadInput(
                ENV_SPECULATIVE_TOKENS, raw, "is not an integer", f"give 1..{MAX_SPECULATIVE_TOKENS}", text=True
            ) from None
        return cls(
            method=env.get(ENV_SPECULATIVE_METHOD, NONE) or NONE,
            num_speculative_tokens=tokens,
            draft=env.get(ENV_SPECULATIVE_DRAFT, ""),
        )

    @property
    def draft_dir(self) -> str:
        """The draft's directory relative to the model's, without surrounding slashes."""
        return self.draft.strip("/")
