"""The deployment config's `speculation` section: speculative decoding for every unit (docs/engine.md,
docs/hardware.md). The section is contract.speculation.Speculation, the node's own declaration of the
setting (method none, ngram on the reference engine, eagle or eagle3 on one-node neuron units; draft: the
EAGLE draft's directory inside model.s3_uri, so the model's manifest lists and verifies it), and its rules
are the node's; a refusal names the key."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from pydantic import AfterValidator, ValidationInfo

from contract.bad_input import BadInput
from contract.speculation import Speculation

if TYPE_CHECKING:
    from stacks.config import FlotillaConfig


def _check(section: Speculation, info: ValidationInfo) -> Speculation:
    """Refuse, at synth, what the units' engine could not run (Speculation.check), against the sections
    declared before this one (node, nodes_per_unit)."""
    from stacks.config import ConfigError, NodeConfig  # noqa: PLC0415 - stacks.config imports this module

    node: Any = info.data.get("node", NodeConfig())
    try:
        section.check(
            engine=node.engine,
            nodes=info.data.get("nodes_per_unit", 1),
            neuron_sampling=node.neuron_sampling,
            prefix_caching_block=node.neuron_prefix_caching_block,
        )
    except BadInput as e:
        raise ConfigError(e.name, e.value, e.fix, problem=e.problem) from None
    return section


# FlotillaConfig.speculation's type: the section, checked against the node section and the unit's size.
SpeculationSection = Annotated[Speculation, AfterValidator(_check)]


def speculation_environment(cfg: FlotillaConfig) -> dict[str, str]:
    """The node's speculation settings (contract.speculation's variables); none while it is off."""
    return cfg.speculation.environment()
