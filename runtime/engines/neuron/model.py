"""The shape of a Llama-family checkpoint, read from its config.json.

The neuron planner needs only the numbers that decide how the model shards (layers, heads, KV
heads, hidden, intermediate, vocab, max positions); it never reads weights.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


class ModelConfigError(ValueError):
    """config.json is missing, unreadable or lacks a field the planner needs."""


@dataclass(frozen=True)
class ModelShape:
    architecture: str
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    head_dim: int = 0  # hidden_size / num_attention_heads unless config.json names it
    tie_word_embeddings: bool = False

    def __post_init__(self) -> None:
        if not self.head_dim:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)


_REQUIRED = (
    "num_hidden_layers",
    "num_attention_heads",
    "hidden_size",
    "intermediate_size",
    "vocab_size",
    "max_position_embeddings",
)


def load_model_shape(checkpoint_dir: str | Path) -> ModelShape:
    """Read `<checkpoint_dir>/config.json`; every error names the file, the field and the fix."""
    path = Path(checkpoint_dir) / "config.json"
    if not Path(checkpoint_dir).is_dir():
        raise ModelConfigError(
            f"--model {checkpoint_dir}: not a directory; pass a checkpoint directory that holds config.json"
        )
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise ModelConfigError(
            f"{path}: not found; a checkpoint directory must hold the Hugging Face config.json of the model"
        ) from None
    except json.JSONDecodeError as exc:
        raise ModelConfigError(f"{path}: not valid JSON ({exc}); restore the file from the checkpoint") from None
    return parse_model_shape(raw, source=str(path))


def parse_model_shape(raw: object, *, source: str) -> ModelShape:
    """Validate a parsed config.json; `source` names it in every error."""
    path = source
    if not isinstance(raw, dict):
        raise ModelConfigError(f"{path}: expected a JSON object at top level")
    missing = [k for k in _REQUIRED if k not in raw]
    if missing:
        raise ModelConfigError(
            f"{path}: missing {', '.join(missing)}; the neuron engine serves "
            "Llama-family decoder checkpoints, whose config.json has them"
        )
    values: dict[str, int] = {}
    for key in _REQUIRED + ("num_key_value_heads",):
        value = raw.get(key, raw["num_attention_heads"] if key == "num_key_value_heads" else None)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ModelConfigError(f"{path}: {key}={value!r} must be a positive integer")
        values[key] = value
    archs = raw.get("architectures") or ["LlamaForCausalLM"]
    head_dim = raw.get("head_dim")
    if head_dim is not None and (not isinstance(head_dim, int) or isinstance(head_dim, bool) or head_dim <= 0):
        raise ModelConfigError(f"{path}: head_dim={head_dim!r} must be a positive integer")
    shape = ModelShape(
        architecture=str(archs[0]),
        **values,
        head_dim=head_dim or 0,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
    )
    if shape.hidden_size % shape.num_attention_heads:
        raise ModelConfigError(
            f"{path}: hidden_size={shape.hidden_size} is not a multiple of "
            f"num_attention_heads={shape.num_attention_heads}"
        )
    if shape.num_attention_heads % shape.num_key_value_heads:
        raise ModelConfigError(
            f"{path}: num_attention_heads={shape.num_attention_heads} is not a "
            f"multiple of num_key_value_heads={shape.num_key_value_heads}"
        )
    return shape
