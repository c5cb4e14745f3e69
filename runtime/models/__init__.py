"""Models the reference engine can serve: built-ins `tiny` and `smollm2`, or any Llama-family
checkpoint directory. `resolve_model(name)` gives shape, per-tensor weights and tokenizer."""

from runtime.models.registry import BUILTIN_MODELS, TINY_SHAPE, LlamaShape, ModelSource, hf_tensor_shapes, resolve_model

__all__ = ["BUILTIN_MODELS", "LlamaShape", "ModelSource", "TINY_SHAPE", "hf_tensor_shapes", "resolve_model"]
