"""The resumable stream's wire (contract.resume): the resume and move comments a leader writes and
the continuation a router sends read back as written; lines and bodies as peers of the revision
before wrote them still read; a body that is not a continuation is refused by name."""

from __future__ import annotations

import json

import pytest

import contract
from contract.resume import (
    Continuation,
    ContinuationError,
    ResumeNote,
    continuation_field,
    move_line,
    read_continuation,
    read_move,
    read_resume,
    resume_line,
)
from runtime.node.engine_protocol import Token
from runtime.node.stream_moves import resume_comment
from runtime.router.resume import StreamLedger

# Comment lines exactly as leaders wrote them before the format was declared in one module (the
# server joined them by hand): a one-choice token, a held token of a forced tool call, an opening
# with no token, and an n > 1 event that ends choice 1 with tool_choice "auto".
ONE = b': flotilla-resume {"t":[17]}\n'
HELD = b': flotilla-resume {"t":[],"h":1}\n'
OPENING = b': flotilla-resume {"t":[]}\n'
ENDS_CHOICE = b': flotilla-resume {"t":[23],"i":1,"f":1,"c":4}\n'
# Continuations as routers sent them: one of the revision before n > 1 and tool_choice "auto" (the
# three fields alone), one for n = 3, one for tool_choice "auto" with one choice.
OLD_BODY = {"id": "cmpl-a1", "created": 1700000000, "token_ids": [5, 6]}
MANY_BODY = {
    "id": "cmpl-a1",
    "created": 1700000000,
    "token_ids": [5, 6],
    "choices": [[2, [9]]],
    "finished": [1],
    "content_sent": [[0, 3], [2, 1]],
}
AUTO_BODY = {**OLD_BODY, "content_sent": 7}


def _token(token_id: int, *, index: int = 0, finish: str | None = None) -> Token:
    return Token(id="r1", token_id=token_id, text="x", index=index, finish_reason=finish)


def test_the_node_writes_each_event_comment_as_leaders_wrote_it_before():
    assert resume_comment(_token(17)) == ONE
    assert resume_comment(_token(17), held=True) == HELD
    assert resume_comment(None) == OPENING
    assert resume_comment(_token(23, index=1, finish="stop"), choices=3, content_sent=4) == ENDS_CHOICE
    assert resume_comment(_token(23, index=0), choices=3) == b': flotilla-resume {"t":[23],"i":0}\n'


def test_each_comment_reads_back_as_written():
    notes = [
        ResumeNote([17]),
        ResumeNote([], held=1),
        ResumeNote([23], choice_index=1, finished=True, content_sent=4),
        ResumeNote([1, 2], choice_index=0, content_sent=0),
    ]
    for note in notes:
        line = resume_line(note)
        assert line.endswith(b"\n") and line.startswith(contract.RESUME_COMMENT.encode())
        assert read_resume(line[:-1]) == note


def test_comments_of_the_earlier_leader_read_with_their_meaning():
    assert read_resume(ONE[:-1]) == ResumeNote([17])
    held = read_resume(HELD[:-1])
    assert (held.token_ids, held.held, held.choice) == ([], 1, 0)
    ends = read_resume(ENDS_CHOICE[:-1])
    assert (ends.token_ids, ends.choice, ends.finished, ends.content_sent) == ([23], 1, True, 4)


def test_a_comment_without_token_ids_is_refused():
    for bad in (b': flotilla-resume {"h":1}', b": flotilla-resume [1]", b': flotilla-resume {"t":7}'):
        with pytest.raises(ValueError):
            read_resume(bad)


def test_the_move_comment_carries_its_reason_and_an_empty_one_still_moves():
    line = move_line(contract.BUSY_CODE_QUEUE_TIMEOUT)
    assert line == (contract.MOVE_COMMENT + contract.BUSY_CODE_QUEUE_TIMEOUT + "\n").encode()
    assert read_move(line[:-1]) == contract.BUSY_CODE_QUEUE_TIMEOUT
    assert read_move(contract.MOVE_COMMENT.encode()) == "moved"


def test_the_ledger_builds_the_continuation_a_leader_reads_back():
    ledger = StreamLedger(completion_id="cmpl-a1", created=1700000000)
    events = [
        resume_line(ResumeNote([5], choice_index=0, content_sent=1)),
        resume_line(ResumeNote([9], choice_index=2, content_sent=1)),
        resume_line(ResumeNote([7], choice_index=1, finished=True, content_sent=0)),
        resume_line(ResumeNote([6], choice_index=0, content_sent=3)),
    ]
    out, moved = ledger.take(b"".join(e + b"data: {}\n\n" for e in events))
    assert moved is None and out == b"data: {}\n\n" * 4
    body = json.loads(ledger.continuation(b'{"prompt":"hi","n":3}') or b"{}")
    cont = read_continuation(body[contract.CONTINUATION_FIELD], 3, content_sent=True)
    assert cont == Continuation("cmpl-a1", 1700000000, [5, 6], {1: [7], 2: [9]}, frozenset({1}), {0: 3, 1: 0, 2: 1})


def test_a_continuation_reads_back_as_written():
    for cont, n in [
        (Continuation("cmpl-a1", 1700000000, [5, 6]), 1),
        (Continuation("cmpl-a1", 1700000000, [5, 6], content_sent={0: 7}), 1),
        (Continuation("cmpl-a1", 1700000000, [5, 6], {2: [9]}, frozenset({1}), {0: 3, 2: 1}), 3),
    ]:
        field = json.loads(json.dumps(continuation_field(cont)))
        assert read_continuation(field, n, content_sent=cont.content_sent is not None) == cont


def test_the_router_writes_the_fields_the_earlier_leader_reads():
    assert continuation_field(Continuation("cmpl-a1", 1700000000, [5, 6])) == OLD_BODY
    assert continuation_field(Continuation("cmpl-a1", 1700000000, [5, 6], content_sent={0: 7})) == AUTO_BODY
    many = Continuation("cmpl-a1", 1700000000, [5, 6], {2: [9]}, frozenset({1}), {0: 3, 2: 1})
    assert continuation_field(many) == MANY_BODY


def test_the_earlier_routers_continuation_reads_for_many_choices_and_auto_tools():
    cont = read_continuation(OLD_BODY, 3, content_sent=True)
    assert (cont.token_ids, cont.choices, cont.finished, cont.content_sent) == ([5, 6], {}, frozenset(), {0: 0})
    one = read_continuation(MANY_BODY, 1)  # a one-choice leader ignores what only n > 1 reads
    assert (one.choices, one.finished, one.content_sent) == (None, frozenset(), None)


@pytest.mark.parametrize(
    ("field", "n", "names"),
    [
        (None, 1, '"id": str, "created": int, "token_ids"'),
        ({**OLD_BODY, "id": "has space"}, 1, '"id": str'),
        ({**OLD_BODY, "created": "1"}, 1, '"created": int'),
        ({**OLD_BODY, "token_ids": [-1]}, 1, '"token_ids": [int, ...]'),
        ({**OLD_BODY, "choices": [[0, [1]]]}, 2, 'with n = 2 takes "choices": [[index 1..1'),
        ({**OLD_BODY, "finished": [3]}, 3, '"finished": [index, ...]'),
        ({**OLD_BODY, "content_sent": -1}, 1, "content_sent' must be the characters of content"),
        ({**OLD_BODY, "content_sent": [[5, 1]]}, 2, "[[index 0..1, int >= 0], ...]"),
    ],
)
def test_a_body_that_is_not_a_continuation_is_refused_naming_the_field(field, n, names):
    with pytest.raises(ContinuationError, match=contract.CONTINUATION_FIELD) as e:
        read_continuation(field, n, content_sent=True)
    assert names in str(e.value)
