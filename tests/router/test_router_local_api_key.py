"""`make local API_KEY=...` (the router then requires that key): the official openai client works with
the key and raises AuthenticationError (401) with a wrong key or none, streamed and not; without
API_KEY local mode stays open."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import openai
import pytest
from localmode import LocalMode

import contract

pytestmark = pytest.mark.timeout(300)
KEY = "local-secret-for-tests"


def _ask(client: openai.OpenAI, *, stream: bool) -> str:
    if stream:
        chunks = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3, stream=True
        )
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    done = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    return done.choices[0].message.content or ""


def test_local_mode_with_an_api_key_serves_that_key_and_refuses_others_streamed_and_not(tmp_path, monkeypatch):
    monkeypatch.setenv(contract.ENV_API_KEY, KEY)
    local = LocalMode(tmp_path, "--nodes", "1", "--engine", "echo")
    try:
        local.wait_ready(timeout=180)
        assert any("API key required" in line for line in local.out)
        good = openai.OpenAI(base_url=f"{local.url}/v1", api_key=KEY, max_retries=0, timeout=30)
        for stream in (False, True):
            assert _ask(good, stream=stream)
            for wrong in ("not-the-key", KEY + "x"):
                client = openai.OpenAI(base_url=f"{local.url}/v1", api_key=wrong, max_retries=0, timeout=30)
                with pytest.raises(openai.AuthenticationError) as err:
                    _ask(client, stream=stream)
                assert err.value.status_code == 401
        # No key at all (the openai client refuses to send none, so a plain request): 401 in OpenAI's
        # error shape, streamed and not.
        for stream in (False, True):
            body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
            req = urllib.request.Request(
                f"{local.url}/v1/chat/completions",
                data=json.dumps(body).encode(),
                headers={"Content-Type": "application/json"},
            )
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(req, timeout=10)
            assert err.value.code == 401
            assert json.loads(err.value.read())["error"]["code"] == "missing_api_key"
        router_log = next(p for p in local.processes() if p["role"] == "router")["log"]
        assert KEY not in open(router_log).read()
        local.ctrl_c(local.processes())
    finally:
        local.kill()


def test_local_mode_without_an_api_key_stays_open(tmp_path, monkeypatch):
    monkeypatch.delenv(contract.ENV_API_KEY, raising=False)
    local = LocalMode(tmp_path, "--nodes", "1", "--engine", "echo")
    try:
        local.wait_ready(timeout=180)
        assert any("open: no API key" in line for line in local.out)
        client = openai.OpenAI(base_url=f"{local.url}/v1", api_key="anything", max_retries=0, timeout=30)
        assert _ask(client, stream=False)
        local.ctrl_c(local.processes())
    finally:
        local.kill()
