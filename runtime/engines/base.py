"""The engine interface the leader programs against.

The API layer knows nothing of tensors: it tokenizes, submits a GenerationRequest, and relays the
TokenEvents. The engine owns scheduling (continuous batching) and every collective call.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import AsyncIterator, Protocol, Sequence

# The defaults of the engine knobs a unit member's settings set (runtime/node/settings.py declares
# those settings with these values): an engine built outside a node (tests, benchmarks) runs as a
# default member's does.
DEFAULT_KV_BUDGET_TOKENS = 16384  # KV-cache tokens over all running sequences
DEFAULT_MAX_RUNNING = 16  # batch slots
DEFAULT_MAX_PREFILL_TOKENS = 2048  # prompt tokens prefilled per step (longer prompts go in chunks)
DEFAULT_COLLECTIVE_TIMEOUT_S = 30.0  # seconds before a silent peer fails the unit


class EngineError(Exception):
    """Base of every error an engine raises into a request's stream."""

    exit_code = 1  # the engine process's exit status when this ends it: the unit re-forms


class EngineCannotServe(EngineError):
    """The engine can never serve this model with these settings: the same start fails the same way.
    Its process exits with `exit_code` (contract/node_exit.py CANNOT_SERVE), and the node with it."""

    def __init__(self, message: str, *, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class RequestRejected(EngineError):
    """The request can never be served as asked (e.g. it cannot fit the KV-cache budget).

    The message names the input and the fix; the API maps it to a 4xx naming `param` (the request
    field at fault) when given.
    """

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class EngineBroken(EngineError):
    """The engine can no longer serve (a peer rank died, a collective timed out).

    Every in-flight request ends with this promptly; health() reports BROKEN afterwards.
    """


class EngineUnavailable(EngineError):
    """The engine is not serving (still starting, or shut down): the request was not finished, and
    another unit (or this one, later) may take it. The API maps it to a 503 with Retry-After."""


class EngineState(str, enum.Enum):
    STARTING = "starting"  # loading weights / forming the process group / warming up
    READY = "ready"
    BROKEN = "broken"  # needs the unit to re-form
    STOPPED = "stopped"


@dataclass(frozen=True)
class StructuredOutput:
    """Constrain the generated text: any JSON object (json_object) or JSON matching a schema."""

    kind: str  # "json_object" | "json_schema"
    schema: str | None = None  # json_schema: the schema as JSON text


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 0.0  # 0.0 means greedy
    top_p: float = 1.0
    seed: int | None = None  # seeded sampling is reproducible per request
    stop: tuple[str, ...] = ()  # stop strings; the matched string is not emitted
    ignore_eos: bool = False
    n: int = 1  # completions of the same prompt (choices), sharing its prefill
    logprobs: int | None = None  # None: none; k >= 0: the sampled token's logprob and the k most likely
    presence_penalty: float = 0.0  # OpenAI's penalties on tokens already generated
    frequency_penalty: float = 0.0
    structured: StructuredOutput | None = None


@dataclass(frozen=True)
class GenerationRequest:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    # A continuation (n == 1): tokens this request already produced on another unit. The engine
    # prefills them after the prompt, counts them against max_tokens, replays them through its text,
    # grammar and penalty state, and emits only what follows.
    generated: tuple[int, ...] = ()
    # A continuation of n > 1 choices: the choices still to run, each (its index, the tokens its
    # client already has), and `generated` empty. Each runs alone from prompt + its own tokens (one
    # prefill per choice, the prompt's cached blocks shared); a choice left out already finished.
    resumed_choices: tuple[tuple[int, tuple[int, ...]], ...] = ()
    # The leader's own canary (an idle unit's engine asked for one token): not counted as traffic in
    # the engine's counters (prefix-cache queries and hits).
    canary: bool = False

    @property
    def prefill_ids(self) -> tuple[int, ...]:
        """What the first step prefills: the prompt, and a continuation's tokens after it."""
        return self.prompt_token_ids + self.generated if self.generated else self.prompt_token_ids


@dataclass(frozen=True)
class TokenLogprob:
    """The sampled token's log-probability and the top alternatives, as (token id, logprob) pairs."""

    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class TokenEvent:
    token_id: int
    text: str  # the text this token adds (stop strings already cut)
    finish_reason: str | None = None  # None while generating; "stop" or "length" on the choice's last event
    index: int = 0  # which choice (0..n-1) this token belongs to
    logprob: TokenLogprob | None = None  # with SamplingParams.logprobs only
    # On a choice's last event: prompt tokens whose KV came from the prefix cache instead of being
    # computed (OpenAI's usage.prompt_tokens_details.cached_tokens).
    cached_tokens: int = 0


@dataclass(frozen=True)
class EngineLoad:
    """An engine's load; the engine process sends it to its supervisor with the engine's state
    (runtime/node/engine_protocol.py Load, which adds only those two fields)."""

    queue_depth: int = 0  # submitted, not yet running
    running: int = 0  # sequences in the running batch
    max_running: int = 0  # batch slots
    kv_cache_used: float = 0.0  # fraction of the KV-cache budget in use, 0.0..1.0
    # Prefix cache since start, in prompt tokens as vLLM counts them: every admitted prompt token is
    # a query, every token whose KV came from the cache a hit (vllm:prefix_cache_queries / _hits).
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    # Steps the engine completed since start (each a forward pass of the running batch), or 0 on an
    # engine that does not count them. A step that yields no token (one that only prefilled part of a
    # long prompt) is still progress: the node's stall watch counts it (runtime/node/engine_process.py).
    steps: int = 0
    # Speculative decoding since start, in tokens as vLLM counts them (vllm:spec_decode_num_draft_tokens
    # and vllm:spec_decode_num_accepted_tokens): draft tokens verified, and of those, kept. 0 without it.
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    # Tokens a decoding sequence gained per step lately: 1.0 without speculation, more with it (what makes
    # a unit's decode faster than its step time says); 0.0 on an engine that does not say.
    tokens_per_step: float = 0.0


@dataclass(frozen=True)
class EngineHealth:
    state: EngineState
    detail: str = ""


class Tokenizer(Protocol):
    eos_token_id: int | None

    def encode(self, text: str) -> list[int]: ...

    def decode(self, token_ids: Sequence[int]) -> str: ...

    def apply_chat_template(self, messages: Sequence[dict]) -> list[int]:
        """Token ids of the chat prompt, ending with the assistant turn's opening."""
        ...


class Engine(Protocol):
    """Lives in the leader process (rank 0). Followers run the engine's worker loop instead."""

    model_name: str
    max_context: int  # prompt + generated tokens a sequence may hold
    tokenizer: Tokenizer

    async def start(self) -> None:
        """Form the process group, load this rank's tensors, warm up. Returns when READY."""
        ...

    def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        """Submit and stream. Raises RequestRejected / EngineBroken into the iterator."""
        ...

    def cancel(self, request_id: str) -> None:
        """Free the request's slot and KV cache at the next step; its stream ends."""
        ...

    def health(self) -> EngineHealth: ...

    def load(self) -> EngineLoad: ...

    async def shutdown(self) -> None:
        """Stop the scheduler and release the process group (followers' loops then exit)."""
        ...
