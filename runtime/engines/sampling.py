"""Token choice on rank 0 (greedy or seeded temperature/top-p) and incremental detokenization that
cuts stop strings and holds back text that might still become one."""

from __future__ import annotations

import os

import torch

from runtime.engines.base import SamplingParams


def make_generator(params: SamplingParams) -> torch.Generator | None:
    if params.temperature == 0.0:
        return None
    seed = params.seed if params.seed is not None else int.from_bytes(os.urandom(8), "little") >> 1
    return torch.Generator().manual_seed(seed)


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """logits: [vocab] for one sequence."""
    if params.temperature == 0.0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits.double() / params.temperature, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        cumulative = torch.cumsum(sorted_probs, dim=-1)
        keep = (cumulative - sorted_probs) < params.top_p  # smallest set reaching top_p
        keep[0] = True
        sorted_probs = torch.where(keep, sorted_probs, torch.zeros_like(sorted_probs))
        choice = torch.multinomial(sorted_probs / sorted_probs.sum(), 1, generator=generator)
        return int(order[choice])
    return int(torch.multinomial(probs, 1, generator=generator))


class TextTracker:
    """Turns a growing list of token ids into text deltas; stops at the first stop string.

    Decoding is incremental (a short window of tokens, as vLLM does), so a long generation costs
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
