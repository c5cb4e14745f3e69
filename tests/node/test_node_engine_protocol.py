"""The supervisor <-> engine process line protocol: every message comes back from its line as it was
sent, and a line that is not a message (unknown op, unknown or missing key) fails naming what is wrong,
instead of a request waiting on a field that never comes."""

from __future__ import annotations

import json
import typing

import pytest

from runtime.node.engine_protocol import (
    Accepted,
    Cancel,
    Command,
    Done,
    Error,
    Event,
    Failed,
    Following,
    Load,
    Progress,
    ProtocolError,
    Ready,
    Shutdown,
    Starting,
    Submit,
    Token,
    decode_command,
    decode_event,
    encode,
)

COMMANDS = [
    Submit(
        id="r1",
        correlation_id="client-1",
        max_tokens=None,
        default_max_tokens=16,
        temperature=0.7,
        top_p=0.9,
        seed=3,
        stop=["\n"],
        n=2,
        logprobs=2,
        messages=[{"role": "user", "content": "hi"}],
        tools=[{"type": "function", "function": {"name": "f"}}],
        tool_choice="auto",
        generated=[5, 6],
        resumed_choices=[[1, [7, 8]]],
    ),
    Submit(id="r2", correlation_id="", max_tokens=4, default_max_tokens=16, temperature=0, top_p=1, prompt_ids=[1]),
    Cancel(id="r1"),
    Shutdown(reason="draining"),
]
EVENTS = [
    Starting(),
    Progress(phase="fetch_model", done_bytes=10, total_bytes=20, phase_s=1.5),
    Ready(model_name="m", max_context=2048, strategies={"prefill": "pipeline"}, resumes=True),
    Load(state="ready", running=2, max_running=8, kv_cache_used=0.25, prefix_cache_hits=3),
    Following(commands=7),
    Failed(message="no model"),
    Accepted(id="r1", prompt_tokens=12, replayed_text="abc"),
    Token(
        id="r1",
        token_id=42,
        text=" x",
        finish_reason="stop",
        index=1,
        logprobs={"token": " x", "logprob": -0.1, "top": []},
    ),
    Token(id="r1", token_id=-1, text="", tool_parser="hermes"),
    Done(id="r1", cached_tokens=8),
    Error(id="r1", kind="rejected", message="too long", param="max_tokens"),
]


@pytest.mark.parametrize("msg", COMMANDS, ids=lambda m: type(m).__name__)
def test_a_command_comes_back_from_its_line_as_sent(msg):
    line = encode(msg)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert decode_command(line) == msg


def test_every_message_of_the_protocol_is_tried_here():
    assert {type(m) for m in COMMANDS} == set(typing.get_args(Command))
    assert {type(m) for m in EVENTS} == set(typing.get_args(Event))


@pytest.mark.parametrize("msg", EVENTS, ids=lambda m: type(m).__name__)
def test_an_event_comes_back_from_its_line_as_sent(msg):
    assert decode_event(encode(msg)) == msg


def test_the_two_directions_do_not_take_each_others_messages():
    with pytest.raises(ProtocolError, match="token"):
        decode_command(encode(Token(id="r", token_id=1, text="a")))
    with pytest.raises(ProtocolError, match="submit"):
        decode_event(encode(COMMANDS[1]))


@pytest.mark.parametrize(
    "line, named",
    [
        ({"op": "tokn", "id": "r", "token_id": 1, "text": "a"}, "tokn"),
        ({"op": "token", "id": "r", "token_id": 1, "text": "a", "finish": "stop"}, "finish"),
        ({"op": "token", "id": "r", "text": "a"}, "token_id"),
        ({"id": "r"}, "op"),
    ],
    ids=["unknown op", "unknown key", "missing key", "no op"],
)
def test_a_line_that_is_not_a_message_fails_naming_what_is_wrong(line, named):
    with pytest.raises(ProtocolError, match=named):
        decode_event(json.dumps(line))


def test_a_line_that_is_not_json_fails():
    with pytest.raises(ProtocolError):
        decode_event(b"Traceback (most recent call last):\n")


def test_every_field_the_api_sends_down_is_a_field_of_the_submit_message():
    from runtime.node.protocol import parse_chat, parse_completion  # noqa: PLC0415

    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    chat = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi"}],
        "n": 2,
        "seed": 1,
        "stop": ["x"],
        "logprobs": True,
        "top_logprobs": 2,
        "presence_penalty": 0.5,
        "frequency_penalty": 0.5,
        "tools": [tool],
        "tool_choice": "auto",
    }
    completion = {"model": "tiny", "prompt": [1, 2], "logprobs": 1, "response_format": {"type": "json_object"}}
    for payload in (
        parse_chat(chat, served_model="tiny", max_tokens_limit=64).engine_payload(default_max_tokens=8),
        parse_completion(completion, served_model="tiny", max_tokens_limit=64).engine_payload(default_max_tokens=8),
    ):
        sent = Submit(id="r", correlation_id="c", **payload)
        assert decode_command(encode(sent)) == sent
