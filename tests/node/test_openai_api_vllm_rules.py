"""The chat request rules the leader shares with vLLM 0.13.0 (the version the neuron image serves):
what a forced tool call's schema and a conversation's earlier tool calls become before they reach a unit."""

from __future__ import annotations

import json

import pytest

from runtime.engines.base import GenerationRequest, SamplingParams, StructuredOutput
from runtime.engines.neuron.requests import completions_body
from runtime.node.protocol import ApiError, parse_chat

ITEM = {"type": "object", "properties": {"sku": {"type": "string"}}, "required": ["sku"]}
ORDER = {  # parameters as pydantic writes them: shared definitions under "$defs", used by "$ref"
    "type": "object",
    "$defs": {"Item": ITEM},
    "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/Item"}}},
    "required": ["items"],
}


def tool(name: str, parameters: dict) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


def chat(**kw) -> dict:
    return {"model": "tiny", "messages": [{"role": "user", "content": "order boots"}], "max_tokens": 8, **kw}


def parse(body: dict):
    return parse_chat(body, served_model="tiny", max_tokens_limit=64)


def required_schema(tools: list[dict]) -> dict:
    payload = parse(chat(tools=tools, tool_choice="required")).engine_payload(default_max_tokens=8)
    assert payload["structured"]["kind"] == "json_schema"
    return json.loads(payload["structured"]["schema"])


def test_required_tool_calls_keep_their_refs_resolvable_from_the_schema_root():
    schema = required_schema([tool("order", ORDER), tool("cancel", {"type": "object", "$defs": {"Item": ITEM}})])
    # "#/$defs/Item" resolves from the root of the list-of-calls document, as vLLM builds it.
    assert schema["$defs"] == {"Item": ITEM}
    params = [alt["properties"]["parameters"] for alt in schema["items"]["anyOf"]]
    assert all("$defs" not in p for p in params)
    assert params[0]["properties"]["items"]["items"] == {"$ref": "#/$defs/Item"}

    llguidance = pytest.importorskip("llguidance")
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults={"whitespace_flexible": False})
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    assert not is_error and not [m for m in messages if "does not exist" in m], messages


def test_the_neuron_unit_gets_the_lifted_definitions_in_its_response_format():
    schema = required_schema([tool("order", ORDER)])
    sp = SamplingParams(max_tokens=8, structured=StructuredOutput(kind="json_schema", schema=json.dumps(schema)))
    body = completions_body(GenerationRequest("r1", (1, 2), sp), "tiny")
    sent = body["response_format"]["json_schema"]["schema"]
    assert sent["$defs"] == {"Item": ITEM}
    assert "$defs" not in sent["items"]["anyOf"][0]["properties"]["parameters"]


def test_the_tools_the_template_sees_keep_their_own_definitions():
    payload = parse(chat(tools=[tool("order", ORDER)], tool_choice="required")).engine_payload(default_max_tokens=8)
    assert payload["tools"][0]["function"]["parameters"] == ORDER


def test_two_tools_defining_one_name_differently_are_refused_naming_tools():
    other = {"type": "object", "$defs": {"Item": {"type": "integer"}}}
    with pytest.raises(ApiError) as exc:
        parse(chat(tools=[tool("order", ORDER), tool("count", other)], tool_choice="required"))
    assert exc.value.status == 400 and exc.value.param == "tools"
    assert "Item" in exc.value.message and "rename" in exc.value.message
    # Only "required" merges the tools into one schema: a named call uses its own parameters whole.
    named = parse(chat(tools=[tool("order", ORDER), tool("count", other)], tool_choice={"function": {"name": "order"}}))
    assert json.loads(named.engine_payload(default_max_tokens=8)["structured"]["schema"]) == ORDER


def test_an_earlier_call_with_empty_arguments_reaches_the_template_as_an_empty_object():
    messages = [
        {"role": "user", "content": "what time is it"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "now", "arguments": ""}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "12:00"},
    ]
    payload = parse(chat(messages=messages)).engine_payload(default_max_tokens=8)
    assert payload["messages"][1]["tool_calls"][0]["function"]["arguments"] == {}


def test_a_request_that_leaves_the_sampling_fields_out_gets_openais_defaults_in_its_engine_payload():
    """OpenAI's API reference, "Create completion": max_tokens defaults to 16, temperature to 1,
    top_p to 1. The payload carries each one: the engine process has no defaults of its own."""
    from runtime.node.protocol import DEFAULT_MAX_TOKENS, parse_completion  # noqa: PLC0415

    body = {"model": "tiny", "prompt": "hi"}
    payload = parse_completion(body, served_model="tiny", max_tokens_limit=64).engine_payload(
        default_max_tokens=DEFAULT_MAX_TOKENS["completion"]
    )
    assert (payload["max_tokens"], payload["default_max_tokens"]) == (None, 16)
    assert (payload["temperature"], payload["top_p"]) == (1.0, 1.0)
    nulls = {**body, "temperature": None, "top_p": None}
    payload = parse_completion(nulls, served_model="tiny", max_tokens_limit=64).engine_payload(default_max_tokens=16)
    assert (payload["temperature"], payload["top_p"]) == (1.0, 1.0)
