"""Tool calls in a model's own output format (tool_choice "auto"): the format a chat template teaches,
the calls in a finished answer, and how much of a streamed answer is content so far. Expected values
follow vLLM's hermes and llama3_json parsers."""

from __future__ import annotations

import json

from runtime.node.tool_calls import HERMES, LLAMA3_JSON, parse, streamable, template_format


def test_the_template_names_the_format():
    assert template_format("{% for t in tools %}...<tool_call>{{ t }}</tool_call>{% endfor %}") == HERMES
    assert template_format('<|start_header_id|>ipython ... {"name": ..., "parameters": ...}') == LLAMA3_JSON
    assert template_format("{{ tools | tojson }}") is None


def test_hermes_calls_and_the_content_before_them():
    text = (
        'Let me look.<tool_call>\n{"name": "search", "arguments": {"q": "boots"}}\n</tool_call>'
        '<tool_call>{"name": "f", "arguments": {}}'  # the last one unclosed: read to the end, as vLLM does
    )
    content, calls = parse(HERMES, text)
    assert content == "Let me look."
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [("search", {"q": "boots"}), ("f", {})]


def test_hermes_without_a_call_or_with_a_broken_one_is_content():
    assert parse(HERMES, "just text") == ("just text", [])
    assert parse(HERMES, "<tool_call>{not json</tool_call>") == ("<tool_call>{not json</tool_call>", [])


def test_llama3_json_calls_separated_by_semicolons():
    content, calls = parse(
        LLAMA3_JSON, ' {"name": "a", "parameters": {"x": 1}}; {"name": "b", "arguments": {"y": "é"}}'
    )
    assert content is None
    assert [(c["name"], c["arguments"]) for c in calls] == [("a", '{"x": 1}'), ("b", '{"y": "é"}')]
    assert parse(LLAMA3_JSON, "The answer is {1}") == ("The answer is {1}", [])


def test_streaming_holds_back_what_may_become_a_call():
    assert streamable(HERMES, "Hello <tool") == len("Hello ")
    assert streamable(HERMES, "Hello <tool_call>{") == len("Hello ")
    assert streamable(HERMES, "Hello <b>") == len("Hello <b>")
    assert streamable(LLAMA3_JSON, "  ") == 0
    assert streamable(LLAMA3_JSON, ' {"name"') == 0
    assert streamable(LLAMA3_JSON, "Sure, ") == len("Sure, ")
