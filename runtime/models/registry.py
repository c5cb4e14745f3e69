"""Model registry: a name (`tiny`, `smollm2`) or a Llama-family checkpoint directory becomes a
ModelSource: the model's shape, a per-tensor weight reader (so each rank reads only what it owns)
and its tokenizer."""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

import torch

from contract.llama import TINY, LlamaShape
from runtime.models.tokenizers import ByteTokenizer, HFTokenizer

BUILTIN_MODELS = ("tiny", "smollm2")


def reference_shape(config: dict, *, source: str = "config.json") -> LlamaShape:
    """A checkpoint's shape, refused when its config.json asks for what the reference engine's layers
    do not compute (runtime/engines/llama.py: no biases, default RoPE, SiLU)."""
    arch = config.get("model_type", "llama")
    if arch != "llama":
        raise ValueError(
            f"{source}: model_type {arch!r} is not supported; the reference "
            "engine runs Llama-family checkpoints (model_type 'llama')"
        )
    if config.get("attention_bias") or config.get("mlp_bias"):
        raise ValueError(f"{source}: attention_bias/mlp_bias are not supported")
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in (None, "default"):
        raise ValueError(f"{source}: rope type {rope_type!r} is not supported (only default RoPE)")
    if config.get("hidden_act", "silu") != "silu":
        raise ValueError(f"{source}: hidden_act {config['hidden_act']!r} is not supported (silu)")
    return LlamaShape.from_config(config, source=source)


class WeightSource(Protocol):
    """Reads one tensor, or a slice of it along one dimension, without touching the others."""

    def keys(self) -> set[str]: ...

    def get(self, name: str, *, dim: int | None = None, start: int = 0, stop: int | None = None) -> torch.Tensor: ...


class SafetensorsWeights:
    """A checkpoint directory's *.safetensors, read lazily with safe_open (slices via get_slice)."""

    def __init__(self, model_dir: Path) -> None:
        from safetensors import safe_open  # noqa: PLC0415 - weights libraries load only when a model is read

        files = sorted(model_dir.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"{model_dir} has no *.safetensors files")
        self._where: dict[str, safe_open] = {}  # tensor name -> the open file holding it
        for f in files:
            handle = safe_open(str(f), framework="pt")
            for key in handle.keys():
                self._where[key] = handle

    def keys(self) -> set[str]:
        return set(self._where)

    def get(self, name: str, *, dim: int | None = None, start: int = 0, stop: int | None = None) -> torch.Tensor:
        handle = self._where.get(name)
        if handle is None:
            raise KeyError(f"tensor {name!r} is not in the checkpoint")
        if dim is None:
            return handle.get_tensor(name).float()
        sl = handle.get_slice(name)
        index = [slice(None)] * len(sl.get_shape())
        index[dim] = slice(start, stop)
        return sl[tuple(index)].float().contiguous()


class SeededWeights:
    """`tiny`'s weights: each tensor drawn from its own torch.Generator seeded by (seed, name).

    Independent of transformers' initialisation and of which other tensors a rank asks for, so
    every process gets the same values for the same name.
    """

    def __init__(self, shape: LlamaShape, seed: int) -> None:
        self.shape = shape
        self.seed = seed
        self._shapes = hf_tensor_shapes(shape)

    def keys(self) -> set[str]:
        return set(self._shapes)

    def get(self, name: str, *, dim: int | None = None, start: int = 0, stop: int | None = None) -> torch.Tensor:
        if name not in self._shapes:
            raise KeyError(f"tensor {name!r} is not in the tiny model")
        size = self._shapes[name]
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + zlib.crc32(name.encode()))
        if name.endswith("norm.weight"):
            full = 1.0 + 0.1 * torch.randn(size, generator=gen)
        elif name.endswith("embed_tokens.weight"):
            full = torch.randn(size, generator=gen)
        else:
            # fan-in scaling keeps activations O(1) through the layers, so logits are not flat
            full = torch.randn(size, generator=gen) / (size[1] ** 0.5)
        if dim is not None:
            full = full.narrow(dim, start, (stop if stop is not None else size[dim]) - start)
        return full.contiguous()


def hf_tensor_shapes(shape: LlamaShape) -> dict[str, tuple[int, ...]]:
    """Tensor names and sizes in transformers' LlamaForCausalLM layout."""
    h, d, i = shape.hidden_size, shape.head_dim, shape.intermediate_size
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (shape.vocab_size, h), "model.norm.weight": (h,)}
    if not shape.tie_word_embeddings:
        out["lm_head.weight"] = (shape.vocab_size, h)
    for n in range(shape.num_hidden_layers):
        p = f"model.layers.{n}."
        out[p + "self_attn.q_proj.weight"] = (shape.num_attention_heads * d, h)
        out[p + "self_attn.k_proj.weight"] = (shape.num_key_value_heads * d, h)
        out[p + "self_attn.v_proj.weight"] = (shape.num_key_value_heads * d, h)
        out[p + "self_attn.o_proj.weight"] = (h, shape.num_attention_heads * d)
        out[p + "mlp.gate_proj.weight"] = (i, h)
        out[p + "mlp.up_proj.weight"] = (i, h)
        out[p + "mlp.down_proj.weight"] = (h, i)
        out[p + "input_layernorm.weight"] = (h,)
        out[p + "post_attention_layernorm.weight"] = (h,)
    return out


TINY_SEED = 20261202
TINY_SHAPE = TINY  # its numbers are a preset (contract/llama.py)


@dataclass
class ModelSource:
    name: str
    shape: LlamaShape
    weights: WeightSource
    make_tokenizer: Callable[[], object]


def resolve_model(model: str, *, progress: Callable[[str], None] | None = None) -> ModelSource:
    """`tiny`, `smollm2` (converted on first use, cached) or a checkpoint directory."""
    if model == "tiny":
        return ModelSource(
            name="tiny", shape=TINY_SHAPE, weights=SeededWeights(TINY_SHAPE, TINY_SEED), make_tokenizer=ByteTokenizer
        )
    if model == "smollm2":
        from runtime.models.smollm2 import ensure_smollm2  # noqa: PLC0415 - imported where used, so other subcommands and roles load less

        return _from_dir("smollm2", ensure_smollm2(progress=progress))
    path = Path(model)
    if path.is_dir():
        return _from_dir(path.name, path)
    raise ValueError(
        f"model {model!r} is neither a built-in model ({', '.join(BUILTIN_MODELS)}) "
        "nor an existing checkpoint directory (config.json, *.safetensors, tokenizer.json)"
    )


def _from_dir(name: str, model_dir: Path) -> ModelSource:
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(
            f"{model_dir} has no config.json; a checkpoint directory needs "
            "config.json, *.safetensors and tokenizer.json"
        )
    shape = reference_shape(json.loads(config_path.read_text()), source=str(config_path))
    return ModelSource(
        name=name, shape=shape, weights=SafetensorsWeights(model_dir), make_tokenizer=lambda: HFTokenizer(model_dir)
    )
