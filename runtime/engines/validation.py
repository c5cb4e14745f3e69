"""What the reference engine refuses before a request is queued: each refusal names the field at fault
and the fix (base.RequestRejected, which the API turns into a 4xx)."""

from __future__ import annotations

from runtime.engines.base import GenerationRequest, RequestRejected


def validate_request(
    request: GenerationRequest,
    *,
    vocab: int,
    max_context: int,
    model_limit: int,
    kv_budget_tokens: int,
    max_running: int,
) -> int:
    """The KV tokens one choice of the request reserves (prompt + max_tokens), or RequestRejected."""
    p = request.sampling
    n = len(request.prompt_token_ids)
    if n == 0:
        raise RequestRejected("the prompt is empty: send at least one token")
    bad = [t for t in request.prompt_token_ids if not 0 <= t < vocab]
    if bad:
        raise RequestRejected(f"prompt token id {bad[0]} is outside the vocabulary 0..{vocab - 1}")
    if p.max_tokens < 1:
        raise RequestRejected(f"max_tokens {p.max_tokens} must be at least 1")
    if p.temperature < 0 or not 0 < p.top_p <= 1:
        raise RequestRejected(f"temperature {p.temperature} must be >= 0 and top_p {p.top_p} in (0, 1]")
    need = n + p.max_tokens
    if need > max_context:
        raise RequestRejected(
            f"the request needs {need} tokens of context (prompt {n} + max_tokens "
            f"{p.max_tokens}) but this unit holds at most {max_context} per sequence "
            f"(KV-cache budget {kv_budget_tokens}, model limit "
            f"{model_limit}); lower max_tokens or shorten the prompt"
        )
    if p.n < 1 or p.n > max_running:
        raise RequestRejected(
            f"n {p.n} must be between 1 and {max_running} (the sequences this unit runs at once)", param="n"
        )
    if p.n * need > kv_budget_tokens:
        raise RequestRejected(
            f"n {p.n} choices of {need} tokens each (prompt {n} + max_tokens {p.max_tokens}) need "
            f"{p.n * need} tokens of KV cache but the unit has {kv_budget_tokens}; lower n or max_tokens",
            param="n",
        )
    if request.generated or request.resumed_choices:
        _validate_continuation(request, vocab)
    if p.logprobs is not None and not 0 <= p.logprobs <= vocab:
        raise RequestRejected(
            f"logprobs {p.logprobs} must be between 0 and the vocabulary size {vocab}", param="logprobs"
        )
    return need


def _validate_continuation(request: GenerationRequest, vocab: int) -> None:
    p = request.sampling
    if request.generated and p.n != 1:
        raise RequestRejected(f"a continuation carries one choice's tokens, but n is {p.n}", param="n")
    indexes = [i for i, _ in request.resumed_choices]
    if request.resumed_choices and (request.generated or len(set(indexes)) != len(indexes)):
        raise RequestRejected("a continuation names each choice once, and its tokens only there (bug)")
    if any(not 0 <= i < p.n for i in indexes):
        raise RequestRejected(f"a continued choice's index is outside 0..{p.n - 1}", param="n")
    for tokens in (request.generated, *(t for _, t in request.resumed_choices)):
        if len(tokens) >= p.max_tokens:
            raise RequestRejected(
                f"the continuation already has {len(tokens)} of max_tokens {p.max_tokens}: nothing is left"
            )
        bad = [t for t in tokens if not 0 <= t < vocab]
        if bad:
            raise RequestRejected(f"continuation token id {bad[0]} is outside the vocabulary 0..{vocab - 1}")
