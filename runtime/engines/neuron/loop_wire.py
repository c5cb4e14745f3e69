"""The neuron engine and its NxD Inference loop (spmd.py) talk in JSON lines: requests in on the loop's
stdin, and on its stdout the load phases, "ready", and one event per generated token. Every message is
declared here, written by one encoder and read by one decoder, and both sides import this module.

Standard library only: spmd.py runs with the image's Python and never imports the flotilla package, so
it imports this file as its sibling (`import loop_wire`) when run as a script.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

# The load phases the loop reports (contract.ready.LoadPhase values; tests keep the two equal).
PHASE_COMPILE, PHASE_LOAD, PHASE_WARMUP, PHASE_JOIN = "compile", "load", "warmup", "join"


# -- engine -> loop (stdin) --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Add:
    """A request to schedule: the prompt's token ids and NxD Inference's per-row sampling."""

    id: str
    prompt: list[int]
    max_tokens: int
    top_k: int = 1  # 1: greedy
    top_p: float = 1.0
    temperature: float = 1.0
    stop_token_ids: tuple[int, ...] = ()  # end the request as "stop" (EOS)


@dataclass(frozen=True, slots=True)
class Cancel:
    id: str


@dataclass(frozen=True, slots=True)
class Stop:
    """Stop the unit (the leader tells the followers too)."""


ToLoop = Add | Cancel | Stop


class BadMessage(ValueError):
    """A line the loop cannot take; `id` is the request it names, if any (the engine is told)."""

    def __init__(self, message: str, id_: str | None = None) -> None:
        super().__init__(message)
        self.id = id_


def to_loop_line(msg: ToLoop) -> bytes:
    if isinstance(msg, Add):
        body: dict[str, Any] = {
            "op": "add",
            "id": msg.id,
            "prompt": msg.prompt,
            "max_tokens": msg.max_tokens,
            "top_k": msg.top_k,
            "top_p": msg.top_p,
            "temperature": msg.temperature,
            "stop_token_ids": list(msg.stop_token_ids),
        }
    elif isinstance(msg, Cancel):
        body = {"op": "cancel", "id": msg.id}
    else:
        body = {"op": "stop"}
    return (json.dumps(body) + "\n").encode()


def read_to_loop(line: str | bytes) -> ToLoop | None:
    """One stdin line; None for a line of no known op (ignored, as a newer engine's may be). BadMessage
    when the line is not a JSON object or its fields cannot be used."""
    try:
        msg = json.loads(line)
    except ValueError as e:
        raise BadMessage(f"not a JSON line: {e}") from None
    if not isinstance(msg, dict):
        raise BadMessage("not a JSON object")
    op = msg.get("op")
    if op == "stop":
        return Stop()
    if op not in ("add", "cancel"):
        return None
    rid = msg.get("id")
    if not isinstance(rid, str):
        raise BadMessage(f"{op}: 'id' must be a string, not {rid!r}", None if rid is None else str(rid))
    if op == "cancel":
        return Cancel(rid)
    try:
        return Add(
            id=rid,
            prompt=[int(t) for t in msg["prompt"]],
            max_tokens=int(msg["max_tokens"]),
            top_k=int(msg.get("top_k", 1)),
            top_p=float(msg.get("top_p", 1.0)),
            temperature=float(msg.get("temperature", 1.0)),
            stop_token_ids=tuple(int(t) for t in msg.get("stop_token_ids") or ()),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise BadMessage(f"add: {type(e).__name__}: {e}", rid) from None


# -- loop -> engine (stdout) -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Progress:
    """The node's load moved to a phase (every node's loop writes these while it loads)."""

    phase: str


@dataclass(frozen=True, slots=True)
class Ready:
    """Every node of the unit has loaded: the leader's loop takes requests."""


@dataclass(frozen=True, slots=True)
class Generated:
    """One token of a request; `finish` "length" or "stop" on its last."""

    id: str
    token: int
    finish: str | None = None


@dataclass(frozen=True, slots=True)
class Refused:
    """The loop could not take a request."""

    id: str | None
    error: str


@dataclass(frozen=True, slots=True)
class Following:
    """A follower's loop received the leader's broadcasts (steps and keep-alives), `commands` so far:
    written at most every FOLLOWING_EVERY_S while they come. Its node takes it as the leader's loop alive."""

    commands: int


FOLLOWING_EVERY_S = 0.1

FromLoop = Progress | Ready | Generated | Refused | Following


def from_loop_line(msg: FromLoop) -> str:
    if isinstance(msg, Generated):
        body: dict[str, Any] = {"id": msg.id, "token": msg.token, "finish": msg.finish}
    elif isinstance(msg, Refused):
        body = {"id": msg.id, "error": msg.error}
    elif isinstance(msg, Progress):
        body = {"event": "progress", "phase": msg.phase}
    elif isinstance(msg, Following):
        body = {"event": "following", "commands": msg.commands}
    else:
        body = {"event": "ready"}
    return json.dumps(body) + "\n"


def read_from_loop(line: str | bytes) -> FromLoop | None:
    """One stdout line; None for a line of no known kind. ValueError when it is not a JSON object or
    a known kind's fields cannot be used."""
    msg = json.loads(line)
    if not isinstance(msg, dict):
        raise ValueError(f"the NxD Inference loop wrote a line that is not a JSON object: {line[:200]!r}")
    event = msg.get("event")
    if event == "ready":
        return Ready()
    if event == "progress":
        return Progress(str(msg["phase"]))
    if event == "following":
        return Following(int(msg["commands"]))
    if "error" in msg:
        rid = msg.get("id")
        return Refused(None if rid is None else str(rid), str(msg["error"]))
    if "token" in msg:
        finish = msg.get("finish")
        return Generated(str(msg["id"]), int(msg["token"]), None if finish is None else str(finish))
    return None
