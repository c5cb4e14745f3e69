"""OpenAI compatibility of the leader API on the reference engine, spoken to by the official `openai`
client: n, logprobs (chat and completions shapes), penalties, seed, stop, max_completion_tokens,
response_format (json_object, json_schema) and forced tool calls, each streamed and not, with usage
counting every choice's tokens."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jsonschema
import openai
import pytest

import contract

MSGS = [{"role": "user", "content": "describe a product"}]
# Bounded on purpose: a random-weights model under a grammar fills strings to their limit, so every
# document ends well inside max_tokens and "valid JSON" is a property of the mask, not of luck.
PRODUCT = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "category": {"enum": ["shoes", "books", "toys"]},
        "price": {"type": "integer", "minimum": 0, "maximum": 9999},
        "in_stock": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3},
    },
    "required": ["name", "category", "price", "in_stock", "tags"],
    "additionalProperties": False,
}
SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "product", "schema": PRODUCT}}


def client(unit) -> openai.OpenAI:
    return openai.OpenAI(base_url=unit.url, api_key="unused", max_retries=0, timeout=120)


def stream_chat(c: openai.OpenAI, **kw) -> tuple[dict[int, str], dict[int, str], list, object]:
    """(text per choice, finish per choice, logprob entries per choice, usage) of a streamed chat."""
    text: dict[int, str] = {}
    finish: dict[int, str] = {}
    logprobs: dict[int, list] = {}
    usage = None
    for chunk in c.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw):
        if chunk.usage is not None:
            usage = chunk.usage
        for ch in chunk.choices:
            text[ch.index] = text.get(ch.index, "") + (ch.delta.content or "")
            if ch.finish_reason:
                finish[ch.index] = ch.finish_reason
            if ch.logprobs is not None and ch.logprobs.content:
                logprobs.setdefault(ch.index, []).extend(ch.logprobs.content)
    return text, finish, logprobs, usage


# -- n -----------------------------------------------------------------------------------------------


def test_n_seeded_choices_differ_and_usage_counts_all_of_them(shared_unit):
    c = client(shared_unit)
    r = c.chat.completions.create(model="tiny", messages=MSGS, n=3, max_tokens=6, temperature=1.0, seed=11)
    assert [ch.index for ch in r.choices] == [0, 1, 2]
    assert len({ch.message.content for ch in r.choices}) > 1  # seed + index per choice, as vLLM seeds them
    assert all(ch.finish_reason == "length" for ch in r.choices)
    assert r.usage.completion_tokens == 3 * 6
    assert r.usage.total_tokens == r.usage.prompt_tokens + 18
    again = c.chat.completions.create(model="tiny", messages=MSGS, n=3, max_tokens=6, temperature=1.0, seed=11)
    assert [ch.message.content for ch in again.choices] == [ch.message.content for ch in r.choices]


def test_n_greedy_choices_are_the_single_greedy_completion(shared_unit):
    # Every choice continues from a copy of one prefill: identical to the lone request in every layout.
    c = client(shared_unit)
    one = c.completions.create(model="tiny", prompt="shared prefill", max_tokens=8, temperature=0)
    many = c.completions.create(model="tiny", prompt="shared prefill", max_tokens=8, temperature=0, n=4)
    assert [ch.text for ch in many.choices] == [one.choices[0].text] * 4
    assert many.usage.completion_tokens == 4 * one.usage.completion_tokens


def test_n_streamed_interleaves_choices_and_counts_every_token(shared_unit):
    text, finish, _, usage = stream_chat(
        client(shared_unit), model="tiny", messages=MSGS, n=2, max_tokens=5, temperature=0.8, seed=3
    )
    assert sorted(text) == [0, 1] and finish == {0: "length", 1: "length"}
    assert usage.completion_tokens == 10


def test_n_above_what_the_unit_runs_at_once_is_a_400(shared_unit):
    with pytest.raises(openai.BadRequestError) as e:
        client(shared_unit).chat.completions.create(model="tiny", messages=MSGS, n=100, max_tokens=2)
    assert "n 100" in e.value.message


# -- logprobs ---------------------------------------------------------------------------------------


def test_chat_logprobs_have_openais_shape(shared_unit):
    r = client(shared_unit).chat.completions.create(
        model="tiny", messages=MSGS, max_tokens=5, temperature=0, logprobs=True, top_logprobs=3
    )
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == 5
    for entry in content:
        assert entry.logprob <= 0 and entry.bytes == list(entry.token.encode("utf-8", errors="replace"))
        assert len(entry.top_logprobs) == 3
        values = [t.logprob for t in entry.top_logprobs]
        assert values == sorted(values, reverse=True)
        assert entry.logprob == values[0]  # greedy takes the most likely token


def test_chat_logprobs_without_top_logprobs_and_streamed(shared_unit):
    _, _, logprobs, usage = stream_chat(
        client(shared_unit), model="tiny", messages=MSGS, max_tokens=4, temperature=0, logprobs=True
    )
    assert len(logprobs[0]) == usage.completion_tokens == 4
    assert all(e.top_logprobs == [] for e in logprobs[0])


def test_completion_logprobs_have_the_legacy_shape_with_offsets(shared_unit):
    c = client(shared_unit)
    r = c.completions.create(model="tiny", prompt="abc", max_tokens=5, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 5
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(5)]
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert top[token] == value and 1 <= len(top) <= 3  # top 2 plus the sampled token
    streamed = list(
        c.completions.create(model="tiny", prompt="abc", max_tokens=5, temperature=0, logprobs=2, stream=True)
    )
    tokens = [t for ch in streamed for c_ in ch.choices if c_.logprobs for t in c_.logprobs.tokens]
    offsets = [o for ch in streamed for c_ in ch.choices if c_.logprobs for o in c_.logprobs.text_offset]
    assert tokens == lp.tokens and offsets == lp.text_offset


def test_top_logprobs_needs_logprobs_and_stays_within_twenty(shared_unit):
    c = client(shared_unit)
    for kw, param in (({"top_logprobs": 2}, "top_logprobs"), ({"logprobs": True, "top_logprobs": 21}, "top_logprobs")):
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(model="tiny", messages=MSGS, max_tokens=2, **kw)
        assert e.value.body["param"] == param


# -- penalties, seed, stop, max_completion_tokens -------------------------------------------------------


def test_penalties_change_sampling_and_seed_makes_it_repeatable(shared_unit):
    c = client(shared_unit)
    greedy = {"model": "tiny", "prompt": "aaaa", "max_tokens": 24, "temperature": 0}
    penalties = {"presence_penalty": 2.0, "frequency_penalty": 2.0}
    plain = c.completions.create(**greedy).choices[0].text
    # Greedy `tiny` repeats a token within 24; a penalised run must take another one there.
    assert c.completions.create(**greedy, **penalties).choices[0].text != plain
    seeded = {**greedy, "temperature": 1.0, "seed": 5, **penalties}
    assert c.completions.create(**seeded).choices[0].text == c.completions.create(**seeded).choices[0].text


def test_stop_and_max_completion_tokens_apply_to_every_choice(shared_unit):
    c = client(shared_unit)
    full = c.chat.completions.create(model="tiny", messages=MSGS, max_completion_tokens=12, temperature=0)
    assert full.usage.completion_tokens == 12
    text = full.choices[0].message.content
    stop = next(ch for ch in text[3:] if ch.isprintable() and ch.strip())
    cut = c.chat.completions.create(
        model="tiny", messages=MSGS, max_completion_tokens=12, temperature=0, stop=[stop], n=2
    )
    assert [ch.message.content for ch in cut.choices] == [text[: text.index(stop)]] * 2
    assert [ch.finish_reason for ch in cut.choices] == ["stop", "stop"]


# -- structured output ---------------------------------------------------------------------------------


def test_json_schema_output_validates_for_every_seeded_prompt(shared_unit):
    c = client(shared_unit)

    def one(i: int) -> tuple[str, str]:
        r = c.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": f"product {i}: " + "x" * i}],
            max_tokens=200,
            temperature=1.0,
            seed=i,
            response_format=SCHEMA_FORMAT,
        )
        return r.choices[0].message.content, r.choices[0].finish_reason

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(one, range(32)))
    for text, finish in results:
        assert finish == "stop", text
        jsonschema.validate(json.loads(text), PRODUCT)


def test_json_object_streamed_and_not_is_one_json_object(shared_unit):
    c = client(shared_unit)
    fmt = {"type": "json_object"}
    # Greedy: "any object" has no length bound, and sampled random weights may write one string forever.
    r = c.chat.completions.create(model="tiny", messages=MSGS, max_tokens=300, temperature=0, response_format=fmt)
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(r.choices[0].message.content), dict)
    text, finish, _, _ = stream_chat(c, model="tiny", messages=MSGS, max_tokens=300, temperature=0, response_format=fmt)
    assert text[0] == r.choices[0].message.content and finish[0] == "stop"


def test_json_schema_on_completions_with_n(shared_unit):
    r = client(shared_unit).completions.create(
        model="tiny",
        prompt="{",
        max_tokens=200,
        temperature=1.0,
        seed=9,
        n=3,
        extra_body={"response_format": SCHEMA_FORMAT},
    )
    for ch in r.choices:
        jsonschema.validate(json.loads(ch.text), PRODUCT)


def test_a_schema_the_grammar_cannot_use_is_a_400(shared_unit):
    bad = {
        "type": "json_schema",
        "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}},
    }
    with pytest.raises(openai.BadRequestError):
        client(shared_unit).chat.completions.create(model="tiny", messages=MSGS, max_tokens=4, response_format=bad)


# -- tools -------------------------------------------------------------------------------------------

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 10},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string", "maxLength": 10}},
            "required": ["query"],
            "additionalProperties": False,
        },
    },
}


def test_tools_on_a_model_whose_template_has_no_tool_format_are_a_400(shared_unit):
    with pytest.raises(openai.BadRequestError) as e:
        client(shared_unit).chat.completions.create(
            model="tiny", messages=MSGS, max_tokens=4, tools=[WEATHER], tool_choice="required"
        )
    assert e.value.body["param"] == "tools" and "chat template has no tool format" in e.value.message


def test_tools_without_tool_choice_mean_auto_and_need_a_tool_format_too(shared_unit):
    with pytest.raises(openai.BadRequestError) as e:
        client(shared_unit).chat.completions.create(model="tiny", messages=MSGS, max_tokens=4, tools=[WEATHER])
    assert e.value.body["param"] == "tools"


# A tool-capable chat template in the format of Hermes-style models (the tools listed in the system
# turn, calls inside <tool_call> tags): enough to prove the tools reach the template.
TOOL_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nYou may call these tools:\n{% for t in tools %}{{ t.function.name }}: "
    "{{ t.function.parameters | tojson }}\n{% endfor %}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>"
    "{{ c.function | tojson }}</tool_call>{% endfor %}{% else %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _tool_model(smollm2_dir: str | Path, root: Path) -> Path:
    """SmolLM2 with a chat template that teaches Hermes-style tool calls."""
    model = root / "smollm2-tools"
    model.mkdir()
    for f in Path(smollm2_dir).iterdir():
        if f.name not in ("tokenizer_config.json", "chat_template.jinja"):
            (model / f.name).symlink_to(f)
    config = json.loads((Path(smollm2_dir) / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TOOL_TEMPLATE}))
    return model


@pytest.fixture(scope="module")
def tool_unit(smollm2_dir, tmp_path_factory):
    from nodeproc import Unit

    root = tmp_path_factory.mktemp("tool-model")
    model = _tool_model(smollm2_dir, root)
    unit = Unit(root, world_size=1, model=str(model), FLOTILLA_MODEL_NAME="smol-tools")
    try:
        yield unit.start().wait_ready(timeout=180)
    finally:
        unit.stop()


def test_a_named_tool_call_has_json_arguments_for_that_function(tool_unit):
    r = client(tool_unit).chat.completions.create(
        model="smol-tools",
        messages=[{"role": "user", "content": "weather in Paris?"}],
        max_tokens=60,
        tools=[WEATHER, SEARCH],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    msg = r.choices[0].message
    assert msg.content is None and r.choices[0].finish_reason == "stop"  # OpenAI: "stop" for a named call
    (call,) = msg.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])


# A forced call to one of two tools. One call: a greedy 135M model otherwise repeats the same call
# until max_tokens.
REQUIRED_CALL = {
    "model": "smol-tools",
    "messages": [{"role": "user", "content": "find shoes"}],
    "max_tokens": 120,
    "tools": [WEATHER, SEARCH],
    "tool_choice": "required",
    "temperature": 0,
    "parallel_tool_calls": False,
}


def test_required_tool_calls_streamed_and_not_and_a_follow_up_turn(tool_unit):
    c = client(tool_unit)
    kw = dict(REQUIRED_CALL)
    r = c.chat.completions.create(**kw)
    assert r.choices[0].finish_reason == "tool_calls"
    calls = r.choices[0].message.tool_calls
    assert calls and all(t.function.name in ("get_weather", "search") for t in calls)
    streamed = [ch for chunk in c.chat.completions.create(stream=True, **kw) for ch in chunk.choices]
    deltas = [d for ch in streamed for d in (ch.delta.tool_calls or [])]
    assert [(d.function.name, d.function.arguments) for d in deltas] == [
        (t.function.name, t.function.arguments) for t in calls
    ]
    assert streamed[-1].finish_reason == "tool_calls"
    # The call and its result go back in the next turn, rendered by the template.
    follow = c.chat.completions.create(
        model="smol-tools",
        messages=[
            *kw["messages"],
            {"role": "assistant", "content": None, "tool_calls": [t.model_dump() for t in calls]},
            {"role": "tool", "tool_call_id": calls[0].id, "content": "no shoes found"},
        ],
        max_tokens=4,
        tools=[WEATHER, SEARCH],
        tool_choice="none",
        temperature=0,  # greedy: a sampled answer may end (EOS) before its 4 tokens
    )
    assert follow.choices[0].message.tool_calls is None and follow.usage.completion_tokens == 4


def test_auto_on_a_hermes_template_answers_with_content_or_calls(tool_unit):
    c = client(tool_unit)
    kw = {"model": "smol-tools", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "tools": [WEATHER]}
    r = c.chat.completions.create(temperature=0, **kw)
    msg = r.choices[0].message
    assert (msg.tool_calls is None) == (r.choices[0].finish_reason != "tool_calls")
    streamed = "".join(
        ch.choices[0].delta.content or ""
        for ch in c.chat.completions.create(stream=True, temperature=0, **kw)
        if ch.choices
    )
    assert streamed == (msg.content or "")


def test_the_tools_reach_the_prompt(tool_unit):
    c = client(tool_unit)
    plain = c.chat.completions.create(model="smol-tools", messages=MSGS, max_tokens=1)
    with_tools = c.chat.completions.create(
        model="smol-tools", messages=MSGS, max_tokens=1, tools=[WEATHER], tool_choice="none"
    )
    assert with_tools.usage.prompt_tokens > plain.usage.prompt_tokens + 10


@pytest.fixture(scope="module")
def smollm2_dir():
    from runtime.models.smollm2 import ensure_smollm2

    return ensure_smollm2()


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_every_field_at_once_streams_the_same_choices_as_the_whole_response(shared_unit, endpoint):
    c = client(shared_unit)
    common = {
        "model": "tiny",
        "n": 2,
        "temperature": 0.9,
        "seed": 21,
        "presence_penalty": 0.5,
        "frequency_penalty": 0.5,
        "stop": ["\n\n\n"],
    }
    if endpoint == "chat":
        kw = {**common, "messages": MSGS, "max_completion_tokens": 200, "response_format": SCHEMA_FORMAT}
        whole = c.chat.completions.create(logprobs=True, top_logprobs=1, **kw)
        text, finish, logprobs, usage = stream_chat(c, logprobs=True, top_logprobs=1, **kw)
        assert text == {ch.index: ch.message.content for ch in whole.choices}
        assert {i: [e.token for e in v] for i, v in logprobs.items()} == {
            ch.index: [e.token for e in ch.logprobs.content] for ch in whole.choices
        }
    else:
        kw = {
            **common,
            "prompt": "p",
            "max_tokens": 200,
            "logprobs": 1,
            "extra_body": {"response_format": SCHEMA_FORMAT},
        }
        whole = c.completions.create(**kw)
        text, finish, usage = {}, {}, None
        for chunk in c.completions.create(stream=True, stream_options={"include_usage": True}, **kw):
            usage = chunk.usage or usage
            for ch in chunk.choices:
                text[ch.index] = text.get(ch.index, "") + ch.text
                if ch.finish_reason:
                    finish[ch.index] = ch.finish_reason
        assert text == {ch.index: ch.text for ch in whole.choices}
    assert finish == {ch.index: ch.finish_reason for ch in whole.choices}
    assert usage.completion_tokens == whole.usage.completion_tokens
    assert usage.prompt_tokens == whole.usage.prompt_tokens
    for t in text.values():
        jsonschema.validate(json.loads(t), PRODUCT)


def _sse_lines(url: str, body: dict, headers: dict) -> list[str]:
    """Every non-empty line of a streamed answer, the SSE comment lines included."""
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json", **headers}
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        return [line for raw in r if (line := raw.decode().rstrip("\r\n"))]


def _data(lines: list[str]) -> list[dict]:
    return [json.loads(line[len("data: ") :]) for line in lines if line.startswith("data: {")]


def test_a_forced_tool_call_stream_moves_by_starting_again_from_the_prompt(tool_unit):
    """Its client has nothing but the opening until the call goes out whole, so a move (what the
    router sends another unit: the continuation header and field, no token ids) starts it again
    from the prompt: the same greedy call, under the id the client saw, without a second opening."""
    url = tool_unit.url + "/chat/completions"
    body = {**REQUIRED_CALL, "stream": True, "stream_options": {"include_usage": True}}
    first = _sse_lines(url, body, {contract.RESUME_HEADER: "1"})
    said = [json.loads(x[len(contract.RESUME_COMMENT) :]) for x in first if x.startswith(contract.RESUME_COMMENT)]
    usage = _data(first)[-1]["usage"]
    # Movable: reported, but no token counts as sent; each one still says the stream makes progress.
    assert said and all(s["t"] == [] for s in said)
    assert sum(s.get("h", 0) for s in said) == usage["completion_tokens"]

    cont = {"id": "chatcmpl-first-unit", "created": 1700000000, "token_ids": []}
    again = _sse_lines(url, {**body, contract.CONTINUATION_FIELD: cont}, {contract.CONTINUATION_HEADER: "1"})
    assert again[-1] == "data: [DONE]"
    events, before = _data(again), _data(first)
    assert {e["id"] for e in events} == {cont["id"]} and {e["created"] for e in events} == {cont["created"]}
    assert not any(c["delta"].get("role") for e in events for c in e["choices"])  # the client had the opening

    def calls(evs: list[dict]) -> list[tuple[str, str]]:
        return [
            (t["function"]["name"], t["function"]["arguments"])
            for e in evs
            for c in e["choices"]
            for t in c["delta"].get("tool_calls") or []
        ]

    assert calls(events) and calls(events) == calls(before)
    # The same token counts; the cached prompt tokens are the second run's own (the first run left
    # the prompt's blocks in the unit's prefix cache).
    again_usage = events[-1]["usage"]
    assert {k: again_usage[k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")} == {
        k: usage[k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")
    }

    # A forced call's continuation never carries tokens: there is nothing of it the client has.
    with pytest.raises(urllib.error.HTTPError) as e:
        _sse_lines(
            url, {**body, contract.CONTINUATION_FIELD: {**cont, "token_ids": [1]}}, {contract.CONTINUATION_HEADER: "1"}
        )
    assert e.value.code == 400


FEW_SHOT = [
    {"role": "user", "content": "weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    {"role": "assistant", "content": "It is sunny in Paris."},
    {"role": "user", "content": "weather in Rome?"},
]


def _auto_tool_stream(messages: list[dict], **extra) -> dict:
    """A streamed greedy chat request of up to 60 tokens the model may answer with the weather tool
    (tool_choice "auto"); `extra` adds or overrides fields (n, sampling)."""
    return {
        "model": "smol-tools",
        "messages": messages,
        "max_tokens": 60,
        "tools": [WEATHER],
        "tool_choice": "auto",
        "temperature": 0,
        "stream": True,
        **extra,
    }


@pytest.mark.parametrize("prompt", ["fewshot", "hi"])
def test_an_auto_tool_choice_stream_moved_mid_answer_ends_as_the_unmoved_one(tool_unit, prompt):
    """tool_choice "auto": every token is reported with how much of the text the client has as
    content; a continuation (what the router sends after a cut) replays the held text into the new
    tool parser, so the client's content and tool calls equal the unmoved stream's."""
    url = tool_unit.url + "/chat/completions"
    body = _auto_tool_stream(FEW_SHOT if prompt == "fewshot" else [{"role": "user", "content": prompt}])
    first = _sse_lines(url, body, {contract.RESUME_HEADER: "1"})
    marks = [k for k, line in enumerate(first) if line.startswith(contract.RESUME_COMMENT)]
    said = [json.loads(first[k][len(contract.RESUME_COMMENT) :]) for k in marks]
    tokens = [t for s in said for t in s["t"]]
    assert len(tokens) >= 6 and all("c" in s for s in said[1:])
    cut = len(said) // 2  # the first unit dies after this many resume lines reached the router
    seen = first[: marks[cut]]  # what the client got before the cut
    cont = {
        "id": "chatcmpl-first-unit",
        "created": 1700000000,
        "token_ids": [t for s in said[:cut] for t in s["t"]],
        "content_sent": said[cut - 1]["c"],
    }
    again = _sse_lines(url, {**body, contract.CONTINUATION_FIELD: cont}, {contract.CONTINUATION_HEADER: "1"})
    assert again[-1] == "data: [DONE]"

    def view(evs: list[dict]) -> tuple[str, list, list]:
        content = "".join(c["delta"].get("content") or "" for e in evs for c in e["choices"])
        calls = [
            (t["function"]["name"], t["function"]["arguments"])
            for e in evs
            for c in e["choices"]
            for t in c["delta"].get("tool_calls") or []
        ]
        finishes = [c["finish_reason"] for e in evs for c in e["choices"] if c.get("finish_reason")]
        return content, calls, finishes

    if prompt == "fewshot":  # the cut falls inside a held tool call: the case the replay is for
        assert view(_data(first))[1] and said[cut - 1]["c"] == 0
    assert view(_data(seen) + _data(again)) == view(_data(first))


def _sse_events(url: str, body: dict, headers: dict) -> list[bytes]:
    """A streamed answer's SSE events as a router reads them (comment lines included, no separators)."""
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json", **headers}
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        return [e for e in r.read().split(b"\n\n") if e]


def _per_choice(events: list[dict]) -> dict[int, tuple[str, list, list]]:
    """What a client made of each choice: its content, its tool calls, its finish reasons."""
    out: dict[int, tuple[str, list, list]] = {}
    for e in events:
        for c in e.get("choices", []):
            content, calls, finishes = out.setdefault(c["index"], ("", [], []))
            calls += [(t["function"]["name"], t["function"]["arguments"]) for t in c["delta"].get("tool_calls") or []]
            if c.get("finish_reason"):
                finishes.append(c["finish_reason"])
            out[c["index"]] = (content + (c["delta"].get("content") or ""), calls, finishes)
    return out


@pytest.mark.parametrize(
    ("prompt", "sampling"),
    [("fewshot", {}), ("hi", {}), ("hi", {"temperature": 0.9, "seed": 11})],
    ids=["fewshot-greedy", "hi-greedy", "hi-seeded"],
)
def test_an_auto_tool_choice_stream_of_two_choices_moved_mid_answer_ends_as_the_unmoved_one(
    tool_unit, prompt, sampling
):
    """tool_choice "auto" with n = 2: every resume line names its choice and how much of that
    choice's text the client has as content; the router's ledger carries both per choice, and the
    continuation replays each choice's held text into its own tool parser, so the client ends with
    each choice's content and tool calls as the unmoved stream's (greedy; seeded, where the two
    choices differ, so each choice's count must be its own)."""
    from runtime.router.resume import StreamLedger

    url = tool_unit.url + "/chat/completions"
    body = _auto_tool_stream(
        FEW_SHOT if prompt == "fewshot" else [{"role": "user", "content": prompt}], n=2, **sampling
    )
    first = _sse_events(url, body, {contract.RESUME_HEADER: "1"})
    marked = [k for k, e in enumerate(first) if e.startswith(contract.RESUME_COMMENT.encode())]
    said = [json.loads(first[k].split(b"\n", 1)[0][len(contract.RESUME_COMMENT) :]) for k in marked]
    assert {s.get("i") for s in said if s["t"]} == {0, 1} and all("c" in s for s in said if s["t"])
    # An odd cut: the choices are at different points (one token apart) when the first unit dies.
    cut = len(marked) // 2 | 1
    ledger = StreamLedger(completion_id="chatcmpl-first-unit", created=1700000000)
    seen, moved = ledger.take(b"".join(e + b"\n\n" for e in first[: marked[cut]]))
    assert moved is None and not ledger.done
    continued = json.loads(ledger.continuation(json.dumps(body).encode()))
    cont = continued[contract.CONTINUATION_FIELD]
    assert isinstance(cont["content_sent"], list) and len(cont["choices"]) == 1  # per choice, as sent

    again = _sse_events(url, continued, {contract.CONTINUATION_HEADER: "1"})
    assert again[-1] == b"data: [DONE]"

    def data(raw: bytes) -> list[dict]:  # the events' data lines (a resume comment opens some events)
        return [json.loads(line[len(b"data: ") :]) for line in raw.split(b"\n") if line.startswith(b"data: {")]

    whole = _per_choice(data(b"\n\n".join(first)))
    if sampling:  # the two choices went different ways
        assert whole[0] != whole[1]
    if prompt == "fewshot":  # the cut falls inside a held tool call: the case the replay is for
        assert all(whole[i][1] for i in (0, 1)) and {c for _, c in cont["content_sent"]} == {0}
    assert _per_choice(data(seen) + data(b"\n\n".join(again))) == whole

    # A count for a choice the request does not have is refused, naming the field.
    bad = {**continued, contract.CONTINUATION_FIELD: {**cont, "content_sent": [[2, 0]]}}
    with pytest.raises(urllib.error.HTTPError) as e:
        _sse_events(url, bad, {contract.CONTINUATION_HEADER: "1"})
    assert e.value.code == 400 and b"content_sent" in e.value.read()


@pytest.mark.whole_machine  # two SmolLM2 units computing at once: up to 2.15x its time alone beside another worker
def test_an_auto_tool_choice_stream_of_two_choices_whose_unit_is_killed_ends_as_the_unmoved_one(smollm2_dir, tmp_path):
    """The same through a real router: two units, the leader serving an n = 2 auto stream is killed
    mid-answer, and the client ends with each choice's content and tool calls as the unmoved stream's
    (greedy)."""
    import subprocess
    import time

    from nodeproc import Unit, get_json

    from runtime.router.settings import router_command

    model = _tool_model(smollm2_dir, tmp_path)
    units = [
        Unit(tmp_path, name=f"tools-{k}", world_size=1, model=str(model), FLOTILLA_MODEL_NAME="smol-tools")
        for k in range(2)
    ]
    repo = Path(__file__).resolve().parents[2]
    router: subprocess.Popen | None = None
    body = _auto_tool_stream(FEW_SHOT, n=2)

    def run(base: str) -> tuple[list[dict], str]:
        req = urllib.request.Request(
            base + "/v1/chat/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=300) as r:
            lines = [raw.decode().rstrip("\r\n") for raw in r]
            events = [json.loads(x[len("data: ") :]) for x in lines if x.startswith("data: {")]
            return events, r.headers[contract.UNIT_HEADER]

    def kill_at_its_first_token() -> Unit:
        """The unit serving the stream, killed once it has produced tokens (nothing left to prefill):
        the client has no more than the opening then, the tool call being held. The leader counts a
        prompt out of prefill_tokens at its first token, as it writes that token to the router: killed
        at that very poll, the token could still be in flight, and the router would move the stream
        from no token at all (the race this test once lost under load). So the kill waits for three
        more polls of the same leader, each served by the event loop that wrote the token, with the
        request still in flight: the router holds tokens by then, and the answer (60 tokens of two
        choices) is far from over."""
        deadline = time.monotonic() + 120
        prefilling: set[str] = set()
        decoding: dict[str, int] = {}
        while time.monotonic() < deadline:
            for u in units:
                load = get_json(u.leader.url + "/health/ready")[1]["load"]
                if load["prefill_tokens"] > 0:
                    prefilling.add(u.name)
                elif u.name in prefilling and load["in_flight"] == 1:
                    decoding[u.name] = decoding.get(u.name, 0) + 1
                    if decoding[u.name] > 3:
                        u.leader.sigkill()
                        return u
            time.sleep(0.01)
        raise AssertionError("no unit took the stream")

    try:
        for u in units:
            u.start()
        for u in units:
            u.wait_ready(180)
        log = open(tmp_path / "router.log", "ab")
        router = subprocess.Popen(
            # No drain grace: stopping it at the end would otherwise wait out the grace (no ALB watches it).
            router_command(
                host="127.0.0.1",
                port=0,
                metrics_port=0,
                units=[u.leader.url for u in units],
                poll_interval_s=0.2,
                drain_grace_s=0,
            ),
            cwd=repo,
            stdout=subprocess.PIPE,
            stderr=log,
            env={**__import__("os").environ, "PYTHONPATH": str(repo)},
        )
        log.close()
        assert router.stdout is not None
        base = router.stdout.readline().decode().split()[-1]
        deadline = time.monotonic() + 60
        while get_json(base + contract.ROUTER_HEALTH_PATH)[1].get("routable_units") != 2:
            assert time.monotonic() < deadline, "the router never saw both units"
            time.sleep(0.1)
        whole, _ = run(base)
        with ThreadPoolExecutor(1) as pool:
            moving = pool.submit(run, base)
            killed = kill_at_its_first_token()
            got, _ = moving.result(timeout=300)
        assert not [e for e in got if "error" in e], got[-1]
        assert _per_choice(got) == _per_choice(whole) and all(_per_choice(whole)[i][1] for i in (0, 1))
        other = next(u for u in units if u is not killed)
        moved = other.continued_requests(wait_s=30)
        assert len(moved) == 1 and moved[0]["continued_from"] >= 1, moved  # went on from the dead unit's tokens
    finally:
        if router is not None:
            router.terminate()
            router.wait(timeout=30)
            if router.stdout:
                router.stdout.close()
        for u in units:
            u.stop()
