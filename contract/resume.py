"""A stream that moves between units: the comment lines a leader puts in a resumable stream and the
continuation a router sends the next unit, each encoded and decoded here and nowhere else.

A resume comment opens each event (contract.RESUME_COMMENT + a JSON object with one-letter keys, as
every token event carries one); a move comment opens the error event a leader hands a stream over
with (contract.MOVE_COMMENT + the reason). The continuation rides in the request body's
contract.CONTINUATION_FIELD. Optional keys are left out when they hold their default, so a peer of
the revision before each was added reads every line and body as it did.
"""

from __future__ import annotations

import json
import re
from functools import partial
from typing import Any, NamedTuple

from contract import CONTINUATION_FIELD, CONTINUATION_HEADER, MOVE_COMMENT, REQUEST_ID_PATTERN, RESUME_COMMENT

_dumps = json.JSONEncoder(separators=(",", ":")).encode  # built once: json.dumps with options builds one per call
_RESUME = RESUME_COMMENT.encode()
_MOVE = MOVE_COMMENT.encode()
_RESUME_LEN = len(_RESUME)
_ID_OK = re.compile(REQUEST_ID_PATTERN)


class ResumeNote(NamedTuple):
    """What one event of a resumable stream carries, as its resume comment says (a NamedTuple: the
    router reads one per token event)."""

    token_ids: list[int]  # "t": the ids of the tokens whose text this event brings the client
    # "h": tokens generated but held back (a forced tool call's text goes out whole at its end): the
    # stream makes progress though the client has nothing new
    held: int = 0
    choice_index: int | None = None  # "i": the event's choice, with n > 1 only (absent: choice 0)
    finished: bool = False  # "f": the event ends its choice (n > 1 only)
    # "c": with tool_choice "auto", characters of the choice's text the client has as content (the
    # rest is held while it may be a tool call)
    content_sent: int | None = None

    @property
    def choice(self) -> int:
        return self.choice_index or 0


# tuple.__new__ without NamedTuple's keyword handling: about a fifth cheaper than ResumeNote(...)
_note = partial(tuple.__new__, ResumeNote)


def resume_line(note: ResumeNote) -> bytes:
    """The comment line (with its newline) that opens an event."""
    body: dict[str, Any] = {"t": note.token_ids}
    if note.held:
        body["h"] = note.held
    if note.choice_index is not None:
        body["i"] = note.choice_index
    if note.finished:
        body["f"] = 1
    if note.content_sent is not None:
        body["c"] = note.content_sent
    return _RESUME + _dumps(body).encode() + b"\n"


def read_resume(line: bytes) -> ResumeNote:
    """A resume comment line as sent (starting with RESUME_COMMENT, without its newline). ValueError
    when it is not one. The ids are taken as listed (the router reads one line per token event): one
    that is not a token id makes the next unit refuse the continuation (read_continuation)."""
    said = json.loads(line[_RESUME_LEN:])
    ids = said.get("t") if type(said) is dict else None
    if type(ids) is not list:
        raise ValueError(f"a resume comment names no token ids: {line[:200]!r}")
    c = said.get("c")
    return _note((ids, int(said.get("h", 0)), said.get("i"), bool(said.get("f")), None if c is None else int(c)))


def move_line(reason: str) -> bytes:
    """The comment line (with its newline) that opens a movable error event: the router continues
    the stream on another unit."""
    return _MOVE + reason.encode() + b"\n"


def read_move(line: bytes) -> str:
    """The reason a move comment line (without its newline) gives; "moved" when it names none."""
    return line[len(_MOVE) :].decode("ascii", "replace") or "moved"


class ContinuationError(ValueError):
    """A continuation a leader cannot take: the message names the field and its shape (a 400)."""


class Continuation(NamedTuple):
    """What a stream's client already has, for the unit that continues it."""

    id: str  # the completion id the client saw
    created: int  # the creation time the client saw
    token_ids: list[int]  # choice 0's tokens the client has
    # n > 1 only (None: a stream of one choice): the other choices' tokens by index, and the indexes
    # of the choices whose end the client has
    choices: dict[int, list[int]] | None = None
    finished: frozenset[int] = frozenset()
    # tool_choice "auto": characters of content the client has, by choice (the rest of each text was held)
    content_sent: dict[int, int] | None = None


def continuation_field(cont: Continuation) -> dict[str, Any]:
    """The value of the request body's CONTINUATION_FIELD."""
    out: dict[str, Any] = {"id": cont.id, "created": cont.created, "token_ids": cont.token_ids}
    many = cont.choices is not None
    if cont.choices is not None:  # n > 1: each choice continues from its own tokens
        out["choices"] = [[i, ids] for i, ids in sorted(cont.choices.items())]
        out["finished"] = sorted(cont.finished)
    if cont.content_sent:
        sent = cont.content_sent  # n > 1: [index, characters] of each choice, as "choices" lists its tokens
        out["content_sent"] = [[i, c] for i, c in sorted(sent.items())] if many else sent.get(0, 0)
    return out


def _ids(v: Any) -> bool:
    return isinstance(v, list) and all(type(t) is int and t >= 0 for t in v)


def read_continuation(field: Any, n: int, *, content_sent: bool = False) -> Continuation:
    """The body's CONTINUATION_FIELD for a request of `n` choices (`content_sent`: with tool_choice
    "auto", read what the client has as content too). ContinuationError naming the part that is wrong."""
    ok = (
        isinstance(field, dict)
        and isinstance(field.get("id"), str)
        and _ID_OK.match(field["id"]) is not None
        and type(field.get("created")) is int
        and _ids(field.get("token_ids"))
    )
    if not ok:
        raise ContinuationError(
            f'\'{CONTINUATION_FIELD}\' must be {{"id": str, "created": int, "token_ids": [int, ...]}} '
            f"when {CONTINUATION_HEADER} is set"
        )
    choices, finished = _choices(field, n) if n > 1 else (None, frozenset[int]())
    sent = _content_sent(field, n) if content_sent else None
    return Continuation(field["id"], field["created"], field["token_ids"], choices, finished, sent)


def _choices(field: dict, n: int) -> tuple[dict[int, list[int]], frozenset[int]]:
    """n > 1: "choices" [[index, token ids], ...] of the choices beyond 0 that have any, "finished" the
    indexes of choices whose end the client has; an older router's body has neither (nothing of them yet)."""
    more, ended = field.get("choices", []), field.get("finished", [])
    ok = (
        isinstance(more, list)
        and all(isinstance(c, list) and len(c) == 2 and type(c[0]) is int and 0 < c[0] < n and _ids(c[1]) for c in more)
        and isinstance(ended, list)
        and all(type(i) is int and 0 <= i < n for i in ended)
    )
    if not ok:
        raise ContinuationError(
            f"'{CONTINUATION_FIELD}' with n = {n} takes \"choices\": [[index 1..{n - 1}, [int, ...]], "
            f'...] and "finished": [index, ...]'
        )
    return {i: t for i, t in more}, frozenset(ended)


def _content_sent(field: dict, n: int) -> dict[int, int]:
    """tool_choice "auto": the characters of content the client has, by choice: an int (choice 0's),
    or with n > 1 [[index, characters], ...]."""
    sent = field.get("content_sent", 0)
    if type(sent) is int and sent >= 0:
        return {0: sent}
    pairs = sent if n > 1 and isinstance(sent, list) else None
    if pairs is not None and all(
        isinstance(p, list) and len(p) == 2 and all(type(x) is int for x in p) and 0 <= p[0] < n and p[1] >= 0
        for p in pairs
    ):
        return {i: c for i, c in pairs}
    shape = "an int >= 0" if n == 1 else f"an int >= 0, or [[index 0..{n - 1}, int >= 0], ...]"
    raise ContinuationError(
        f"'{CONTINUATION_FIELD}.content_sent' must be the characters of content the client has ({shape})"
    )
