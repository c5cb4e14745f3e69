"""The multi-node follower loop (runtime/engines/neuron/worker.py) run for real against the stand-in
of the fork's vLLM (tests/neuron/standins/vllm_fork_0_7_2, NOT vLLM), both ranks launched from the
plan as the node launches them: start (joins the leader's gloo group, loads), steady state (one
execute_model per step the leader broadcasts), exit (the leader dies: exit 1; idle past the gloo
timeout: exit 1). Two processes on loopback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request

import pytest
from llama_shapes import LLAMA_3_8B
from standin_model import STANDIN_LAUNCHER, VLLM_FORK_0_7_2, make_checkpoint
from testnet import free_port

from runtime.engines.neuron import NeuronOptions, load_model_shape, plan_unit
from runtime.engines.neuron.engine import rank_argv


@pytest.fixture
def fork_unit(tmp_path):
    """start(**env) -> (leader, follower, url, log): a 2-node plan's ranks under the fork stand-in."""
    procs: list[subprocess.Popen] = []
    log = tmp_path / "standin.jsonl"

    def start(**extra: str):
        model = make_checkpoint(tmp_path / "model", LLAMA_3_8B)
        port = free_port()
        plan = plan_unit(
            leader_host="127.0.0.1",
            nodes=2,
            instance_type="trn1.32xlarge",
            model=load_model_shape(model),
            model_dir=str(model),
            options=NeuronOptions(seq_len=256, batch_size=4, engine_port=port),
            dist_port=free_port(),
        )
        base = {**os.environ, "PYTHONPATH": VLLM_FORK_0_7_2, "STANDIN_LOG": str(log), **extra}
        for rank in plan.ranks:
            argv, env = rank_argv(rank, base, STANDIN_LAUNCHER)
            procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 90
        while True:
            assert time.monotonic() < deadline, "the stand-in leader never listened"
            assert procs[0].poll() is None, procs[0].communicate()
            try:
                urllib.request.urlopen(url + "/health", timeout=1)
                break
            except OSError:
                time.sleep(0.2)
        return procs[0], procs[1], url, log

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.communicate()


def _entries(log, key):
    return [e for e in map(json.loads, log.read_text().splitlines()) if key in e]


def _json_lines(text):
    out = []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # vLLM's own log lines are text
    return out


def _generate(url, **body):
    req = urllib.request.Request(url + "/generate", data=json.dumps(body).encode())
    with urllib.request.urlopen(req, timeout=30) as r:
        return [json.loads(line) for line in r.read().decode().splitlines() if line]


def test_the_follower_joins_runs_every_broadcast_step_and_exits_1_when_the_leader_dies(fork_unit):
    leader, follower, url, log = fork_unit()
    # Start: the leader listens only once the follower joined its group and built its engine.
    (started,) = _entries(log, "follower")
    assert started["follower"] == 1 and started["override_neuron_config"]["start_rank_id"] == 32
    assert started["env"]["NEURON_RANK_ID"] == "1" and started["env"]["ENABLE_NEURON_MULTI_NODE"] == "true"
    # Steady state: one execute_model() per step, in the leader's order, whatever the request mix.
    lines = _generate(url, prompt="hello world", stream=True, max_tokens=3, temperature=0)
    assert [line["text"][0] for line in lines] == [
        "hello worldflotilla",
        "hello worldflotilla serves",
        "hello worldflotilla serves trainium",
    ]
    _generate(url, prompt="hello", stream=True, max_tokens=2, temperature=0)
    deadline = time.monotonic() + 10  # the follower logs a step after the leader answered it
    while len(_entries(log, "follower_step")) < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [e["follower_step"] for e in _entries(log, "follower_step")] == [1, 2, 3, 4, 5]
    assert follower.poll() is None
    # Exit: nothing tells the follower to stop; the leader's death makes its broadcast raise.
    leader.send_signal(signal.SIGKILL)
    assert follower.wait(timeout=30) == 1
    err = follower.stderr.read()
    assert "engine built, executing the leader's steps" in err
    # Its last word is one JSON log line with the reason, out before the os._exit that flushes nothing.
    (exit_line,) = [e for e in _json_lines(err) if e.get("event") == "neuron_follower_exit"]
    assert exit_line["rank"] == 1 and exit_line["code"] == 1 and exit_line["level"] == "error"
    assert exit_line["reason"].startswith("RuntimeError") and isinstance(exit_line["ts"], float)


def test_an_idle_follower_exits_when_the_gloo_timeout_passes_without_a_step(fork_unit):
    # The fork creates its group with torch's default timeout (30 min); the stand-in's knob shortens it.
    # This is why the leader's engine sends a one-token request while idle (engine.FORK_KEEPALIVE_S).
    leader, follower, url, log = fork_unit(STANDIN_GLOO_TIMEOUT_S="2")
    _generate(url, prompt="hello", stream=True, max_tokens=1, temperature=0)
    assert follower.wait(timeout=60) == 1
    (exit_line,) = [e for e in _json_lines(follower.stderr.read()) if e.get("event") == "neuron_follower_exit"]
    assert exit_line["reason"].startswith("RuntimeError")
    assert [e["follower_step"] for e in _entries(log, "follower_step")] == [1]


def test_the_forks_parser_rejects_the_v1_flags_the_old_plan_passed(tmp_path):
    # No --additional-config in the fork (its arg_utils.py has --override-neuron-config, :916-921):
    # the follower exits 2 before anything loads, as argparse does.
    model = make_checkpoint(tmp_path / "model", LLAMA_3_8B)
    env = {**os.environ, "PYTHONPATH": VLLM_FORK_0_7_2, "NEURON_RANK_ID": "1"}
    from runtime.engines.neuron.launch import WORKER_SCRIPT

    proc = subprocess.run(
        [STANDIN_LAUNCHER, WORKER_SCRIPT, f"--model={model}", "--additional-config", "{}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "unrecognized arguments: --additional-config" in proc.stderr


def test_a_token_prompt_breaks_the_forks_stream_so_the_leader_sends_text(fork_unit):
    _leader, _follower, url, _log = fork_unit()
    req = urllib.request.Request(
        url + "/generate", data=json.dumps({"prompt": {"prompt_token_ids": [2, 3]}, "stream": True}).encode()
    )
    with pytest.raises(Exception) as e:  # the 200 stream ends without its terminating chunk
        with urllib.request.urlopen(req, timeout=30) as r:
            r.read()
    assert "IncompleteRead" in type(e.value).__name__ or "IncompleteRead" in repr(e.value)
    # Unknown request keys go to SamplingParams(**request_dict), which refuses them: HTTP 500.
    bad = urllib.request.Request(url + "/generate", data=json.dumps({"prompt": "hi", "model": "x"}).encode())
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(bad, timeout=30)
    assert e.value.code == 500
