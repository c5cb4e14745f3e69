"""The messages between a member's supervisor and its engine process (runtime/node/engine_host.py),
one JSON object a line: commands on the engine's stdin, events on its stdout. Each message is a
typed class; `encode` and the two decoders are the only code that reads or writes a line, so a key
misspelt on either side fails at once (an unknown op or key raises ProtocolError).

Tokens cross this line one by one: the classes are plain slotted dataclasses and a line is the
object's fields (None defaults left out), no schema validation on the way (bench/node/engine_protocol.py).
"""

from __future__ import annotations

import json
from dataclasses import MISSING, dataclass, fields
from typing import Any, ClassVar, Union

from contract.ready import Loading
from runtime.engines.base import EngineLoad, EngineState


class ProtocolError(ValueError):
    """A line that is not a message of this protocol: a node and engine process of different code (a bug)."""


# -- supervisor -> engine process ------------------------------------------------------------------


@dataclass(slots=True, kw_only=True)
class Submit:
    """One request. The prompt is `messages` (chat), `prompt` (text) or `prompt_ids` (token ids)."""

    op: ClassVar[str] = "submit"
    id: str  # unique among the requests in flight (the supervisor generates it)
    correlation_id: str  # the client's X-Request-Id, for the engine's log only
    max_tokens: int | None  # None: the client left it out, so default_max_tokens capped by the context
    default_max_tokens: int
    temperature: float
    top_p: float
    seed: int | None = None
    stop: list[str] | None = None
    ignore_eos: bool = False
    n: int | None = None
    logprobs: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    structured: dict[str, Any] | None = None
    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | None = None  # "auto": the engine names its tool-call format on each token
    prompt: str | None = None
    prompt_ids: list[int] | None = None
    generated: list[int] | None = None  # a continuation: the tokens another unit generated
    resumed_choices: list[list[Any]] | None = None  # n > 1 continued: [index, token ids] per open choice
    canary: bool = False  # the supervisor's own one-token request (never traffic)


@dataclass(slots=True, kw_only=True)
class Cancel:
    op: ClassVar[str] = "cancel"
    id: str


@dataclass(slots=True, kw_only=True)
class Shutdown:
    op: ClassVar[str] = "shutdown"
    reason: str = ""  # what requests still in flight are told


# -- engine process -> supervisor ------------------------------------------------------------------


@dataclass(slots=True, kw_only=True)
class Starting:
    op: ClassVar[str] = "starting"


# While the engine loads: its Loading (contract.ready, the one declaration of load progress), sent as
# it is; the node puts it in its ready body. An unknown phase or key is a ProtocolError.
Progress = Loading
_PROGRESS_KEYS = frozenset(Loading.model_fields)


@dataclass(slots=True, kw_only=True)
class Ready:
    op: ClassVar[str] = "ready"
    model_name: str
    max_context: int
    strategies: dict[str, Any] | None = None  # the reference engine's chosen strategies
    resumes: bool = False  # continues requests other units started
    resumes_choices: bool = False  # and each of n > 1 choices from its own tokens


@dataclass(frozen=True, kw_only=True)
class Load(EngineLoad):
    """The engine's health and load, every LOAD_EVERY_S: its EngineLoad (the figures are declared
    there, once) with its state. The supervisor keeps the last one as its engine's load
    (EngineProcess.load)."""

    op: ClassVar[str] = "load"
    state: EngineState  # a line carries its value; an unknown one is a ProtocolError
    detail: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "state", EngineState(self.state))


@dataclass(slots=True, kw_only=True)
class Following:
    """A follower's engine runs its leader engine's commands: `commands` received so far (steps and
    keep-alives), sent at most every LOAD_EVERY_S while the count grows. To the follower's supervisor
    it says the leader's engine is alive and drives this one, whether or not the leader's node
    answers its status polls in time."""

    op: ClassVar[str] = "following"
    commands: int


@dataclass(slots=True, kw_only=True)
class Failed:
    """The engine could not start or serve; the process exits."""

    op: ClassVar[str] = "failed"
    message: str = ""


@dataclass(slots=True, kw_only=True)
class Accepted:
    op: ClassVar[str] = "accepted"
    id: str
    prompt_tokens: int
    # Of those, the tokens the engine's prefix cache held at acceptance (0: none, or an engine that
    # cannot tell): the leader counts the rest as prefill ahead, an estimate (a block may be evicted,
    # or stored by an earlier prompt, before the request is admitted).
    cached_tokens: int = 0
    replayed_text: str | None = None  # tool_choice auto, continued: the continued tokens' text
    # tool_choice auto, n > 1 continued: [index, text] of each continued choice's tokens
    replayed_choices: list[list[Any]] | None = None


@dataclass(slots=True, kw_only=True)
class Token:
    op: ClassVar[str] = "token"
    id: str
    token_id: int  # -1: a finish-only event (neuron engine), not a token
    text: str
    finish_reason: str | None = None
    index: int = 0  # the choice (n > 1)
    logprobs: dict[str, Any] | None = None  # {"token", "logprob", "top": [[text, logprob], ...]}
    tool_parser: str | None = None  # tool_choice auto: the model's tool-call format


@dataclass(slots=True, kw_only=True)
class Done:
    op: ClassVar[str] = "done"
    id: str
    cached_tokens: int = 0


@dataclass(slots=True, kw_only=True)
class Error:
    """A request's end without an answer; `kind` picks the client's status (server.ENDINGS)."""

    op: ClassVar[str] = "error"
    kind: str
    message: str
    id: str = ""  # empty: an ending the server made itself (a timeout, a drain)
    param: str | None = None  # rejected: the request field at fault


Command = Union[Submit, Cancel, Shutdown]
Event = Union[Starting, Progress, Ready, Load, Following, Failed, Accepted, Token, Done, Error]
RequestEvent = Union[Accepted, Token, Done, Error]  # what a request's stream carries
_COMMANDS: dict[str, type] = {c.op: c for c in (Submit, Cancel, Shutdown)}
_EVENTS: dict[str, type] = {
    "progress": Progress,
    **{e.op: e for e in (Starting, Ready, Load, Following, Failed, Accepted, Token, Done, Error)},
}


_dumps = json.JSONEncoder(separators=(",", ":")).encode  # one encoder: json.dumps with options builds one per call


def _shape(op: str, cls: type) -> tuple[str, tuple[tuple[str, bool], ...]]:
    if cls is Progress:  # a pydantic model (contract.ready), the others slotted dataclasses
        return op, tuple((name, info.is_required()) for name, info in Loading.model_fields.items())
    return op, tuple((f.name, f.default is MISSING and f.default_factory is MISSING) for f in fields(cls))


# Per message class: its op, its fields, and those without a default (sent even when None).
_SHAPES: dict[type, tuple[str, tuple[tuple[str, bool], ...]]] = {
    cls: _shape(op, cls) for op, cls in (*_COMMANDS.items(), *_EVENTS.items())
}


def encode(msg: Command | Event) -> bytes:
    """One line: the op and the message's fields, those left at a None default out."""
    op, shape = _SHAPES[type(msg)]
    d: dict[str, Any] = {"op": op}
    for name, required in shape:
        v = getattr(msg, name)
        if v is not None or required:
            d[name] = v
    return (_dumps(d) + "\n").encode()


def _decode(line: bytes | str, ops: dict[str, type]) -> Any:
    try:
        d = json.loads(line)
        op = d.pop("op")
        cls = ops[op]
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ProtocolError(f"not a message of the engine protocol ({e!r}): {line[:200]!r}") from None
    if cls is Progress and not d.keys() <= _PROGRESS_KEYS:  # a Wire model ignores keys it does not know
        raise ProtocolError(f"{op}: unknown keys {sorted(d.keys() - _PROGRESS_KEYS)}")
    try:
        return cls(**d)
    except (TypeError, ValueError) as e:  # a key unknown to the class, one it needs missing, or a bad value
        raise ProtocolError(f"{op}: {e}") from None


def decode_event(line: bytes | str) -> Event:
    return _decode(line, _EVENTS)


def decode_command(line: bytes | str) -> Command:
    return _decode(line, _COMMANDS)
