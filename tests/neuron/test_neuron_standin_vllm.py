"""The vLLM 0.13.0 stand-in itself, spoken to over HTTP: it must answer the fields the leader forwards
as vLLM 0.13.0 with vllm-neuron release-0.4.1 does (sources in the stand-in), or the engine tests that
run against it prove nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from llama_shapes import LLAMA_3_8B
from standin_model import VLLM_0_13_0, byte_tokenizer, make_checkpoint
from testnet import free_port


def _serve(extra: list[str], model: str = "m", **env: str):
    port = free_port()
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model]
    argv += ["--served-model-name", "llama", "--max-model-len", "256", "--max-num-seqs", "4"]
    argv += ["--no-enable-prefix-caching", "--num-gpu-blocks-override", "4", "--host", "127.0.0.1"]
    argv += ["--port", str(port), *extra]
    env = {**os.environ, "PYTHONPATH": VLLM_0_13_0, "STANDIN_TOKEN_DELAY": "0", **env}
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(url + "/health", timeout=1):
                return proc, url
        except (urllib.error.URLError, ConnectionError):
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"the stand-in did not start: {proc.stderr.read().decode()[-500:]}") from None
            time.sleep(0.1)


@pytest.fixture(scope="module", params=["device", "cpu"])
def server(request):
    extra = ["--additional-config", json.dumps({"override_neuron_config": {"on_device_sampling_config": None}})]
    proc, url = _serve(extra if request.param == "cpu" else [])
    yield request.param, url
    proc.terminate()
    proc.wait(timeout=10)


def post(url: str, **body) -> tuple[int, list[dict]]:
    """POST a streamed completion; (status, the data lines as JSON, [DONE] as {"done": True})."""
    body = {"model": "llama", "prompt": [3, 4], "stream": True, "max_tokens": 2, **body}
    req = urllib.request.Request(
        url + "/v1/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            text = r.read().decode()
            status = r.status
    except urllib.error.HTTPError as e:
        return e.code, [json.loads(e.read())]
    lines = [ln[5:].strip() for ln in text.splitlines() if ln.startswith("data:")]
    return status, [{"done": True} if ln == "[DONE]" else json.loads(ln) for ln in lines]


def test_n_choices_stream_one_choice_per_chunk(server):
    _, url = server
    status, chunks = post(url, n=2, temperature=0.5, return_token_ids=True)
    assert status == 200 and chunks[-1] == {"done": True}
    assert [[c["index"] for c in ch["choices"]] for ch in chunks[:-1]] == [[0], [1], [0], [1]]


def test_a_temperature_below_001_is_raised_to_it_so_n_is_not_greedy(server):
    _, url = server
    assert post(url, n=2, temperature=1e-6)[0] == 200
    status, (err,) = post(url, n=2, temperature=0)
    assert status == 400 and err["error"]["message"] == "n must be 1 when using greedy sampling, got 2."
    assert err["error"]["param"] is None  # vLLM 0.13.0 names no param in its errors


def test_logprobs_stream_on_the_host_and_fail_in_stream_on_the_device(server):
    mode, url = server
    status, chunks = post(url, logprobs=1, return_tokens_as_token_ids=True)
    assert status == 200 and chunks[-1] == {"done": True}
    if mode == "cpu":
        assert all(ch["choices"][0]["logprobs"]["tokens"][0].startswith("token_id:") for ch in chunks[:-1])
    else:
        assert chunks[:-1] == [
            {"error": {"message": "Did not output logprobs", "type": "BadRequestError", "param": None, "code": 400}}
        ]
    assert post(url, logprobs=21)[0] == 400


def test_a_json_schema_without_a_schema_constrains_nothing(server):
    mode, url = server
    fmt = {"type": "json_schema", "json_schema": {"name": "x"}}
    status, chunks = post(url, response_format=fmt, temperature=0.5)
    assert status == 200 and "".join(ch["choices"][0]["text"] for ch in chunks[:-1]) == "[5][6]"
    fmt["json_schema"]["schema"] = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    _, chunks = post(url, response_format=fmt, temperature=0.5, max_tokens=20)
    text = "".join(ch["choices"][0]["text"] for ch in chunks[:-1])
    # On the device the grammar is dropped: the plain tokens, one per step, up to max_tokens.
    assert text == ('{"a": 7}' if mode == "cpu" else "".join(f"[{t}]" for t in range(5, 25)))


def test_a_seed_is_accepted_and_changes_nothing(server):
    _, url = server
    assert post(url, seed=1, temperature=0.5) == post(url, seed=2, temperature=0.5)


def test_text_starts_afresh_after_the_prompt_and_holds_back_what_may_become_a_stop_string(tmp_path):
    """vLLM's detokenizer, as the stand-in models it: a token inside a UTF-8 character and the start of a
    possible stop string release no text until they resolve, so prompt + generated ids sent as a new
    prompt never get the held-back text; why the leader cuts the text from the ids itself."""
    model = make_checkpoint(tmp_path / "model", LLAMA_3_8B, tokenizer="bytes")
    proc, url = _serve([], model=str(model), STANDIN_TEXT="5 € STAY STOP")
    try:
        prompt = byte_tokenizer().encode("Prix ?").ids
        _, chunks = post(url, prompt=prompt, max_tokens=40, stop=["STOP"], temperature=0, return_token_ids=True)
        got = [(ch["choices"][0]["token_ids"], ch["choices"][0]["text"]) for ch in chunks[:-1]]
        texts = [t for _, t in got]
        # One token a byte. "€" is 3 of them (no text until the last), and while "STOP" may still match, the
        # last len("STOP") - 1 = 3 characters are held back; once it matches it is cut off.
        assert texts == ["", "", "", "", "", "5", " ", "€", " ", "S", "T", "A", "Y", " ", ""]
        assert chunks[-2]["choices"][0]["finish_reason"] == "stop" and "".join(texts) == "5 € STAY "
        ids = [i for ids, _ in got for i in ids]
        # Continued from the first 9 tokens ("5 € STA", of which the client has "5 € "): the rest comes
        # without the held "STA".
        _, rest = post(url, prompt=prompt + ids[:9], max_tokens=40, stop=["STOP"], temperature=0, return_token_ids=True)
        assert [i for ch in rest[:-1] for i in ch["choices"][0]["token_ids"]] == ids[9:]
        assert "".join(texts[:9]) + "".join(ch["choices"][0]["text"] for ch in rest[:-1]) == "5 € Y "
    finally:
        proc.terminate()
        proc.wait(timeout=10)
