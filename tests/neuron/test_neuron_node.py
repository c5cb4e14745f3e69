"""`python -m runtime node` with FLOTILLA_ENGINE=neuron: settings, a one-node unit whose leader serves
our OpenAI API from the stand-in of the single-node image's vLLM 0.13.0 OpenAI server, and a two-node
unit on the stand-in of the multi-node image's V0 fork (tests/neuron/standins/, NOT vLLM), each
started through launch_spec under the test-only FLOTILLA_NEURON_LAUNCHER."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from llama_shapes import LLAMA_3_8B, SMOLLM2_135M
from standin_model import STANDIN_LAUNCHER, VLLM_0_13_0, VLLM_FORK_0_7_2, make_checkpoint, word_ids
from testnet import free_port

import contract
from runtime.node.settings import SettingsError, load_settings

S3_SITE = Path(__file__).resolve().parent / "s3_site"
MODEL_URI = "s3://flotilla-models/llama/v1"
STATIC = {contract.ENV_PEERS: "127.0.0.1:18000", contract.ENV_RANK: "0"}
NEURON = {**STATIC, contract.ENV_ENGINE: "neuron", contract.ENV_MODEL_URI: MODEL_URI}


def test_neuron_settings_come_from_the_environment_with_neuron_timeouts():
    s = load_settings(
        [],
        {
            **NEURON,
            contract.ENV_COMPILE_CACHE_URI: "s3://cache/prefix/",
            contract.ENV_INSTANCE_TYPE: "trn1n.32xlarge",
            "FLOTILLA_NEURON_SEQ_LEN": "8192",
            "FLOTILLA_NEURON_CP_DEGREE": "4",
            contract.ENV_MODEL_NAME: "llama",
        },
    )
    n = s.neuron
    assert (n.model_uri, n.compile_cache_uri, n.instance_type) == (MODEL_URI, "s3://cache/prefix/", "trn1n.32xlarge")
    assert (n.seq_len, n.batch_size, n.cp_degree, n.attention_dp_degree) == (8192, 8, 4, "auto")
    assert (n.engine_port, n.launcher) == (contract.NEURON_ENGINE_PORT, None)
    assert (s.form_timeout_s, s.live_budget_s, s.model_name) == (3600.0, 5400.0, "llama")
    assert load_settings(["--form-timeout", "60"], NEURON).form_timeout_s == 60.0
    assert load_settings([], STATIC).neuron is None and load_settings([], STATIC).form_timeout_s == 600.0


@pytest.mark.parametrize(
    "env, names",
    [
        ({contract.ENV_MODEL_URI: ""}, [contract.ENV_MODEL_URI, "required with engine=neuron", "artifacts publish"]),
        ({contract.ENV_MODEL_URI: "/models/llama"}, [contract.ENV_MODEL_URI, "not an S3 URI", "s3://bucket/prefix"]),
        ({contract.ENV_COMPILE_CACHE_URI: "s3://"}, [contract.ENV_COMPILE_CACHE_URI, "not an S3 URI"]),
        ({contract.ENV_INSTANCE_TYPE: "p4d.24xlarge"}, [contract.ENV_INSTANCE_TYPE, "trn1.32xlarge, trn1n.32xlarge"]),
        ({"FLOTILLA_NEURON_SEQ_LEN": "0"}, ["FLOTILLA_NEURON_SEQ_LEN", ">= 1"]),
        ({"FLOTILLA_NEURON_BATCH_SIZE": "eight"}, ["FLOTILLA_NEURON_BATCH_SIZE", "whole number"]),
        ({"FLOTILLA_NEURON_CP_DEGREE": "half"}, ["FLOTILLA_NEURON_CP_DEGREE", "or auto"]),
        ({"FLOTILLA_NEURON_ATTENTION_DP_DEGREE": "0"}, ["FLOTILLA_NEURON_ATTENTION_DP_DEGREE", "or auto"]),
        ({"FLOTILLA_NEURON_ENGINE_PORT": "18000"}, ["FLOTILLA_NEURON_ENGINE_PORT", "equals the HTTP port"]),
        ({"FLOTILLA_NEURON_MODEL_DIR": "model"}, ["FLOTILLA_NEURON_MODEL_DIR", "absolute path"]),
    ],
)
def test_bad_neuron_settings_name_the_setting_and_the_fix(env, names):
    with pytest.raises(SettingsError) as e:
        load_settings([], {**NEURON, **env})
    assert "\n" not in str(e.value)
    for name in names:
        assert name in str(e.value)


def test_neuron_settings_are_ignored_by_other_engines():
    assert load_settings([], {**STATIC, "FLOTILLA_NEURON_SEQ_LEN": "0"}).neuron is None


def _post(url: str, body: dict, timeout: float = 30.0):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=timeout)


@pytest.fixture
def neuron_unit(tmp_path, request, new_unit):
    """start(world_size=1, **env) -> (a started neuron unit, the stand-in's request log)."""
    src = make_checkpoint(tmp_path / "published", getattr(request, "param", LLAMA_3_8B))
    log = tmp_path / "standin.jsonl"
    env = {
        contract.ENV_MODEL_URI: MODEL_URI,
        contract.ENV_MODEL_NAME: "llama",
        "FLOTILLA_NEURON_SEQ_LEN": "256",
        "FLOTILLA_NEURON_BATCH_SIZE": "4",
        "FLOTILLA_NEURON_MODEL_DIR": str(tmp_path / "model"),
        "FLOTILLA_NEURON_COMPILED_DIR": str(tmp_path / "compiled"),
        "FLOTILLA_NEURON_ENGINE_PORT": str(free_port()),
        "FLOTILLA_NEURON_LAUNCHER": STANDIN_LAUNCHER,
        "FLOTILLA_NEURON_SDK_VERSION": "2.28.0",
        "FLOTILLA_FORM_TIMEOUT_S": "90",
        "STANDIN_S3_SEED_DIR": str(src),
        "STANDIN_S3_SEED_URI": MODEL_URI,
        "STANDIN_LOG": str(log),
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }

    def start(world_size: int = 1, **extra: str):
        # One node: the single-node image's vLLM; more: the fork's (contract/neuron.py).
        standin = VLLM_0_13_0 if world_size == 1 else VLLM_FORK_0_7_2
        path = os.pathsep.join([str(S3_SITE), standin])
        unit = new_unit(world_size=world_size, engine="neuron", PYTHONPATH=path, **{**env, **extra})
        return unit.start(), log

    return start


def _sse(resp) -> list:
    """Every `data:` payload of an SSE response, parsed; "[DONE]" kept as a string."""
    out = []
    for raw in resp:
        line = raw.decode().strip()
        if line.startswith("data:"):
            data = line[5:].strip()
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def test_leader_streams_the_standin_servers_tokens_through_our_openai_api(neuron_unit):
    unit, log = neuron_unit()
    unit.wait_ready(timeout=90)
    with _post(
        unit.url + "/completions",
        {"model": "llama", "prompt": "hello flotilla", "max_tokens": 3, "stream": True, "temperature": 0},
    ) as r:
        events = _sse(r)
    ids = word_ids("hello flotilla")
    expected = [f"[{ids[-1] + i}]" for i in (1, 2, 3)]
    assert events[-1] == "[DONE]"
    chunks = [e for e in events[:-1] if e["choices"]]
    assert [c["choices"][0]["text"] for c in chunks] == expected
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, "length"]
    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"].startswith("cmpl-")
    sent = [json.loads(line) for line in log.read_text().splitlines()]
    assert sent[-1]["body"]["prompt"] == ids and sent[-1]["body"]["model"] == "llama"
    # Token ids in, non-streamed out: usage counts the stand-in's tokens.
    with _post(unit.url + "/completions", {"model": "llama", "prompt": [2, 3], "max_tokens": 2}) as r:
        body = json.load(r)
    assert body["choices"][0]["text"] == "[4][5]" and body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {
        "prompt_tokens": 2,
        "completion_tokens": 2,
        "total_tokens": 4,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    # Our API checks the context length (FLOTILLA_NEURON_SEQ_LEN) before vLLM sees the request.
    with pytest.raises(urllib.error.HTTPError) as e:
        _post(unit.url + "/completions", {"model": "llama", "prompt": [2, 3], "max_tokens": 255})
    assert e.value.code == 400 and "256" in e.value.read().decode()


def test_standin_dying_mid_stream_errors_the_stream_and_the_unit_reforms(neuron_unit):
    unit, _log = neuron_unit(STANDIN_DIE_AFTER="2")
    unit.wait_ready(timeout=90)
    with _post(
        unit.url + "/completions", {"model": "llama", "prompt": [2, 3], "max_tokens": 50, "stream": True}, timeout=20
    ) as r:
        events = _sse(r)
    assert [e["choices"][0]["text"] for e in events if isinstance(e, dict) and e.get("choices")] == ["[4]", "[5]"]
    assert "[DONE]" not in events and "error" in events[-1]
    assert unit.leader.ready()[0] != 200  # not ready before the client could retry here
    # One fresh engine process (and stand-in) per formation: the unit serves again.
    unit.wait_ready(timeout=90)
    reform = unit.leader.log_events("unit_reform")
    assert reform and "vLLM" in json.dumps(reform[0]), unit.dump_logs()
    assert len(unit.leader.log_events("formation_offered")) == 2


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_two_node_unit_runs_the_forks_launch_and_reforms_when_the_follower_loop_dies(neuron_unit):
    # 2 x trn1.32xlarge: the multi-node image's fork, launched as its example does.
    unit, log = neuron_unit(world_size=2)
    unit.wait_ready(timeout=120)

    def entries(key):
        return [e for e in map(json.loads, log.read_text().splitlines()) if key in e]

    (worker,) = entries("follower")  # the real worker.py, against the fork stand-in
    assert worker["follower"] == 1
    assert worker["env"]["NEURON_RANK_ID"] == "1" and worker["env"]["WORLD_SIZE"] == "2"
    assert worker["env"]["MASTER_ADDR"] == "127.0.0.1" and worker["env"]["NEURON_LOCAL_TP"] == "32"
    assert worker["override_neuron_config"] == {
        "world_size": 64,
        "tp_degree": 32,
        "local_ranks_size": 32,
        "start_rank_id": 32,
    }
    assert worker["script"].endswith("runtime/engines/neuron/worker.py")
    (server,) = entries("server")
    assert server["override_neuron_config"]["start_rank_id"] == 0
    # Token ids in, text back: the leader sent the fork text and counted one token per step.
    with _post(unit.url + "/completions", {"model": "llama", "prompt": [2, 3], "max_tokens": 2}) as r:
        body = json.load(r)
    assert body["choices"][0]["text"] == "flotilla serves" and body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {
        "prompt_tokens": 2,
        "completion_tokens": 2,
        "total_tokens": 4,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    assert entries("body")[-1]["body"]["prompt"] == "hello world"
    # The follower logs a step after running it, which can be after the leader has answered.
    deadline = time.monotonic() + 10
    while len(entries("follower_step")) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    steps = [e["follower_step"] for e in entries("follower_step")]
    assert steps == list(range(1, len(steps) + 1)) and len(steps) >= 2  # the follower ran every step

    os.kill(worker["pid"], signal.SIGKILL)  # the follower's loop dies
    deadline = time.monotonic() + 30
    while unit.leader.ready()[0] == 200 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert unit.leader.ready()[0] != 200
    unit.wait_ready(timeout=120)
    assert len(entries("follower")) == 2 and len(entries("server")) == 2  # fresh processes per formation
    assert not _alive(server["pid"])  # the old formation's fork server is gone
    new_pids = [e["pid"] for e in entries("follower")[1:] + entries("server")[1:]]
    unit.stop()
    deadline = time.monotonic() + 15
    while any(_alive(p) for p in new_pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in new_pids)  # stopping the unit leaves no engine behind


@pytest.mark.parametrize("neuron_unit", [SMOLLM2_135M], indirect=True)
def test_a_node_with_an_impossible_layout_says_why_and_never_fetches_the_weights(neuron_unit, tmp_path):
    # SmolLM2's 9 attention heads cannot split over a trn1.32xlarge's 32 NeuronCores.
    unit, log = neuron_unit(FLOTILLA_MAX_RESTARTS="0")
    assert unit.leader.wait(timeout=60) == 1, unit.dump_logs()
    (broken,) = [e for e in unit.leader.log_events("unit_state") if e["new"] == "broken"]
    assert "refused before fetching weights" in broken["reason"] and "num_attention_heads=9" in broken["reason"]
    assert "raise --batch-size" in broken["reason"]  # the planner's fix, in the node's own flag names
    assert unit.leader.log_events("restart_budget_exhausted")
    assert unit.leader.log_events("node_listening")[0]["model"] == MODEL_URI
    assert not (tmp_path / "model" / "model.safetensors").exists() and not log.exists()
