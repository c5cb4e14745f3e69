"""Incremental detokenization that cuts stop strings and holds back text that might still become one.

Pure Python: every engine's process uses it (the engine host for the echo engine, the Neuron engine's
leader), and none of those should pay for importing torch (about 1.5 CPU-seconds a process)."""

from __future__ import annotations


class TextTracker:
    """Turns a growing list of token ids into text deltas; stops at the first stop string.

    Decoding is incremental (a short window of tokens, as vLLM does: vllm@v0.13.0:
    vllm/tokenizers/detokenizer_utils.py:56, 110 for slow tokenizers; fast ones use tokenizers'
    DecodeStream, vllm/v1/engine/detokenizer.py:169-178), so a long generation costs
    O(tokens), and a token that ends inside a UTF-8 character releases nothing until it completes.
    """

    def __init__(self, tokenizer, stop: tuple[str, ...]) -> None:
        self.tokenizer = tokenizer
        self.stop = tuple(s for s in stop if s)
        self.ids: list[int] = []
        self.text = ""  # decoded text of ids[:read]
        self.prefix = 0  # window start: a few tokens of context for the decoder
        self.read = 0  # tokens already turned into text
        self.emitted = 0  # characters of self.text already sent

    def _decode_new(self) -> str:
        before = self.tokenizer.decode(self.ids[self.prefix : self.read])
        after = self.tokenizer.decode(self.ids[self.prefix :])
        return after[len(before) :] if len(after) > len(before) else ""

    def add(self, token_id: int) -> tuple[str, bool]:
        """Text this token releases, and whether a stop string was reached (not emitted)."""
        self.ids.append(token_id)
        new = self._decode_new()
        if new and not new.endswith("\ufffd"):  # complete characters only
            self.text += new
            self.prefix, self.read = self.read, len(self.ids)
        full = self.text
        if self.stop:
            longest = max(len(s) for s in self.stop)
            search_from = max(0, self.emitted - longest + 1)
            hits = [i for i in (full.find(s, search_from) for s in self.stop) if i >= 0]
            if hits:
                cut = max(min(hits), self.emitted)
                delta = full[self.emitted : cut]
                self.emitted = cut
                return delta, True
        safe = len(full)
        for s in self.stop:  # a suffix that may grow into a stop string is held back
            for k in range(min(len(s) - 1, safe), 0, -1):
                if full.endswith(s[:k]):
                    safe = min(safe, len(full) - k)
                    break
        safe = max(safe, self.emitted)
        delta = full[self.emitted : safe]
        self.emitted = safe
        return delta, False

    def flush(self) -> str:
        """Held-back text (and any incomplete character), released when the sequence ends."""
        self.text += self._decode_new()
        self.prefix = self.read = len(self.ids)
        delta = self.text[self.emitted :]
        self.emitted = len(self.text)
        return delta
