"""What the engine process is told when the supervisor starts it: one typed object, built from the
member's settings and parsed back in the engine's process, so no setting is dropped or misspelt on
the way (a missing or unknown key fails the engine's start, loudly).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import fields
from typing import TYPE_CHECKING, Any

from pydantic import ConfigDict, create_model, model_validator

from contract.speculation import NGRAM, Speculation
from runtime.membership import Member, Membership
from runtime.node.settings import NeuronSettings, NodeSettings
from runtime.node.speculation import speculation_from_env

# The environment variable that carries the config to the engine process (its JSON).
CONFIG_ENV = "FLOTILLA_ENGINE_HOST_CONFIG"


# The member settings the engine uses, each sent as the NodeSettings field of that name. Their types
# are NodeSettings' own (below): a setting is declared once, in runtime/node/settings.py.
ENGINE_SETTINGS = (
    "engine",
    "model",
    "model_name",
    "prefill_strategy",
    "decode_strategy",
    "cache_dir",
    "form_timeout_s",
    "torch_threads",
    "kv_budget_tokens",
    "max_running",
    "max_prefill_tokens",
    "collective_timeout_s",
    "echo_load_s",
    "echo_step_s",
    "neuron",
)

# Only the annotation is taken, not the rules: the node checked every value already, and the engine
# process trusts its own node. No field has a default: every one is sent.
if TYPE_CHECKING:
    _Sent = NodeSettings  # mypy reads the sent fields' types where they are declared
else:
    _Sent = create_model(
        "_Sent",
        __config__=ConfigDict(frozen=True, extra="forbid"),
        **{name: (NodeSettings.model_fields[name].annotation, ...) for name in ENGINE_SETTINGS},
    )


class EngineConfig(_Sent):
    """The member settings the engine uses (ENGINE_SETTINGS, with NodeSettings' types) and the
    formation's membership."""

    speculation: Speculation
    membership: Membership

    @model_validator(mode="before")
    @classmethod
    def _nested_keys_exact(cls, data: Any) -> Any:
        """The nested parts are held to the top level's rule: every key sent, none unknown. Their own
        models would fill a missing key from its default (Membership.members, Member.instance_id,
        each neuron setting) and the dataclasses ignore an unknown one."""
        if isinstance(data, dict):
            membership = data.get("membership")
            _exact_keys("membership", membership, (f.name for f in fields(Membership)))
            if isinstance(membership, dict) and isinstance(membership.get("members"), list):
                for i, member in enumerate(membership["members"]):
                    _exact_keys(f"membership.members.{i}", member, (f.name for f in fields(Member)))
            _exact_keys("neuron", data.get("neuron"), NeuronSettings.model_fields)
            _exact_keys("speculation", data.get("speculation"), Speculation.model_fields)
        return data

    @classmethod
    def from_settings(cls, s: NodeSettings, membership: Membership) -> EngineConfig:
        fields = {name: getattr(s, name) for name in ENGINE_SETTINGS}
        return cls(**fields, speculation=speculation_from_env(os.environ, s), membership=membership)

    def to_json(self) -> str:
        return self.model_dump_json()

    @classmethod
    def from_json(cls, text: str | bytes) -> EngineConfig:
        """Parse the supervisor's JSON; raises pydantic's ValidationError naming each missing,
        unknown or ill-typed key (a node and its engine process of different code is a bug)."""
        return cls.model_validate_json(text)

    def reference_speculation(self) -> Any:
        """The reference engine's speculation settings, or None (imported here: it imports torch)."""
        from runtime.engines.speculative import SpeculationSettings  # noqa: PLC0415

        sp = self.speculation
        return SpeculationSettings(num_tokens=sp.num_speculative_tokens) if sp.method == NGRAM else None

    def neuron_settings(self) -> Any:
        """engine=neuron: the engine's own settings object (imported here: other engines load less)."""
        from runtime.engines.neuron.engine import NeuronEngineSettings  # noqa: PLC0415
        from runtime.engines.neuron.launch import NeuronOptions  # noqa: PLC0415

        n = self.neuron
        if n is None:
            raise ValueError("engine=neuron needs the neuron settings (the node validates them; a bug)")
        options = NeuronOptions(
            seq_len=n.seq_len,
            batch_size=n.batch_size,
            cp_degree=n.cp_degree,
            attention_dp_degree=n.attention_dp_degree,
            served_model_name=self.model_name,
            compiled_artifacts_dir=n.compiled_dir,
            engine_port=n.engine_port,
            sampling=n.sampling,
            prefix_caching_block=n.prefix_caching_block,
            speculation=self.speculation,
        )
        return NeuronEngineSettings(
            model_uri=n.model_uri,
            model_dir=n.model_dir,
            instance_type=n.instance_type,
            options=options,
            compile_cache_uri=n.compile_cache_uri,
            launcher=n.launcher,
        )


def _exact_keys(where: str, given: Any, declared: Iterable[str]) -> None:
    """ValueError naming the keys of `given` (a parsed JSON object) missing from or unknown to
    `declared`; anything else (an object already built, null) is left to the model to judge."""
    if not isinstance(given, dict):
        return
    want = set(declared)
    missing, unknown = sorted(want - given.keys()), sorted(given.keys() - want)
    if missing or unknown:
        said = [f"missing {', '.join(missing)}" if missing else "", f"unknown {', '.join(unknown)}" if unknown else ""]
        raise ValueError(f"{where}: keys {'; '.join(s for s in said if s)}")
