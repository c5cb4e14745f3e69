"""`python -m runtime node` with FLOTILLA_ENGINE=neuron: settings, a one-node unit whose leader serves
our OpenAI API from the stand-in of the single-node image's vLLM 0.13.0 OpenAI server, and a two-node
unit whose nodes run the leader/follower loop on the stand-in of NxD Inference (tests/neuron/standins/,
NOT vLLM or NxD Inference), each started through launch_spec under the test-only FLOTILLA_NEURON_LAUNCHER."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest
from leftovers import started_here
from llama_shapes import LLAMA_3_8B, LLAMA_31_405B, SMOLLM2_135M
from nxdi_standin import SHAPE
from spmd_harness import unsplit_greedy
from standin_model import NXDI_2_28, STANDIN_LAUNCHER, VLLM_0_13_0, WORDS, make_checkpoint, word_ids
from testnet import free_port

import contract
from contract import node_exit
from runtime.models.tokenizers import HFTokenizer
from runtime.node.settings import SettingsError, load_settings

HERE = Path(__file__).resolve().parent
S3_SITE = HERE / "s3_site"
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
        (
            {"FLOTILLA_NEURON_SEQ_LEN": "0"},
            ["FLOTILLA_NEURON_SEQ_LEN", "is out of range: give an integer of at least 1"],
        ),
        (
            {"FLOTILLA_NEURON_BATCH_SIZE": "eight"},
            ["FLOTILLA_NEURON_BATCH_SIZE", "is not an integer: give an integer of at least 1"],
        ),
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
        # One node: the single-node image's vLLM; more: NxD Inference under our loop (contract/neuron.py).
        if world_size == 1:
            path = os.pathsep.join([str(S3_SITE), VLLM_0_13_0])
        else:
            path = os.pathsep.join([str(S3_SITE), NXDI_2_28, str(HERE), str(HERE.parents[1])])
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
    expected = ["serves", " trainium", " units"]  # ids 5, 6, 7, cut by the leader with the model's tokenizer
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
    assert body["choices"][0]["text"] == "flotilla serves" and body["choices"][0]["finish_reason"] == "length"
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


def test_a_unit_with_prefix_caching_passes_vllms_cached_tokens_and_hit_rate_through(neuron_unit):
    unit, log = neuron_unit(FLOTILLA_NEURON_PREFIX_CACHING_BLOCK="16")
    unit.wait_ready(timeout=90)
    prompt = [3, 4, 5, 6, 7, 2] * 7  # 42 ids of the test model's 8: two full blocks of 16 before the last
    usages = []
    for _ in range(2):
        with _post(unit.url + "/completions", {"model": "llama", "prompt": prompt, "max_tokens": 2}) as r:
            usages.append(json.load(r)["usage"])
    assert [u["prompt_tokens_details"] for u in usages] == [{"cached_tokens": 0}, {"cached_tokens": 32}]
    stream = {"model": "llama", "prompt": prompt, "max_tokens": 2, "stream": True}
    with _post(unit.url + "/completions", {**stream, "stream_options": {"include_usage": True}}) as r:
        events = _sse(r)
    assert events[-2]["usage"]["prompt_tokens_details"] == {"cached_tokens": 32}
    argv = json.loads(log.read_text().splitlines()[0])["argv"]
    assert "--enable-prefix-caching" in argv and "--enable-prompt-tokens-details" in argv
    # The ready body's hit rate is vLLM's: 64 of the 126 prompt tokens above (and of any the leader's own
    # canary sent), once the engine read its /metrics.
    deadline = time.monotonic() + 30
    while unit.leader.ready()[1]["load"]["prefix_cache_hits"] != 64:
        assert time.monotonic() < deadline, unit.leader.ready()
        time.sleep(0.2)
    load = unit.leader.ready()[1]["load"]
    assert load["prefix_cache_queries"] >= 126
    assert load["prefix_cache_hit_rate"] == pytest.approx(64 / load["prefix_cache_queries"])


def _phases_until_ready(unit, timeout_s: float) -> dict[str, set]:
    """Poll the leader's ready body until it answers 200: the load phases it named for itself and for
    each follower on the way."""
    seen: dict[str, set] = {"leader": set(), "follower": set()}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            code, body = unit.leader.ready()
        except OSError:  # not listening yet
            time.sleep(0.2)
            continue
        if code == 200:
            # Loaded: neither the leader nor any follower names a phase any more.
            assert body["loading"] is None and all(m["loading"] is None for m in body["members"])
            break
        if body and body.get("loading"):
            seen["leader"].add(body["loading"]["phase"])
        for member in (body or {}).get("members", []):
            if member.get("loading"):
                seen["follower"].add(member["loading"]["phase"])
        time.sleep(0.2)
    return seen


def test_a_one_node_unit_says_it_is_compiling_in_its_ready_body_until_vllm_is_healthy(neuron_unit):
    # No compile cache: vLLM compiles on start and says nothing on the way; the stand-in's /health
    # answers 503 for its first 4 s, so the leader's ready body is seen naming the phase.
    unit, _log = neuron_unit(STANDIN_HEALTH_AFTER="4")
    seen = _phases_until_ready(unit, timeout_s=90)
    assert "compile" in seen["leader"], (seen, unit.dump_logs())
    assert seen["leader"] <= {"fetch_model", "compile"} and not seen["follower"]
    unit.wait_ready(timeout=90)


def test_standin_dying_mid_stream_errors_the_stream_and_the_unit_reforms(neuron_unit):
    unit, _log = neuron_unit(STANDIN_DIE_AFTER="2")
    unit.wait_ready(timeout=90)
    with _post(
        unit.url + "/completions", {"model": "llama", "prompt": [2, 3], "max_tokens": 50, "stream": True}, timeout=20
    ) as r:
        events = _sse(r)
    texts = [e["choices"][0]["text"] for e in events if isinstance(e, dict) and e.get("choices")]
    assert texts == ["flotilla", " serves"]
    assert "[DONE]" not in events and "error" in events[-1]
    assert unit.leader.ready()[0] != 200  # not ready before the client could retry here
    # One fresh engine process (and stand-in) per formation: the unit serves again.
    unit.wait_ready(timeout=90)
    reform = unit.leader.log_events("unit_reform")
    assert reform and "vLLM" in json.dumps(reform[0]), unit.dump_logs()
    assert len(unit.leader.log_events("formation_offered")) == 2


def _lines(url: str, body: dict, headers: dict) -> list[str]:
    """Every non-empty line of a streamed answer, the SSE comment lines included."""
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json", **headers}
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return [line for raw in r if (line := raw.decode().rstrip("\r\n"))]


def test_a_single_node_unit_reports_each_tokens_id_and_continues_a_stream_from_them(neuron_unit):
    """What the router moves a stream with: resume comments with each event's token ids, then the
    internal continuation on another unit. The cut falls after "trainium", which the leader holds
    back (it may start the stop string "trainium units"): it comes out once, after the cut."""
    unit, log = neuron_unit(STANDIN_TEXT="flotilla serves trainium hello trainium units world")
    unit.wait_ready(timeout=90)
    url = unit.url + "/completions"
    body = {
        "model": "llama",
        "prompt": "hello world",
        "max_tokens": 10,
        "temperature": 0,
        "stop": ["trainium units"],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    first = _lines(url, body, {contract.RESUME_HEADER: "1"})
    said = [json.loads(x[len(contract.RESUME_COMMENT) :]) for x in first if x.startswith(contract.RESUME_COMMENT)]
    ids = [t for s in said for t in s["t"]]
    assert ids == word_ids("flotilla serves trainium hello trainium units")  # "units" completes the stop
    data = [json.loads(x[len("data: ") :]) for x in first if x.startswith("data: {")]
    texts = [c["text"] for e in data for c in e["choices"]]
    assert "".join(texts) == "flotilla serves trainium hello " and data[-1]["usage"]["completion_tokens"] == 6

    cont = {"id": "cmpl-first-unit", "created": 1700000000, "token_ids": ids[:3]}
    again = _lines(url, {**body, contract.CONTINUATION_FIELD: cont}, {contract.CONTINUATION_HEADER: "1"})
    assert again[-1] == "data: [DONE]"
    events = [json.loads(x[len("data: ") :]) for x in again if x.startswith("data: {")]
    assert {e["id"] for e in events} == {cont["id"]}
    rest = "".join(c["text"] for e in events for c in e["choices"])
    assert "".join(texts[:3]) == "flotilla serves " and rest == "trainium hello "
    assert events[-1]["usage"]["completion_tokens"] == 6  # the whole answer's
    sent = [json.loads(line)["body"] for line in log.read_text().splitlines() if '"body"' in line][-1]
    assert sent["prompt"] == [*word_ids("hello world"), *ids[:3]] and sent["max_tokens"] == 7


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _pids_of(script: str) -> list[int]:
    """This test run's processes whose command line names `script` (not another run's on the machine)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if script in (d / "cmdline").read_bytes().decode(errors="replace") and started_here(int(d.name)):
                    out.append(int(d.name))
            except OSError:
                continue
    return out


@pytest.mark.parametrize("neuron_unit", [LLAMA_31_405B], indirect=True)
def test_two_node_unit_serves_through_the_nxd_inference_loop_and_reforms_when_a_node_dies(neuron_unit, tmp_path):
    # 2 x trn1.32xlarge: tp_degree 64, ranks 0-31 and 32-63; the stand-in runs each 16 cores as one
    # partition of the tiny model (4 partitions, 2 a node) and holds at most 60% of it per node.
    unit, _log = neuron_unit(
        world_size=2,
        STANDIN_NXDI_CORES_PER_PARTITION="16",
        STANDIN_NXDI_VOCAB=str(len(WORDS)),
        FLOTILLA_NEURON_BATCH_SIZE="2",
        # Two formations of two torch processes each: room for a loaded shared machine.
        FLOTILLA_FORM_TIMEOUT_S="300",
        # Each node's warm-up lasts 3 s, so the load is seen moving through the ready body.
        STANDIN_NXDI_WARMUP_S="3",
    )
    # While it loads, the leader's ready body says where its own engine and each follower's are.
    seen = _phases_until_ready(unit, timeout_s=300)
    # fetch_model and load pass too quickly to be sure of; a 3 s warm-up is seen on both nodes.
    assert "warmup" in seen["leader"] and "warmup" in seen["follower"], (seen, unit.dump_logs())
    assert seen["leader"] | seen["follower"] <= {"fetch_model", "fetch_compiled", "compile", "load", "warmup", "join"}
    unit.wait_ready(timeout=300)
    # Token ids in, the split model's greedy tokens out, as the unsplit model computes them.
    (want,) = unsplit_greedy([[2, 3]], 3, shape=replace(SHAPE, vocab_size=len(WORDS)))
    eos = WORDS.index("</s>")
    want = want[: want.index(eos) + 1] if eos in want else want
    with _post(unit.url + "/completions", {"model": "llama", "prompt": [2, 3], "max_tokens": 3, "temperature": 0}) as r:
        body = json.load(r)
    assert body["usage"]["completion_tokens"] == len(want)
    assert body["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}  # no prefix cache across nodes yet
    assert body["choices"][0]["finish_reason"] == ("stop" if want[-1] == eos else "length")
    text = HFTokenizer(tmp_path / "published").decode([t for t in want if t != eos])
    assert body["choices"][0]["text"].split() == text.split()
    # A stream another unit started continues here from the tokens its client has (the router's
    # internal continuation): only the rest comes, under the first unit's id, usage over the whole.
    assert len(want) >= 2
    cont = {"id": "cmpl-first-unit", "created": 1700000000, "token_ids": want[:1]}
    request = urllib.request.Request(
        unit.url + "/completions",
        data=json.dumps(
            {
                "model": "llama",
                "prompt": [2, 3],
                "max_tokens": 3,
                "temperature": 0,
                "stream": True,
                "stream_options": {"include_usage": True},
                contract.CONTINUATION_FIELD: cont,
            }
        ).encode(),
        headers={"Content-Type": "application/json", contract.CONTINUATION_HEADER: "1"},
    )
    with urllib.request.urlopen(request, timeout=30) as r:
        events = _sse(r)
    assert events[-1] == "[DONE]" and not any("error" in e for e in events[:-1]), events
    chunks = [e for e in events[:-1] if e.get("choices")]
    assert {e["id"] for e in events[:-1]} == {cont["id"]}
    rest = "".join(e["choices"][0]["text"] for e in chunks)
    first = HFTokenizer(tmp_path / "published").decode(want[:1])
    assert (first + rest).split() == text.split()
    assert events[-2]["usage"]["completion_tokens"] == len(want)

    followers = _pids_of("--node-rank=1")
    assert len(followers) == 1, unit.dump_logs()
    os.kill(followers[0], signal.SIGKILL)  # the follower node's loop dies
    deadline = time.monotonic() + 60
    while unit.leader.ready()[0] == 200 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert unit.leader.ready()[0] != 200
    unit.wait_ready(timeout=300)
    with _post(unit.url + "/completions", {"model": "llama", "prompt": [2, 3], "max_tokens": 3, "temperature": 0}) as r:
        assert json.load(r)["usage"]["completion_tokens"] == len(want)
    loops = _pids_of("spmd.py")
    unit.stop()
    deadline = time.monotonic() + 15
    while any(_alive(p) for p in loops) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in loops)  # stopping the unit leaves no engine behind


def _stopped_for_good(unit, code: int) -> dict:
    """The leader exited with `code` at its first failure (no re-form, no restart budget spent) and
    said why in one `node_cannot_serve` line; that line."""
    assert unit.leader.wait(timeout=90) == code, unit.dump_logs()
    (line,) = unit.leader.log_events(node_exit.CANNOT_SERVE_EVENT)
    assert line["exit_code"] == code and line["meaning"] == node_exit.meaning(code)
    assert "\n" not in line["reason"]
    assert not unit.leader.log_events("unit_reform") and not unit.leader.log_events("restart_budget_exhausted")
    assert unit.leader.log_events("node_exit")[-1]["code"] == code
    return line


@pytest.mark.parametrize("neuron_unit", [SMOLLM2_135M], indirect=True)
def test_a_node_with_an_impossible_layout_says_why_and_stops_before_fetching_the_weights(neuron_unit, tmp_path):
    # SmolLM2's 9 attention heads cannot split over a trn1.32xlarge's 32 NeuronCores: no retry can change
    # that, so the node stops at once (exit 3), not after its restart budget of re-forms.
    unit, log = neuron_unit()
    line = _stopped_for_good(unit, node_exit.LAYOUT_REFUSED)
    assert "refused before fetching weights" in line["reason"] and "num_attention_heads=9" in line["reason"]
    # The fix in the names the node was given its settings by (the stacks set these variables).
    assert f"raise {contract.ENV_NEURON_BATCH_SIZE} to a multiple of 32" in line["reason"]
    assert unit.leader.log_events("node_listening")[0]["model"] == MODEL_URI
    assert not (tmp_path / "model" / "model.safetensors").exists() and not log.exists()


def test_a_node_whose_model_was_never_published_stops_naming_the_manifest(neuron_unit):
    unit, _log = neuron_unit(**{contract.ENV_MODEL_URI: "s3://flotilla-models/llama/never-published"})
    line = _stopped_for_good(unit, node_exit.MODEL_NOT_PUBLISHED)
    assert "s3://flotilla-models/llama/never-published/flotilla-manifest.json not found" in line["reason"]


def test_a_node_whose_published_files_differ_from_the_manifest_stops_before_downloading_them(neuron_unit, tmp_path):
    unit, _log = neuron_unit(STANDIN_S3_TAMPER="model.safetensors")
    line = _stopped_for_good(unit, node_exit.MODEL_NOT_PUBLISHED)
    assert "model.safetensors is 8 bytes but the manifest says 200000" in line["reason"]
    assert not (tmp_path / "model" / "model.safetensors").exists()


def test_a_node_whose_config_json_cannot_be_read_stops_naming_the_file(neuron_unit, tmp_path):
    (tmp_path / "published" / "config.json").write_text("{not json")  # published as is when the node starts
    unit, _log = neuron_unit()
    line = _stopped_for_good(unit, node_exit.MODEL_UNREADABLE)
    assert f"{MODEL_URI}/config.json: not valid JSON" in line["reason"]
