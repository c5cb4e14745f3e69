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

    supports_tools = False  # its chat template has no tool format

    def token_text(self, token_id: int) -> str:
        """One token as text (logprobs): a special token by its name."""
        if 0 <= token_id < 256:
            return bytes([token_id]).decode("utf-8", errors="replace")
        return BYTE_SPECIALS[token_id - 256] if token_id - 256 < len(BYTE_SPECIALS) else ""

    def apply_chat_template(self, messages: Sequence[dict], tools: Sequence[dict] | None = None) -> list[int]:
        if tools:
            raise ValueError("this model's chat template has no tool format")
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

    @property
    def hf_tokenizer(self):  # noqa: ANN201 - transformers' tokenizer, for the grammar library
        return self._tok

    @property
    def chat_template(self) -> str | None:
        template = self._tok.chat_template
        return template if isinstance(template, str) else None

    @property
    def supports_tools(self) -> bool:
        """The chat template renders a `tools` list (a template without one would drop the tools)."""
        template = self._tok.chat_template
        if not isinstance(template, str):
            return False
        import jinja2  # noqa: PLC0415 - transformers renders chat templates with it
        from jinja2 import meta  # noqa: PLC0415

        return "tools" in meta.find_undeclared_variables(jinja2.Environment().parse(template))

    def token_text(self, token_id: int) -> str:
        """One token as text, as vLLM shows it in logprobs: tokenizer.decode([token_id])
        (vllm@v0.13.0:vllm/v1/engine/logprobs.py:90-95 via vllm/tokenizers/detokenizer_utils.py:97-104,
        shown by vllm/entrypoints/openai/serving_engine.py:1505-1522)."""
        return self._tok.decode([token_id])

    def apply_chat_template(self, messages: Sequence[dict], tools: Sequence[dict] | None = None) -> list[int]:
        if not self._tok.chat_template:
            raise ValueError("this checkpoint's tokenizer has no chat template; use /v1/completions")
        if tools and not self.supports_tools:
            raise ValueError("this model's chat template has no tool format")
        kwargs = {"tools": list(tools)} if tools else {}
        out = self._tok.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True, **kwargs)
        if isinstance(out, dict) or hasattr(out, "input_ids"):
            out = out["input_ids"]
        return list(out)
