"""Tokenizers behind base.Tokenizer: a byte-level one for `tiny`, a tokenizer.json wrapper for real
checkpoints (chat template from tokenizer_config.json, applied by transformers)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

# Byte-level vocabulary: ids 0..255 are the bytes themselves, then the special tokens.
BYTE_SPECIALS = ("<|bos|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>")


class ByteTokenizer:
    """UTF-8 bytes as tokens plus a few special tokens; the chat template marks roles with them."""

    def __init__(self) -> None:
        self.special_ids = {name: 256 + i for i, name in enumerate(BYTE_SPECIALS)}
        self.vocab_size = 256 + len(BYTE_SPECIALS)
        self.bos_token_id = self.special_ids["<|bos|>"]
        self.eos_token_id: int | None = self.special_ids["<|end|>"]

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, token_ids: Sequence[int]) -> str:
        # Special tokens decode to nothing: they are structure, not text.
        data = bytes(t for t in token_ids if 0 <= t < 256)
        return data.decode("utf-8", errors="replace")

    def apply_chat_template(self, messages: Sequence[dict]) -> list[int]:
        ids = [self.bos_token_id]
        for message in messages:
            role = message.get("role")
            key = f"<|{role}|>"
            if key not in self.special_ids or role == "end":
                raise ValueError(f"message role {role!r} is not one of system, user, assistant")
            ids.append(self.special_ids[key])
            ids.extend(self.encode(str(message.get("content", ""))))
            ids.append(self.special_ids["<|end|>"])
        ids.append(self.special_ids["<|assistant|>"])
        return ids


class HFTokenizer:
    """A checkpoint directory's tokenizer.json (+ tokenizer_config.json for EOS and chat template)."""

    def __init__(self, model_dir: str | Path) -> None:
        from transformers import PreTrainedTokenizerFast  # noqa: PLC0415 - transformers loads only when a tokenizer is built

        model_dir = Path(model_dir)
        if not (model_dir / "tokenizer.json").is_file():
            raise FileNotFoundError(
                f"{model_dir} has no tokenizer.json; a checkpoint directory needs config.json, "
                "*.safetensors and tokenizer.json"
            )
        self._tok = PreTrainedTokenizerFast.from_pretrained(str(model_dir))
        self.eos_token_id: int | None = self._tok.eos_token_id
        gen = model_dir / "generation_config.json"
        if self.eos_token_id is None and gen.is_file():
            eos = json.loads(gen.read_text()).get("eos_token_id")
            self.eos_token_id = eos[0] if isinstance(eos, list) else eos
        self.vocab_size = len(self._tok)

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False))

    def decode(self, token_ids: Sequence[int]) -> str:
        return self._tok.decode(list(token_ids), skip_special_tokens=True)

    def apply_chat_template(self, messages: Sequence[dict]) -> list[int]:
        if not self._tok.chat_template:
            raise ValueError("this checkpoint's tokenizer has no chat template; use /v1/completions")
        out = self._tok.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True)
        if isinstance(out, dict) or hasattr(out, "input_ids"):
            out = out["input_ids"]
        return list(out)
