"""Real Llama-family config.json shapes (numbers only) for the neuron tests; importable by name
(`from conftest import` is ambiguous when several suites run together)."""

from __future__ import annotations

LLAMA_3_8B = {
    "architectures": ["LlamaForCausalLM"],
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
}
LLAMA_31_70B = {
    "architectures": ["LlamaForCausalLM"],
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
}
LLAMA_31_405B = {
    "architectures": ["LlamaForCausalLM"],
    "num_hidden_layers": 126,
    "num_attention_heads": 128,
    "num_key_value_heads": 8,
    "hidden_size": 16384,
    "intermediate_size": 53248,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
}
SMOLLM2_135M = {
    "architectures": ["LlamaForCausalLM"],
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "vocab_size": 49152,
    "max_position_embeddings": 8192,
}


SHAPES = {
    "llama-3-8b": LLAMA_3_8B,
    "llama-3.1-70b": LLAMA_31_70B,
    "llama-3.1-405b": LLAMA_31_405B,
    "smollm2-135m": SMOLLM2_135M,
}
