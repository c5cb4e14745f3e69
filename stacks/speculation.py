"""The deployment config's `speculation` section: speculative decoding for every unit (docs/engine.md,
docs/hardware.md). The rules are contract.speculation's, shared with the node; a refusal names the key."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo

import contract.speculation as spec
from contract.bad_input import BadInput
from stacks.config_rules import Allowed

if TYPE_CHECKING:
    from stacks.config import FlotillaConfig


class SpeculationConfig(BaseModel):
    """method: none (default), ngram (reference engine), eagle or eagle3 (neuron engine, one node).
    draft: eagle only, the EAGLE draft checkpoint's directory inside model.s3_uri, so the model's
    manifest lists and verifies it (publish the model directory with the draft in it)."""

    # A field's docstring is its description in docs/configuration.md (stacks/config_doc.py).
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, use_attribute_docstrings=True)

    method: Annotated[str, Allowed("one of " + ", ".join(spec.METHODS) + ", as the units' engine runs it")] = spec.NONE
    """Speculative decoding: `ngram` (prompt lookup) on the reference engine, EAGLE (`eagle`, `eagle3`) on
    one-node `neuron` units; `none` decodes one token a step ([engine.md](engine.md))."""
    num_speculative_tokens: Annotated[
        int, Field(strict=True), Allowed(f"an integer from 1 to {spec.MAX_SPECULATIVE_TOKENS}")
    ] = spec.DEFAULT_SPECULATIVE_TOKENS
    """Tokens proposed per step."""
    draft: Annotated[str, Allowed("a directory inside model.s3_uri")] = ""
    """`eagle`, `eagle3`: the draft checkpoint's directory inside `model.s3_uri`, so the model's manifest
    lists and verifies it (publish the model directory with the draft in it)."""


def _check(section: SpeculationConfig, info: ValidationInfo) -> SpeculationConfig:
    """Refuse, at synth, what the units' engine could not run (contract.speculation.check_speculation),
    against the sections declared before this one (node, nodes_per_unit)."""
    from stacks.config import ConfigError, NodeConfig  # noqa: PLC0415 - stacks.config imports this module

    node: Any = info.data.get("node", NodeConfig())
    try:
        spec.check_speculation(
            method=section.method,
            tokens=section.num_speculative_tokens,
            draft=section.draft,
            engine=node.engine,
            nodes=info.data.get("nodes_per_unit", 1),
            neuron_sampling=node.neuron_sampling,
            prefix_caching_block=node.neuron_prefix_caching_block,
        )
    except BadInput as e:
        raise ConfigError(e.name, e.value, e.fix, problem=e.problem) from None
    return section


# FlotillaConfig.speculation's type: the section, checked against the node section and the unit's size.
SpeculationSection = Annotated[SpeculationConfig, AfterValidator(_check)]


def speculation_environment(cfg: FlotillaConfig) -> dict[str, str]:
    """The node's speculation settings (contract.speculation's variables); none while it is off."""
    s = cfg.speculation
    if s.method == spec.NONE:
        return {}
    env = {spec.ENV_SPECULATIVE_METHOD: s.method, spec.ENV_SPECULATIVE_TOKENS: str(s.num_speculative_tokens)}
    if s.draft:
        env[spec.ENV_SPECULATIVE_DRAFT] = s.draft.strip("/")
    return env
