"""How a request takes part in moves between units: whether its stream reports token ids to the router
and can be handed over, and for a continuation what its client already has (contract.resume)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

import contract
from contract.resume import ContinuationError, ResumeNote, read_continuation, resume_line
from runtime.node.engine_protocol import Token
from runtime.node.protocol import ApiError, ParsedRequest
from runtime.node.serving import ChatServing, Collected, CompletionServing


def collector_so_far(serving: ChatServing | CompletionServing, move: StreamMove) -> Collected:
    """A continued stream's answer as its client already has it: the choices whose end it has, and
    with tool_choice "auto" each choice's whole text so far, which its tool parser goes on from (the
    client has the first content_sent characters of it as content; the rest was held: it may be a call)."""
    collected = serving.collector()
    for i in move.finished:
        collected.choices[i].finish_reason = "continued"
    if move.content_sent is not None:
        for i, text in move.replayed.items():
            collected.choices[i].text.append(text)
        for i, chars in move.content_sent.items():
            collected.choices[i].sent = chars
    return collected


def resume_comment(ev: Token | None, *, held: bool = False, choices: int = 1, content_sent: int | None = None) -> bytes:
    """The resume comment for an event (contract.resume). A held token (a forced tool call's: its text
    goes out whole at the end) reached no client, so it is not reported as sent, only as progress. With
    n > 1 it names the event's choice and whether the event ends it. With tool_choice "auto" every token
    is reported, with how much of the text the client has as content (the rest is held)."""
    token = ev is not None and ev.token_id >= 0
    many = choices > 1 and ev is not None
    return resume_line(
        ResumeNote(
            [] if held or ev is None or not token else [ev.token_id],
            held=int(held and token),
            choice_index=ev.index if many and ev is not None else None,
            finished=many and ev is not None and bool(ev.finish_reason),
            content_sent=content_sent,
        )
    )


class StreamMove:
    """How a request takes part in moves between units: `resume` (report token ids to the router, hand
    the stream over on a drain) and, for a continuation, the tokens the client already has and the
    id and creation time it already saw."""

    __slots__ = (
        "resume",
        "continued",
        "before",
        "shown_id",
        "created",
        "key",
        "restarts",
        "choices",
        "finished",
        "content_sent",
        "replayed",
    )

    def __init__(
        self,
        *,
        resume: bool,
        continued: bool,
        before: list[int],
        shown_id: str,
        created: int,
        key: str,
        restarts: bool = False,
        choices: list[list[Any]] | None = None,
        finished: frozenset[int] = frozenset(),
    ) -> None:
        self.resume, self.continued, self.before = resume, continued, before
        self.shown_id, self.created, self.key = shown_id, created, key
        self.restarts = restarts  # a forced tool call: nothing but its opening reaches the client before its end
        # n > 1 continued: [index, token ids] of each choice still to run, and the choices already ended
        self.choices, self.finished = choices, finished
        # tool_choice "auto" continued: characters of each choice's text the client has as content, by
        # index, and (from the engine) the text of each choice's continued tokens, replayed into its
        # tool parser
        self.content_sent: dict[int, int] | None = None
        self.replayed: dict[int, str] = {}

    @property
    def sent(self) -> int:
        """Tokens the client already has from other units, every choice's."""
        return len(self.before) + sum(len(t) for _, t in self.choices or ())

    @classmethod
    def of(
        cls,
        request: web.Request,
        body: Any,
        req: ParsedRequest,
        *,
        resumes: bool,
        rid: str,
        arrival: float,
        resumes_choices: bool = False,
    ) -> StreamMove:
        """Read the router's internal header and field (a client's copies never reach a leader: the
        router strips the headers, and the field counts only with the header)."""
        # Moves need one choice, and either each token's text in one event on an engine that continues
        # from tokens, or a forced tool call: it goes out whole at its end, so its client has nothing but
        # the opening until then and it moves by starting again from the prompt, on any engine (greedy
        # and seeded sampling draw the same tokens again; unseeded, the client never saw the first draw).
        restarts = req.choices == 1 and bool(getattr(req, "forced_tools", False))
        # n > 1 moves when the engine continues each choice from its own tokens.
        one = req.choices == 1 or resumes_choices
        mode = getattr(req, "tool_mode", None)
        # tool_choice "auto": the held text's tokens are reported too, and replayed into the next unit's
        # tool parser with how much of the text the client has as content (n > 1: each choice's).
        movable = restarts or (resumes and one and mode in (None, "none", "auto"))
        resume = movable and request.headers.get(contract.RESUME_HEADER) == "1"
        if request.headers.get(contract.CONTINUATION_HEADER) != "1":
            return cls(
                resume=resume,
                continued=False,
                before=[],
                shown_id=rid,
                created=int(arrival),
                key=rid,
                restarts=restarts,
            )
        auto = getattr(req, "tool_mode", None) == "auto"
        try:
            cont = read_continuation(
                body.get(contract.CONTINUATION_FIELD) if isinstance(body, dict) else None,
                req.choices,
                content_sent=auto,
            )
        except ContinuationError as e:
            raise ApiError(400, str(e), param=contract.CONTINUATION_FIELD) from None
        if not (movable and req.stream):
            raise ApiError(
                400,
                "only a streamed request with no tool calls, on an engine that continues requests (n > 1: each "
                "choice), or with a forced tool call, can be continued",
                param=contract.CONTINUATION_FIELD,
            )
        if cont.choices is not None:  # n > 1: each choice continues from its own tokens
            if len(cont.finished) == req.choices:
                raise ApiError(400, "every choice of the continuation has ended: nothing is left to generate")
            tokens = {**cont.choices, 0: cont.token_ids}
            move = cls(
                resume=resume,
                continued=True,
                before=[],
                shown_id=cont.id,
                created=cont.created,
                key=rid,
                choices=[[i, tokens.get(i, [])] for i in range(req.choices) if i not in cont.finished],
                finished=cont.finished,
            )
        elif restarts and cont.token_ids:
            raise ApiError(
                400,
                "a forced tool call starts again from the prompt: its continuation carries no token ids",
                param=contract.CONTINUATION_FIELD,
            )
        else:
            move = cls(
                resume=resume,
                continued=True,
                before=cont.token_ids,
                shown_id=cont.id,
                created=cont.created,
                key=rid,
                restarts=restarts,
            )
        move.content_sent = cont.content_sent
        return move
