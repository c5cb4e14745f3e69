"""Resumable streams: what the client of one stream already has, so the stream can continue on another unit.

A leader asked with the resume header opens each SSE event with a comment line naming the token ids
the event carries, and opens a movable error event with a move comment (contract.resume
declares both). The ledger strips those lines, keeps the ids of every event the client got, and builds
the continuation a second unit needs: the original body plus the tokens already sent, the `id` and
`created` the client saw.
"""

from __future__ import annotations

import json

import contract
from contract.resume import Continuation, continuation_field, read_move, read_resume
from runtime.router.body import json_object

_RESUME = contract.RESUME_COMMENT.encode()
_MOVE = contract.MOVE_COMMENT.encode()
_DONE = b"data: [DONE]"  # the last event of an OpenAI stream
_ERROR = b'data: {"error"'  # an error event a leader ended the stream with (one it did not hand over)
_MARK = b": flotilla-"  # what both lines start with: a chunk without it passes untouched
assert _RESUME.startswith(_MARK) and _MOVE.startswith(_MARK)
# Paths whose streamed answers a leader can continue: the two generation endpoints.
RESUMABLE_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})


def resumable_request(method: str, path: str, headers: dict[str, str]) -> bool:
    """Worth asking the leader for resume comments: a generation request whose body the router can
    extend with a continuation (a compressed body is relayed as it came, so it cannot be)."""
    coding = next((v for k, v in headers.items() if k.lower() == "content-encoding"), "identity")
    return method == "POST" and path in RESUMABLE_PATHS and coding.strip().lower() in ("", "identity")


class StreamLedger:
    """One resumable stream as its client has it."""

    __slots__ = (
        "token_ids",
        "choices",
        "finished",
        "content_sent",
        "reported",
        "done",
        "since_move",
        "moves",
        "move_deadline",
        "avoid",
        "completion_id",
        "created",
    )

    def __init__(self, *, completion_id: str, created: int) -> None:
        self.token_ids: list[int] = []  # every token whose text reached the client, in order (choice 0's)
        self.choices: dict[int, list[int]] = {}  # n > 1: the other choices' tokens, by index
        self.finished: set[int] = set()  # n > 1: the choices whose end reached the client
        # tool_choice "auto": characters of each choice's text the client has as content, by index (the
        # rest is held while it may be a tool call; its tokens are in the choice's ids, for the next
        # unit's tool parser)
        self.content_sent: dict[int, int] = {}
        self.reported = False  # the unit sent resume comments: it can be continued elsewhere
        self.done = False  # the stream's [DONE] or an error event passed: it ended, not to be continued
        self.since_move = 0  # tokens from the unit serving it now (0: it may still be prefilling)
        self.moves = 0  # continuations started so far
        # loop time until which a move may wait for a free batch slot (set when the stream first has to move)
        self.move_deadline: float | None = None
        self.avoid: list = []  # units this stream ran on: a move goes elsewhere
        self.completion_id = completion_id
        self.created = created

    @property
    def sent(self) -> int:
        """Tokens whose text reached the client, every choice's."""
        return len(self.token_ids) + sum(len(ids) for ids in self.choices.values())

    def take(self, data: bytes) -> tuple[bytes, str | None]:
        """Whole SSE events from a unit -> what the client gets, and the reason the unit gave if it
        handed the stream over (the handing-over event and anything after it are dropped)."""
        if _MARK not in data:
            self.done = self.done or _DONE in data or _ERROR in data
            return data, None
        out: list[bytes] = []
        parts = data.split(b"\n\n")
        for part in parts[:-1]:
            if part.startswith(_RESUME):
                line, _, rest = part.partition(b"\n")
                note = read_resume(line)
                i = note.choice
                (self.token_ids if i == 0 else self.choices.setdefault(i, [])).extend(note.token_ids)
                if note.finished:
                    self.finished.add(i)
                if note.content_sent is not None:
                    self.content_sent[i] = note.content_sent
                # held tokens (a forced tool call's) are progress, not sent
                self.since_move += len(note.token_ids) + note.held
                self.reported = True
                if rest:
                    out.append(rest + b"\n\n")
            elif part.startswith(_MOVE):
                return b"".join(out), read_move(part.partition(b"\n")[0])
            else:
                self.done = self.done or part == _DONE or part.startswith(_ERROR)
                out.append(part + b"\n\n")
        out.append(parts[-1])  # the framer passes whole events: normally empty
        return b"".join(out), None

    def continuation(self, body: bytes) -> bytes | None:
        """The request body a second unit continues from, or None if the body is not a JSON object."""
        payload = json_object(body)
        if payload is None:
            return None
        many = bool(self.choices or self.finished or set(self.content_sent) - {0})
        payload[contract.CONTINUATION_FIELD] = continuation_field(
            Continuation(
                self.completion_id,
                self.created,
                self.token_ids,
                choices=self.choices if many else None,
                finished=frozenset(self.finished),
                content_sent=self.content_sent,
            )
        )
        return json.dumps(payload, separators=(",", ":")).encode()
