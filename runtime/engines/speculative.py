"""Speculative decoding in the reference engine: prompt lookup proposes a few tokens per sequence, one
forward pass over them verifies them, and the tokens kept are exactly those the model would have
chosen one step at a time. Drafting switches itself off where it does not pay (docs/engine.md).

Proposer. Prompt lookup (n-gram matching, Saxena 2023; vLLM's `ngram` method): the longest suffix of
the sequence so far (prompt and answer, min_ngram..max_ngram tokens) that occurred earlier in it; the
tokens that followed that earlier occurrence are the draft. It costs no forward pass, and a shopping
assistant's answers quote the product descriptions and reviews in their prompts. Why this proposer
and not a small draft model or the model's own first layers: docs/engine.md, "Speculative decoding".

Verifier. A drafted sequence's last token and its k draft tokens go through the model as one segment
(executor.StepCommand.drafts), giving k + 1 rows of logits. Row i is handled exactly as a decode step
would handle it (reference._advance: grammar mask, logprobs, penalties, the choice's per-position
draw, stop strings, EOS, max_tokens); draft token i is kept while it equals the token row i chose,
and the first row whose choice differs, or the row after the last draft token, gives the step's last
token. Greedy choices are therefore those of decoding without a draft. Sampled ones keep the target
distribution: a prompt-lookup draft is one token with probability 1 (q is a point mass), and
Leviathan et al. 2023 (Algorithm 1) / Chen et al. 2023 then accept draft token d with probability
min(1, p(d) / q(d)) = p(d) and on rejection sample from norm(max(0, p - q)), which is p without d:
drawing x ~ p and keeping d when x == d is that rule, since P(x == d) = p(d) and x given x != d is
distributed as norm(max(0, p - q)). vLLM's rejection sampler treats its n-gram drafts the same way
(vllm-project/vllm@0097a7bb:vllm/v1/sample/rejection_sampler.py, rejection_random_sample_kernel: with
IS_NGRAM draft_prob = 1; sample_recovered_tokens_kernel zeroes the draft token's probability). Row i
draws with the choice's own generator for that position (sampling.Draws), so a seeded answer is
the same token for token with speculation on or off, at any batch size.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from contract.speculation import DEFAULT_SPECULATIVE_TOKENS, MAX_SPECULATIVE_TOKENS


@dataclass(frozen=True)
class SpeculationSettings:
    """How the reference engine speculates (node settings FLOTILLA_SPECULATIVE_*; docs/engine.md)."""

    # Draft tokens per sequence per step (vLLM's num_speculative_tokens): the deployment config's default
    # and bound (contract.speculation).
    num_tokens: int = DEFAULT_SPECULATIVE_TOKENS
    min_ngram: int = 2  # shortest suffix looked up (vLLM's prompt_lookup_min)
    max_ngram: int = 4  # longest (prompt_lookup_max)
    # No drafts while more sequences decode than this: a verified token is then no longer nearly
    # free, since the step is not bound by reading the weights any more (docs/engine.md).
    max_batch: int = 4
    # A sequence whose recent acceptance falls below this stops drafting for pause_steps steps, then
    # tries again: a draft whose tokens are rejected costs rows of arithmetic and gives nothing.
    min_acceptance: float = 0.25
    pause_steps: int = 16

    def __post_init__(self) -> None:
        if not 1 <= self.num_tokens <= MAX_SPECULATIVE_TOKENS:
            raise ValueError(f"num_tokens {self.num_tokens} must be from 1 to {MAX_SPECULATIVE_TOKENS}")
        if not 1 <= self.min_ngram <= self.max_ngram <= 16:
            raise ValueError(f"min_ngram {self.min_ngram} and max_ngram {self.max_ngram} need 1 <= min <= max <= 16")
        if self.max_batch < 1 or self.pause_steps < 1 or not 0.0 <= self.min_acceptance <= 1.0:
            raise ValueError("max_batch and pause_steps must be at least 1, min_acceptance within 0..1")


class Lookup:
    """One sequence's n-gram index: each n-gram of its tokens so far -> where its latest occurrence
    ends, for occurrences that something followed. Grows by the new tokens at each proposal."""

    __slots__ = ("tokens", "index", "generated", "indexed", "min_n", "max_n")

    def __init__(self, prompt: Sequence[int], min_n: int, max_n: int) -> None:
        self.tokens: list[int] = list(prompt)
        self.index: dict[tuple[int, ...], int] = {}
        self.generated = 0  # generated tokens already in self.tokens
        self.indexed = 0  # n-grams ending before this position are in the index
        self.min_n, self.max_n = min_n, max_n

    def propose(self, generated: Sequence[int], k: int) -> list[int]:
        """Up to k tokens: what followed the latest earlier occurrence of the longest suffix that has one."""
        toks = self.tokens
        toks += generated[self.generated :]
        self.generated = len(generated)
        L = len(toks)
        for end in range(self.indexed, L):  # an n-gram ending at `end` has toks[end] after it
            for n in range(self.min_n, min(self.max_n, end) + 1):
                self.index[tuple(toks[end - n : end])] = end
        self.indexed = L
        for n in range(min(self.max_n, L), self.min_n - 1, -1):
            found = self.index.get(tuple(toks[L - n :]))
            if found is not None:
                return toks[found : found + k]
        return []


@dataclass
class SeqSpeculation:
    """A sequence's drafting state: its lookup index, this step's draft, its recent acceptance."""

    lookup: Lookup
    draft: list[int] = field(default_factory=list)
    acceptance: float = 1.0  # exponential average of accepted / drafted over its verified steps
    paused: int = 0  # steps left without drafts


# How fast a sequence's acceptance and the unit's tokens per step follow new steps.
_ACCEPTANCE_WEIGHT = 0.3
_TOKENS_WEIGHT = 1 / 64


class Speculator:
    """The leader's side of speculation: which decoding sequences draft this step and what, the check
    of their rows, the caches' trims, and the counts reported with the load."""

    def __init__(self, settings: SpeculationSettings | None) -> None:
        self.s = settings  # None: no drafts (the counts still say one token per step)
        self.drafts = 0  # sequence steps that verified a draft (vLLM's spec_decode_num_drafts)
        self.draft_tokens = 0  # draft tokens verified (spec_decode_num_draft_tokens)
        self.accepted_tokens = 0  # of those, kept (spec_decode_num_accepted_tokens)
        self.tokens_per_step = 1.0  # recent tokens a decoding sequence gained per step
        self._trims: list[tuple[int, int]] = []

    def plan(self, decoding: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
        """This step's decoding (request, sequence) pairs with each sequence's draft set (seq.spec), the
        drafted ones first (executor.StepCommand.drafts)."""
        s = self.s
        if s is None:
            return decoding
        off = len(decoding) > s.max_batch
        drafted: list[tuple[Any, Any]] = []
        plain: list[tuple[Any, Any]] = []
        for st, seq in decoding:
            spec = seq.spec
            if spec is None:
                spec = seq.spec = SeqSpeculation(Lookup(st.request.prompt_token_ids, s.min_ngram, s.max_ngram))
            spec.draft = []
            # At most what max_tokens leaves after this step's own token: the KV capacity holds no more.
            room = min(s.num_tokens, st.request.sampling.max_tokens - seq.generated - 1)
            if spec.paused:
                spec.paused -= 1
            elif not off and room > 0:
                spec.draft = spec.lookup.propose(seq.tracker.ids, room)
            (drafted if spec.draft else plain).append((st, seq))
        return drafted + plain

    def orders(self, decoding: list[tuple[Any, Any]]) -> dict[str, list]:
        """The step command's drafts, draft tokens and trims (executor.StepCommand)."""
        trim, self._trims = self._trims, []
        drafts = [(seq.seq_id, len(seq.spec.draft)) for _, seq in decoding if seq.spec and seq.spec.draft]
        if not drafts:
            return {"trim": trim}
        return {"drafts": drafts, "draft_tokens": [seq.spec.draft for _, seq in decoding], "trim": trim}

    def take(self, seq: Any, rows: Iterator[torch.Tensor], advance: Callable[[torch.Tensor], None]) -> None:
        """Hand a decoding sequence's rows to `advance` (the engine's one-token step) while its draft
        holds: row i's token is checked against draft token i; the rest of its rows are dropped."""
        draft = seq.spec.draft if seq.spec is not None else []
        mine = [next(rows) for _ in range(1 + len(draft))]
        kept = emitted = 0
        for i, row in enumerate(mine):
            advance(row)
            emitted += 1
            if seq.done or i == len(draft) or seq.last_token != draft[i]:
                break
            kept += 1
        self.tokens_per_step += _TOKENS_WEIGHT * (emitted - self.tokens_per_step)
        if not draft or self.s is None:
            return
        self.drafts += 1
        self.draft_tokens += len(draft)
        self.accepted_tokens += kept
        if not seq.done and kept < len(draft):  # its cache holds the rejected tokens' positions too
            self._trims.append((seq.seq_id, len(draft) - kept))
        spec = seq.spec
        spec.acceptance += _ACCEPTANCE_WEIGHT * (kept / len(draft) - spec.acceptance)
        if spec.acceptance < self.s.min_acceptance:
            spec.paused, spec.acceptance = self.s.pause_steps, self.s.min_acceptance

    def load(self) -> dict[str, Any]:
        """What the engine's load report carries (base.EngineLoad)."""
        return {
            "spec_draft_tokens": self.draft_tokens,
            "spec_accepted_tokens": self.accepted_tokens,
            "tokens_per_step": round(self.tokens_per_step, 3),
        }
