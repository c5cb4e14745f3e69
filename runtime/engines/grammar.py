"""Structured output for the reference engine: a JSON object or JSON-schema grammar (llguidance) turned
into a token mask on the logits before sampling. Sampling happens on rank 0, which holds the full
logits in every rank layout, so the mask is applied the same way whatever the parallel plan.
"""

from __future__ import annotations

import json
import threading
from typing import TYPE_CHECKING, Any

import torch

from runtime.engines.base import RequestRejected, StructuredOutput

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

# Compact JSON (no free whitespace between tokens): a model may otherwise pad a document with
# whitespace until max_tokens cuts it. vLLM's guidance backend passes the same option, flexible by
# default and compact with --structured-outputs-config.disable_any_whitespace
# (vllm@v0.13.0:vllm/v1/structured_output/backend_guidance.py:189-216; the flag's default,
# vllm/config/structured_outputs.py:30). A neuron unit's vLLM runs with the defaults (backend "auto":
# xgrammar, else guidance, vllm/v1/engine/input_processor.py:329-352), so its JSON may carry whitespace.
_DEFAULTS: JsonCompileOptions = {"whitespace_flexible": False}
# json_object is "any JSON object", as vLLM builds it (same file, :208-215).
_ANY_OBJECT = '{"type": "object"}'
_SHIFTS = torch.arange(32, dtype=torch.int32)


class Grammars:
    """One per engine: the tokenizer as llguidance sees it (built once, on first use: ~0.3-1 s for a
    49k vocabulary) and a fresh matcher per sequence."""

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._ll: Any = None
        self._lock = threading.Lock()

    def _lltokenizer(self) -> Any:
        import llguidance  # noqa: PLC0415 - only structured requests need it

        with self._lock:
            if self._ll is None:
                inner = getattr(self.tokenizer, "hf_tokenizer", None)
                if inner is not None:
                    import llguidance.hf  # noqa: PLC0415

                    self._ll = llguidance.hf.from_tokenizer(
                        inner, n_vocab=self.vocab_size, eos_token=self.tokenizer.eos_token_id
                    )
                else:
                    self._ll = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_ByteView(self.tokenizer)))
            return self._ll

    def grammar(self, spec: StructuredOutput) -> str:
        """The llguidance grammar of a request; a schema it cannot compile is the client's error."""
        import llguidance  # noqa: PLC0415

        if spec.kind == "json_object":
            source = _ANY_OBJECT
        elif spec.kind == "json_schema" and spec.schema is not None:
            source = spec.schema
        else:
            raise RequestRejected(f"unknown structured output {spec.kind!r}: use json_object or json_schema")
        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(source, defaults=_DEFAULTS)
        except (ValueError, TypeError) as e:
            raise RequestRejected(f"response_format.json_schema.schema cannot be used: {e}") from None
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, self._lltokenizer())
        if is_error:
            raise RequestRejected(f"response_format.json_schema.schema cannot be used: {'; '.join(messages)[:300]}")
        return grammar

    def matcher(self, grammar: str) -> Matcher:
        import llguidance  # noqa: PLC0415

        return Matcher(llguidance.LLMatcher(self._lltokenizer(), grammar), self.vocab_size)


class Matcher:
    """One sequence's position in its grammar: which tokens may come next, and consuming the chosen one."""

    def __init__(self, inner: Any, vocab_size: int) -> None:
        self._m = inner
        self._vocab = vocab_size
        self._words = (vocab_size + 31) // 32
        self._bits = torch.zeros(1, self._words, dtype=torch.int32)

    def allowed(self) -> torch.Tensor:
        """Bool [vocab]: True where the grammar allows the token next."""
        # The matcher writes the mask into the int32 words itself, as llguidance.torch's
        # fill_next_token_bitmask does (llguidance 1.9.1, llguidance/torch.py: one contiguous CPU row,
        # its data_ptr and byte size). That module is not imported: it compiles a kernel with
        # torch.compile at import, which loads torch._dynamo, 2-2.6 s into an engine's first
        # structured request.
        self._m.unsafe_compute_mask_ptr(self._bits.data_ptr(), self._bits.numel() * self._bits.element_size())
        return ((self._bits[0].unsqueeze(-1) >> _SHIFTS) & 1).view(-1)[: self._vocab].bool()

    def consume(self, token_id: int) -> None:
        if not self._m.consume_token(token_id):
            raise RuntimeError(f"the grammar refused token {token_id} it allowed: {self._m.get_error()} (bug)")

    @property
    def done(self) -> bool:
        """The document is complete: nothing but the end may follow."""
        return bool(self._m.is_stopped())


class _ByteView:
    """The byte-level tokenizer (`tiny`) as llguidance's TokenizerWrapper expects it."""

    def __init__(self, tok: Any) -> None:
        self.eos_token_id = tok.eos_token_id
        self.bos_token_id = getattr(tok, "bos_token_id", None)
        specials = sorted(tok.special_ids.items(), key=lambda kv: kv[1])
        self.tokens = [bytes([i]) for i in range(256)] + [name.encode() for name, _ in specials]
        self.special_token_ids = [i for _, i in specials]
        self._tok = tok

    def __call__(self, text: bytes | str) -> list[int]:
        return list(text) if isinstance(text, bytes) else self._tok.encode(text)


def schema_text(schema: Any) -> str:
    """A JSON schema object as the JSON text the grammar compiler takes."""
    return json.dumps(schema, separators=(",", ":"))
