"""A publishable stand-in checkpoint for the neuron engine tests: a real Llama shape in config.json,
a small word-level tokenizer.json, and random bytes where the weights would be; and where the stand-in
packages live (tests/neuron/standins/: vLLM 0.13.0 for one node, NxD Inference for several)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers
from tokenizers.models import BPE, WordLevel
from tokenizers.pre_tokenizers import Whitespace

REPO = Path(__file__).resolve().parents[2]
WORDS = ["<unk>", "</s>", "hello", "world", "flotilla", "serves", "trainium", "units"]
# The plan's interpreter (`python`/`python3`) is replaced by this one; PYTHONPATH picks the stand-in.
STANDIN_LAUNCHER = sys.executable
STANDINS = REPO / "tests" / "neuron" / "standins"
VLLM_0_13_0 = str(STANDINS / "vllm_0_13_0")  # single-node image: vLLM 0.13.0 + vllm-neuron (OpenAI server)
NXDI_2_28 = str(STANDINS / "nxdi_2_28")  # multi-node image: NxD Inference (the torch reference, sharded)
WEIGHTS = "model.safetensors"


def byte_tokenizer() -> Tokenizer:
    """One token per UTF-8 byte (byte-level BPE without merges) after <unk> and </s>: any text can be spelled,
    and a character outside ASCII takes 2-4 tokens, as in real byte-level vocabularies."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {"<unk>": 0, "</s>": 1, **{ch: i + 2 for i, ch in enumerate(alphabet)}}
    tok = Tokenizer(BPE(vocab, [], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken("</s>", special=True)])
    return tok


def make_checkpoint(
    root: Path,
    config: dict,
    *,
    weights_bytes: int = 200_000,
    chat_template: str | None = None,
    tokenizer: str = "words",
) -> Path:
    """tokenizer: "words" (WORDS, one token a word) or "bytes" (byte_tokenizer)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(config))
    if tokenizer == "bytes":
        tok = byte_tokenizer()
    else:
        tok = Tokenizer(WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
        tok.pre_tokenizer = Whitespace()
    tok.save(str(root / "tokenizer.json"))
    (root / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "tokenizer_class": "PreTrainedTokenizerFast",
                **({"chat_template": chat_template} if chat_template else {}),
            }
        )
    )
    (root / WEIGHTS).write_bytes(os.urandom(weights_bytes))
    return root


def word_ids(text: str) -> list[int]:
    return [WORDS.index(w) for w in text.split()]
