"""The OpenAI fields a neuron unit passes through to vLLM, spoken to by the official `openai` client,
against the STAND-IN vLLM server (tests/neuron/standins/vllm_0_13_0, not vLLM), which answers each field
as vLLM with the vllm-neuron plugin does. What the unit's vLLM would silently ignore (on-device
sampling; a multi-node unit under the NxD Inference loop) is a 400 before the engine sees the request."""

from __future__ import annotations

import json
import os
from pathlib import Path

import jsonschema
import openai
import pytest
from llama_shapes import LLAMA_3_8B
from standin_model import STANDIN_LAUNCHER, VLLM_0_13_0, byte_tokenizer, make_checkpoint, word_ids
from testnet import free_port

import contract
from runtime.engines.base import GenerationRequest, RequestRejected, SamplingParams, StructuredOutput
from runtime.engines.neuron.requests import check, chunk_events, completions_body, serves

S3_SITE = Path(__file__).resolve().parent / "s3_site"
MODEL_URI = "s3://flotilla-models/llama/v1"
# Enough of a chat template with a tool format to show the tools reach the prompt.
TEMPLATE = (
    "{% if tools %}{% for t in tools %}{{ t.function.name }} {% endfor %}{% endif %}"
    "{% for m in messages %}{{ m.content }} {% endfor %}"
)
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "price": {"type": "integer"}, "tags": {"type": "array"}},
    "required": ["name", "price", "tags"],
}
TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
    },
}
MSGS = [{"role": "user", "content": "hello flotilla"}]


# -- what each mode serves (pure) --------------------------------------------------------------------

DEVICE = serves(multi_node=False, sampling="device")
CPU = serves(multi_node=False, sampling="cpu")
MULTI = serves(multi_node=True, sampling="cpu")
JSON = StructuredOutput("json_object")


@pytest.mark.parametrize(
    "sp, param",
    [
        (SamplingParams(logprobs=0), "logprobs"),
        (SamplingParams(structured=JSON), "response_format"),
        (SamplingParams(presence_penalty=0.5), "presence_penalty"),
        (SamplingParams(frequency_penalty=-1.0), "frequency_penalty"),
    ],
)
def test_on_device_sampling_refuses_what_the_device_sampler_ignores(sp, param):
    with pytest.raises(RequestRejected) as e:
        check(sp, DEVICE)
    assert e.value.param == param and "FLOTILLA_NEURON_SAMPLING=cpu" in str(e.value)
    assert f"'{param}' is not served by the neuron engine in on-device sampling" in str(e.value)


def test_on_device_sampling_passes_n_stop_and_greedy_seeds():
    check(SamplingParams(n=3, temperature=0.5, stop=("x",), max_tokens=4), DEVICE)
    check(SamplingParams(seed=3, temperature=0.0), DEVICE)


def test_cpu_sampling_passes_n_logprobs_penalties_and_structured_output():
    check(
        SamplingParams(n=2, temperature=0.9, logprobs=20, presence_penalty=1, frequency_penalty=1, structured=JSON), CPU
    )


@pytest.mark.parametrize("mode", [DEVICE, CPU, MULTI], ids=["device", "cpu", "multi-node"])
def test_no_neuron_mode_serves_a_seed_above_temperature_zero(mode):
    # vllm-neuron 0.4.1 gives no request a generator, not even on the host sampler: vLLM would take the
    # seed and sample unseeded. At temperature 0 the seed changes nothing and is accepted.
    with pytest.raises(RequestRejected) as e:
        check(SamplingParams(temperature=0.7, seed=3), mode)
    assert e.value.param == "seed" and "neuron engine" in str(e.value) and "temperature 0" in str(e.value)
    assert "FLOTILLA_NEURON_SAMPLING" not in str(e.value)  # no setting brings seeds back
    check(SamplingParams(temperature=0.0, seed=3), mode)


def test_no_seed_is_sent_to_vllm():
    body = completions_body(GenerationRequest("r", (1, 2), SamplingParams(temperature=0.0, seed=3)), "llama")
    assert "seed" not in body


def test_greedy_n_and_more_than_twenty_logprobs_are_refused_as_vllm_would():
    with pytest.raises(RequestRejected, match="greedy") as e:
        check(SamplingParams(n=2, temperature=0.0), CPU)
    assert e.value.param == "n"
    with pytest.raises(RequestRejected, match="limit of 20"):
        check(SamplingParams(logprobs=21), CPU)


def test_n_with_a_temperature_below_vllms_greedy_threshold_passes():
    # vLLM raises any temperature in (0, 0.01) to 0.01 before its greedy test, so n > 1 is served.
    check(SamplingParams(n=2, temperature=1e-6), CPU)
    check(SamplingParams(n=2, temperature=1e-6), DEVICE)


def test_a_json_schema_without_a_schema_is_sent_as_any_json():
    # vLLM 0.13.0 would take a json_schema without "schema" as no constraint at all.
    sp = SamplingParams(structured=StructuredOutput("json_schema", schema=None))
    body = completions_body(GenerationRequest("r", (1, 2), sp), "llama")
    assert body["response_format"] == {"type": "json_schema", "json_schema": {"name": "response", "schema": {}}}


@pytest.mark.parametrize(
    "sp, param",
    [
        (SamplingParams(n=2, temperature=1.0), "n"),
        (SamplingParams(logprobs=1), "logprobs"),
        (SamplingParams(structured=JSON), "response_format"),
    ],
)
def test_a_multi_node_unit_refuses_the_openai_only_fields(sp, param):
    with pytest.raises(RequestRejected) as e:
        check(sp, MULTI)
    assert e.value.param == param and "NxD Inference loop" in str(e.value)


def test_stream_chunks_become_token_events_per_choice_with_logprob_ids_and_no_text():
    chunk = {
        "choices": [
            {
                "index": 1,
                "text": "[9]",
                "token_ids": [9],
                "finish_reason": None,
                "logprobs": {
                    "tokens": ["token_id:9"],
                    "token_logprobs": [-0.5],
                    "top_logprobs": [{"token_id:9": -0.5, "token_id:4": -0.7, "token_id:2": -3.0}],
                    "text_offset": [0],
                },
            },
            {"index": 0, "text": "", "token_ids": [], "finish_reason": "stop"},
        ]
    }
    (tok, fin) = chunk_events(chunk, logprobs_k=2)
    # vLLM's text is not used: the engine cuts the text from the ids itself.
    assert (tok.index, tok.token_id, tok.text, tok.logprob.logprob) == (1, 9, "", -0.5)
    assert tok.logprob.top == ((9, -0.5), (4, -0.7))  # the k best; the map may hold the sampled one extra
    assert (fin.index, fin.token_id, fin.finish_reason) == (0, -1, "stop")


def test_a_chunk_without_token_ids_is_an_error_not_text_to_guess_ids_from():
    with pytest.raises(ValueError, match="return_token_ids"):
        chunk_events({"choices": [{"index": 0, "text": "[9]", "finish_reason": None}]}, logprobs_k=None)


# -- the unit, through the official client -------------------------------------------------------------


@pytest.fixture
def unit_with(tmp_path, new_unit):
    """unit_with(sampling, template=..., **env) -> (a ready one-node neuron unit on the stand-in, its
    request log)."""

    def start(sampling: str, template: str = TEMPLATE, tokenizer: str = "words", **extra: str):
        src = make_checkpoint(
            tmp_path / f"published-{sampling}", LLAMA_3_8B, chat_template=template, tokenizer=tokenizer
        )
        log = tmp_path / f"standin-{sampling}.jsonl"
        env = {
            contract.ENV_MODEL_URI: MODEL_URI,
            contract.ENV_MODEL_NAME: "llama",
            "FLOTILLA_NEURON_SAMPLING": sampling,
            "FLOTILLA_NEURON_SEQ_LEN": "256",
            "FLOTILLA_NEURON_BATCH_SIZE": "4",
            "FLOTILLA_NEURON_MODEL_DIR": str(tmp_path / f"model-{sampling}"),
            "FLOTILLA_NEURON_COMPILED_DIR": str(tmp_path / f"compiled-{sampling}"),
            "FLOTILLA_NEURON_ENGINE_PORT": str(free_port()),
            "FLOTILLA_NEURON_LAUNCHER": STANDIN_LAUNCHER,
            "FLOTILLA_NEURON_SDK_VERSION": "2.31.1",
            "FLOTILLA_FORM_TIMEOUT_S": "90",
            "STANDIN_S3_SEED_DIR": str(src),
            "STANDIN_S3_SEED_URI": MODEL_URI,
            "STANDIN_LOG": str(log),
            "STANDIN_TOKEN_DELAY": "0",
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            **extra,
        }
        path = os.pathsep.join([str(S3_SITE), VLLM_0_13_0])  # the launched server imports the stand-in `vllm`
        unit = new_unit(name=f"unit-{sampling}", world_size=1, engine="neuron", PYTHONPATH=path, **env)
        return unit.start().wait_ready(timeout=90), log

    return start


def bodies(log: Path) -> list[dict]:
    return [json.loads(line)["body"] for line in log.read_text().splitlines() if '"body"' in line]


def client(unit) -> openai.OpenAI:
    return openai.OpenAI(base_url=unit.url, api_key="unused", max_retries=0, timeout=60)


def test_cpu_sampling_unit_passes_every_field_through(unit_with):
    unit, log = unit_with("cpu")
    c = client(unit)
    ids = word_ids("hello flotilla")

    # n + logprobs + penalties + stop + max_completion_tokens, not streamed
    r = c.chat.completions.create(
        model="llama",
        messages=MSGS,
        n=2,
        max_completion_tokens=3,
        temperature=0.8,
        presence_penalty=0.5,
        frequency_penalty=0.25,
        stop=["never"],
        logprobs=True,
        top_logprobs=2,
    )
    assert [ch.index for ch in r.choices] == [0, 1]
    # Choice 0 is ids 5-7 ("serves trainium units"); choice 1's ids 105-107 are outside the 8-word
    # vocabulary, so the leader's tokenizer gives them no text.
    assert [ch.message.content for ch in r.choices] == ["serves trainium units", ""]
    assert ids[-1] == 4
    assert r.usage.completion_tokens == 6  # both choices' tokens
    entry = r.choices[0].logprobs.content[0]
    assert entry.logprob == -0.25 and len(entry.top_logprobs) == 2
    sent = bodies(log)[-1]
    assert {k: sent[k] for k in ("n", "presence_penalty", "frequency_penalty", "max_tokens")} == {
        "n": 2,
        "presence_penalty": 0.5,
        "frequency_penalty": 0.25,
        "max_tokens": 3,
    }
    assert "stop" not in sent  # the leader cuts stop strings from the token ids itself
    assert sent["logprobs"] == 2 and sent["return_tokens_as_token_ids"] is True and "seed" not in sent
    # A seed above temperature 0 would be ignored by the plugin's host sampler too: refused, never sent.
    before = len(bodies(log))
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="llama", messages=MSGS, max_tokens=2, temperature=0.8, seed=4)
    assert e.value.body["param"] == "seed" and len(bodies(log)) == before

    # the same streamed
    chunks = list(
        c.chat.completions.create(
            model="llama",
            messages=MSGS,
            n=2,
            max_tokens=3,
            temperature=0.8,
            logprobs=True,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text: dict[int, str] = {}
    for ch in chunks:
        for choice in ch.choices:
            text[choice.index] = text.get(choice.index, "") + (choice.delta.content or "")
    assert text == {i: m.message.content for i, m in enumerate(r.choices)}
    assert chunks[-1].usage.completion_tokens == 6

    # completions logprobs, legacy shape
    comp = c.completions.create(model="llama", prompt="hello flotilla", max_tokens=2, logprobs=1, temperature=0)
    lp = comp.choices[0].logprobs
    assert lp.tokens == ["serves", "trainium"]  # ids 5, 6 through the leader's tokenizer, as vLLM renders them
    assert lp.token_logprobs == [-0.25, -0.25] and len(lp.text_offset) == 2


def test_cpu_sampling_unit_structured_output_and_forced_tool_calls(unit_with):
    unit, log = unit_with("cpu", tokenizer="bytes")  # the stand-in spells its JSON in the model's tokens
    c = client(unit)
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}
    for stream in (False, True):
        kw = {"model": "llama", "messages": MSGS, "max_tokens": 60, "response_format": fmt}
        if stream:
            text = "".join(
                ch.choices[0].delta.content or "" for ch in c.chat.completions.create(stream=True, **kw) if ch.choices
            )
        else:
            text = c.chat.completions.create(**kw).choices[0].message.content
        jsonschema.validate(json.loads(text), SCHEMA)
    assert bodies(log)[-1]["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "response", "schema": SCHEMA},
    }
    obj = c.completions.create(
        model="llama", prompt="hello", max_tokens=60, extra_body={"response_format": {"type": "json_object"}}
    )
    assert isinstance(json.loads(obj.choices[0].text), dict)

    named = c.chat.completions.create(
        model="llama",
        messages=MSGS,
        max_tokens=60,
        tools=[TOOL],
        tool_choice={"type": "function", "function": {"name": "search"}},
    )
    (call,) = named.choices[0].message.tool_calls
    assert call.function.name == "search" and json.loads(call.function.arguments) == {"query": "standin"}
    required = c.chat.completions.create(
        model="llama", messages=MSGS, max_tokens=60, tools=[TOOL], tool_choice="required"
    )
    assert required.choices[0].finish_reason == "tool_calls"
    assert [t.function.name for t in required.choices[0].message.tool_calls] == ["search"]
    # The tools were rendered into the prompt by the model's chat template.
    assert bodies(log)[-1]["prompt"][: len("search")] == byte_tokenizer().encode("search").ids


def test_on_device_sampling_unit_refuses_before_vllm_sees_the_request(unit_with):
    unit, log = unit_with("device")
    c = client(unit)
    before = len(bodies(log))
    for kw, param in (
        ({"logprobs": True}, "logprobs"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"tools": [TOOL], "tool_choice": "required"}, "response_format"),
        ({"seed": 1, "temperature": 0.5}, "seed"),
        ({"presence_penalty": 1.0}, "presence_penalty"),
    ):
        for stream in (False, True):
            with pytest.raises(openai.BadRequestError) as e:
                c.chat.completions.create(model="llama", messages=MSGS, max_tokens=2, stream=stream, **kw)
            assert e.value.body["param"] == param, kw
    assert len(bodies(log)) == before
    # n and stop are served on the device path: vLLM fans n out before sampling.
    r = c.chat.completions.create(model="llama", messages=MSGS, max_tokens=2, n=2, temperature=0.5, stop=["x"])
    assert len(r.choices) == 2 and r.usage.completion_tokens == 4
    # Tools without tool_choice mean "auto": this template teaches no tool-call format to read.
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="llama", messages=MSGS, max_tokens=2, tools=[TOOL])
    assert e.value.body["param"] == "tool_choice"
    # vLLM refuses n > 1 with greedy sampling; the unit says so up front.
    with pytest.raises(openai.BadRequestError, match="greedy"):
        c.chat.completions.create(model="llama", messages=MSGS, max_tokens=2, n=2, temperature=0)


HERMES_TEMPLATE = (
    "{% for t in tools %}<tool_call>{{ t.function.name }}</tool_call>{% endfor %}"
    "{% for m in messages %}{{ m.content }} {% endfor %}"
)


def test_auto_tool_calls_are_read_in_the_templates_format_even_on_device_sampling(unit_with):
    call = '<tool_call>{"name": "search", "arguments": {"query": "boots"}}</tool_call>'
    unit, log = unit_with("device", template=HERMES_TEMPLATE, tokenizer="bytes", STANDIN_TEXT="Looking." + call)
    c = client(unit)
    kw = {"model": "llama", "messages": MSGS, "max_tokens": 120, "tools": [TOOL]}  # tool_choice: "auto"
    r = c.chat.completions.create(**kw)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and msg.content == "Looking."
    assert [(t.function.name, json.loads(t.function.arguments)) for t in msg.tool_calls] == [
        ("search", {"query": "boots"})
    ]
    assert "response_format" not in bodies(log)[-1]  # no grammar needed: the model wrote the call
    chunks = [ch for chunk in c.chat.completions.create(stream=True, **kw) for ch in chunk.choices]
    assert "".join(ch.delta.content or "" for ch in chunks) == "Looking."  # the call's text never streams
    deltas = [d for ch in chunks for d in (ch.delta.tool_calls or [])]
    assert [(d.function.name, json.loads(d.function.arguments)) for d in deltas] == [("search", {"query": "boots"})]
    assert chunks[-1].finish_reason == "tool_calls"
