"""Token choice on rank 0 (greedy or seeded temperature/top-p, OpenAI's penalties, a grammar's token
mask, logprobs). The text side (stop strings, incremental detokenization) is runtime/engines/text.py,
which imports no torch: the echo and Neuron engines' processes use it too."""

from __future__ import annotations

import os

import torch

from runtime.engines.base import SamplingParams, TokenLogprob


def make_generator(params: SamplingParams, index: int = 0) -> torch.Generator | None:
    """Choice `index` of a seeded request samples with seed + index, as vLLM seeds its n child
    requests (vllm@v0.13.0:vllm/v1/engine/parallel_sampling.py:70-75)."""
    if params.temperature == 0.0:
        return None
    if params.seed is None:
        seed = int.from_bytes(os.urandom(8), "little") >> 1
    else:
        seed = (params.seed + index) % 2**64  # manual_seed takes 0..2**64-1; OpenAI seeds may be negative
    return torch.Generator().manual_seed(seed)


class Draws:
    """The randomness of one choice, drawn per position: token k samples with a generator seeded from
    (the choice's seed, k), so a stream resumed at token k on another unit draws exactly what the
    original would have. The choice's seed is the request's seed + the choice index (as vLLM seeds
    its n child requests: vllm@v0.13.0:vllm/v1/engine/parallel_sampling.py:70-75), or random."""

    __slots__ = ("_base", "_gen")

    def __init__(self, params: SamplingParams, index: int = 0) -> None:
        if params.temperature == 0.0:
            self._base: int | None = None
        elif params.seed is None:
            self._base = int.from_bytes(os.urandom(8), "little")
        else:
            self._base = (params.seed + index) % 2**64  # OpenAI seeds may be negative
        self._gen = torch.Generator()

    def at(self, position: int) -> torch.Generator | None:
        """The generator for the choice's token number `position` (0 = the first generated)."""
        if self._base is None:
            return None
        return self._gen.manual_seed(_mix64(self._base, position))


def _mix64(seed: int, position: int) -> int:
    """splitmix64 of seed + position * golden ratio: neighbouring positions get unrelated streams
    (Steele, Lea, Flood, "Fast splittable pseudorandom number generators", OOPSLA 2014)."""
    z = (seed + (position + 1) * 0x9E3779B97F4A7C15) % 2**64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % 2**64
    return z ^ (z >> 31)


def choose(
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None,
    *,
    allowed: torch.Tensor | None = None,
    counts: torch.Tensor | None = None,
) -> tuple[int, TokenLogprob | None]:
    """One token for one sequence, in vLLM's order: the grammar mask first (it shapes the logprobs),
    then the logprobs of those logits ("raw_logprobs", vLLM's default), then penalties, temperature
    and top-p (vllm@v0.13.0:vllm/v1/worker/gpu_model_runner.py:3203-3210 applies the grammar bitmask
    before the sampler; vllm/v1/sample/sampler.py:81-82 takes raw logprobs, :299 penalties, :177
    temperature; vllm/config/model.py:193 logprobs_mode default). A neuron unit sampling on the host
    keeps that order: the plugin's runner applies the bitmask, then calls vLLM's Sampler
    (vllm-project/vllm-neuron@4fac6b7b:vllm_neuron/worker/neuronx_distributed_model_runner.py:247-268).

    logits: [vocab]; allowed: bool [vocab] from the grammar; counts: [vocab] times each token was
    generated so far (penalties only)."""
    if allowed is not None:
        logits = logits.masked_fill(~allowed, float("-inf"))
    logprob = None
    if params.logprobs is not None:
        lp = torch.log_softmax(logits.float(), dim=-1)
    if counts is not None and (params.presence_penalty or params.frequency_penalty):
        # OpenAI: mu[j] - c[j] * frequency_penalty - (c[j] > 0) * presence_penalty
        # (https://platform.openai.com/docs/guides/text-generation, "Frequency and presence penalties")
        logits = logits - counts * params.frequency_penalty - (counts > 0).to(logits.dtype) * params.presence_penalty
    token = sample(logits, params, generator)
    if params.logprobs is not None:
        k = min(params.logprobs, lp.shape[0])
        top = torch.topk(lp, k) if k else None
        logprob = TokenLogprob(
            logprob=float(lp[token]),
            top=tuple(zip(top.indices.tolist(), top.values.tolist())) if top is not None else (),
        )
    return token, logprob


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
