"""The router's ledger of a resumable stream: it strips the leader's internal comment lines, keeps the
token ids of every event its client got, and builds the continuation body for the next unit."""

from __future__ import annotations

import json

import contract
from runtime.router.resume import StreamLedger, resumable_request


def _resume(ids: list[int]) -> bytes:
    return (contract.RESUME_COMMENT + json.dumps({"t": ids})).encode() + b"\n"


def test_resume_lines_are_stripped_and_their_token_ids_kept_in_order():
    ledger = StreamLedger(completion_id="cmpl-1", created=7)
    data = (
        _resume([])
        + b"\n"  # the leader's opening: this stream can move
        + b'data: {"opening":1}\n\n'
        + _resume([11])
        + b'data: {"t":"a"}\n\n'
        + _resume([12])
        + b'data: {"t":"b"}\n\n'
    )
    out, moved = ledger.take(data)
    assert out == b'data: {"opening":1}\n\ndata: {"t":"a"}\n\ndata: {"t":"b"}\n\n'
    assert moved is None and ledger.reported and ledger.token_ids == [11, 12] and not ledger.done
    assert b"flotilla" not in out


def test_a_move_line_drops_its_event_and_names_the_reason():
    ledger = StreamLedger(completion_id="cmpl-1", created=7)
    data = (
        _resume([5])
        + b'data: {"t":"a"}\n\n'
        + (contract.MOVE_COMMENT + "broken\n").encode()
        + b'data: {"error":{}}\n\n'
    )
    out, moved = ledger.take(data)
    assert out == b'data: {"t":"a"}\n\n' and moved == "broken" and ledger.token_ids == [5]
    assert not ledger.done  # the handed-over error is not an ending: the stream goes on elsewhere


def test_done_or_an_error_event_ends_the_stream_for_good():
    for last in (b"data: [DONE]\n\n", b'data: {"error":{"code":"deadline_exceeded"}}\n\n'):
        ledger = StreamLedger(completion_id="cmpl-1", created=7)
        ledger.take(_resume([1]) + b'data: {"t":"a"}\n\n')
        ledger.take(last)
        assert ledger.done


def test_the_continuation_carries_the_body_the_ids_and_what_the_client_saw():
    ledger = StreamLedger(completion_id="cmpl-9", created=1234)
    ledger.take(_resume([3]) + b"data: {}\n\n" + _resume([4]) + b"data: {}\n\n")
    body = json.loads(ledger.continuation(b'{"model":"tiny","prompt":"hi","stream":true}'))
    assert body["prompt"] == "hi" and body["stream"] is True
    assert body[contract.CONTINUATION_FIELD] == {"id": "cmpl-9", "created": 1234, "token_ids": [3, 4]}
    assert ledger.continuation(b"[1, 2]") is None and ledger.continuation(b"not json") is None


def test_only_plain_bodies_of_the_generation_endpoints_are_resumable():
    assert resumable_request("POST", "/v1/chat/completions", {})
    assert resumable_request("POST", "/v1/completions", {"Content-Encoding": "identity"})
    assert not resumable_request("POST", "/v1/completions", {"Content-Encoding": "gzip"})
    assert not resumable_request("GET", "/v1/models", {})


def test_held_tokens_count_as_progress_but_not_as_sent():
    """A forced tool call's tokens reach the client only at its end: the stall bound counts them, the
    continuation does not carry them (the call starts again from the prompt)."""
    ledger = StreamLedger(completion_id="cmpl-1", created=7)
    held = (contract.RESUME_COMMENT + json.dumps({"t": [], "h": 1})).encode() + b"\n\n"
    out, moved = ledger.take(_resume([]) + b"\n" + b'data: {"opening":1}\n\n' + held + held)
    assert out == b'data: {"opening":1}\n\n' and moved is None
    assert ledger.since_move == 2 and ledger.token_ids == []
    assert json.loads(ledger.continuation(b'{"model":"m"}'))[contract.CONTINUATION_FIELD]["token_ids"] == []


def test_each_choice_keeps_its_own_ids_and_the_continuation_names_the_ended_ones():
    def said(ids: list[int], i: int, f: bool = False) -> bytes:
        body = {"t": ids, "i": i, **({"f": 1} if f else {})}
        return (contract.RESUME_COMMENT + json.dumps(body)).encode() + b"\n" + b"data: {}\n\n"

    ledger = StreamLedger(completion_id="cmpl-9", created=1234)
    ledger.take(said([3], 0) + said([7], 1) + said([4], 0) + said([8], 2) + said([9], 1, f=True))
    assert ledger.sent == 5
    body = json.loads(ledger.continuation(b'{"prompt":"hi","n":3,"stream":true}'))
    assert body[contract.CONTINUATION_FIELD] == {
        "id": "cmpl-9",
        "created": 1234,
        "token_ids": [3, 4],
        "choices": [[1, [7, 9]], [2, [8]]],
        "finished": [1],
    }


def test_an_auto_tool_choice_stream_carries_how_much_content_its_client_has():
    def said(ids: list[int], c: int) -> bytes:
        return (contract.RESUME_COMMENT + json.dumps({"t": ids, "c": c})).encode() + b"\n" + b"data: {}\n\n"

    ledger = StreamLedger(completion_id="chatcmpl-1", created=5)
    ledger.take(said([3], 2) + said([4], 2) + said([5], 2))  # the last two tokens' text is held
    body = json.loads(ledger.continuation(b'{"messages":[],"stream":true}'))
    assert body[contract.CONTINUATION_FIELD] == {
        "id": "chatcmpl-1",
        "created": 5,
        "token_ids": [3, 4, 5],
        "content_sent": 2,
    }


def test_an_auto_tool_choice_stream_of_two_choices_carries_each_choices_content():
    def said(i: int, ids: list[int], c: int) -> bytes:
        line = json.dumps({"t": ids, "i": i, "c": c})
        return (contract.RESUME_COMMENT + line).encode() + b"\n" + b"data: {}\n\n"

    ledger = StreamLedger(completion_id="chatcmpl-2", created=5)
    ledger.take(said(0, [3], 1) + said(1, [7], 2) + said(0, [4], 1))  # choice 0's second token is held
    body = json.loads(ledger.continuation(b'{"messages":[],"n":2,"stream":true}'))
    assert body[contract.CONTINUATION_FIELD] == {
        "id": "chatcmpl-2",
        "created": 5,
        "token_ids": [3, 4],
        "choices": [[1, [7]]],
        "finished": [],
        "content_sent": [[0, 1], [1, 2]],
    }
