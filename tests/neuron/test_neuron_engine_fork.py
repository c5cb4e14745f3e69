"""The leader's neuron engine on a multi-node unit, against the stand-in of the fork's vLLM
(tests/neuron/standins/vllm_fork_0_7_2, NOT vLLM): the demo /generate takes text and streams text, so
the engine sends the prompt as text and recovers token counts, ids and finish reasons itself; an idle
unit keeps its followers with one-token requests. The follower is the real worker.py, launched from
the rank-1 plan; the model and compile cache are on moto S3."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time

import boto3
import pytest
from llama_shapes import LLAMA_3_8B
from moto import mock_aws
from standin_model import STANDIN_LAUNCHER, VLLM_FORK_0_7_2, make_checkpoint, word_ids
from testnet import free_port

from runtime.artifacts import publish
from runtime.engines.base import EngineState, GenerationRequest, SamplingParams
from runtime.engines.neuron.engine import NeuronEngine, NeuronEngineSettings, rank_argv
from runtime.engines.neuron.launch import NeuronOptions, plan_member
from runtime.engines.neuron.model import load_model_shape
from runtime.membership import Member, Membership

BUCKET = "flotilla-models"
MODEL_URI = f"s3://{BUCKET}/llama/v1"
EOS = 1  # "</s>" in standin_model.WORDS


@pytest.fixture
def s3(monkeypatch):
    for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("FLOTILLA_NEURON_SDK_VERSION", "2.24.1")  # Dockerfile.neuron-multinode sets it
    monkeypatch.setenv("PYTHONPATH", VLLM_FORK_0_7_2)  # both ranks import the stand-in `vllm`
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        yield client


@pytest.fixture
def fork_leader(tmp_path, s3, monkeypatch):
    """start(**engine kwargs) -> (a started leader NeuronEngine of a 2-node unit, follower, log)."""
    src = make_checkpoint(tmp_path / "src", LLAMA_3_8B)
    publish(src, MODEL_URI, s3=s3)
    log = tmp_path / "standin.jsonl"
    monkeypatch.setenv("STANDIN_LOG", str(log))
    engines, followers = [], []
    members = (Member(rank=0, host="127.0.0.1", api_port=free_port()), Member(rank=1, host="127.0.0.1", api_port=0))
    membership = Membership(
        unit_id="u0", revision="r1", rank=0, world_size=2, members=members, dist_host="127.0.0.1", dist_port=free_port()
    )
    options = NeuronOptions(
        seq_len=256,
        batch_size=4,
        served_model_name="llama",
        compiled_artifacts_dir=str(tmp_path / "compiled"),
        engine_port=free_port(),
    )

    async def start(**kw):
        # The follower node's rank, as run_follower would start it (its own copy of the model).
        follower_plan = plan_member(
            Membership(**{**membership.__dict__, "rank": 1}),
            instance_type="trn1.32xlarge",
            model=load_model_shape(src),
            model_dir=str(src),
            options=options,
        )
        argv, env = rank_argv(follower_plan, dict(os.environ), STANDIN_LAUNCHER)
        followers.append(subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True))
        engine = NeuronEngine(
            membership,
            settings=NeuronEngineSettings(
                model_uri=MODEL_URI,
                model_dir=str(tmp_path / "model"),
                instance_type="trn1.32xlarge",
                options=options,
                launcher=STANDIN_LAUNCHER,
            ),
            model_name="llama",
            start_timeout_s=90.0,
            s3=s3,
            **kw,
        )
        engines.append(engine)
        await engine.start()
        return engine, followers[-1], log

    yield start
    for f in followers:
        if f.poll() is None:
            f.kill()
        f.communicate()


async def collect(engine, rid, ids, **sampling):
    return [
        ev
        async for ev in engine.generate(
            GenerationRequest(request_id=rid, prompt_token_ids=tuple(ids), sampling=SamplingParams(**sampling))
        )
    ]


def _bodies(log):
    return [e["body"] for e in map(json.loads, log.read_text().splitlines()) if "body" in e]


def test_the_leader_sends_text_and_recovers_one_token_per_step_with_the_finish_reason(fork_leader, monkeypatch):
    monkeypatch.setenv("STANDIN_EOS_AFTER", "4")  # the stand-in model's 5th output token is EOS

    async def scenario():
        engine, follower, log = await fork_leader()
        try:
            assert engine.api == "generate" and engine.health().state is EngineState.READY
            ids = word_ids("hello world")
            evs = await collect(engine, "r1", ids, max_tokens=3, temperature=0.5, top_p=0.9, seed=7)
            # One event per line the server wrote (one per engine step), then the finish reason alone.
            assert [(e.token_id, e.text, e.finish_reason) for e in evs] == [
                (4, "flotilla", None),
                (5, " serves", None),
                (6, " trainium", None),
                (-1, "", "length"),  # 3 steps = max_tokens
            ]
            # The prompt went as text, and nothing SamplingParams would refuse.
            assert _bodies(log)[-1] == {
                "prompt": "hello world",
                "stream": True,
                "max_tokens": 3,
                "temperature": 0.5,
                "top_p": 0.9,
                "ignore_eos": False,
                "seed": 7,
            }
            # EOS: the step that produced it has no text; it counts as a token, with the EOS id.
            evs = await collect(engine, "r2", ids, max_tokens=8)
            assert [e.token_id for e in evs] == [4, 5, 6, 7, EOS, -1]
            assert evs[-1].finish_reason == "stop" and "".join(e.text for e in evs) == "flotilla serves trainium units"
            # ignore_eos goes through to SamplingParams: the model runs to max_tokens.
            evs = await collect(engine, "r3", ids, max_tokens=6, ignore_eos=True)
            assert len([e for e in evs if e.token_id >= 0]) == 6 and evs[-1].finish_reason == "length"
            # A stop string: vLLM cuts it from the text and ends the request; the step that hit it
            # adds only what came before the string, so its re-encoded id is a guess (here: EOS's).
            evs = await collect(engine, "r4", ids, max_tokens=5, stop=("serves",))
            assert [(e.token_id, e.text) for e in evs] == [(4, "flotilla"), (EOS, " "), (-1, "")]
            assert evs[-1].finish_reason == "stop" and _bodies(log)[-1]["stop"] == ["serves"]
            assert follower.poll() is None
        finally:
            await engine.shutdown()
        assert engine._proc.returncode is not None

    asyncio.run(scenario())


def test_the_prompt_text_drops_a_leading_bos_the_server_adds_again(tmp_path):
    engine = NeuronEngine(
        Membership(unit_id="u", revision="r", rank=0, world_size=2, dist_host="127.0.0.1", dist_port=29500),
        settings=NeuronEngineSettings(
            model_uri=MODEL_URI, model_dir=str(tmp_path), instance_type="trn1.32xlarge", options=NeuronOptions()
        ),
        model_name="llama",
        start_timeout_s=1.0,
    )

    class Tok:  # what a Llama 3 tokenizer does: BOS added on encode, chat markers kept on decode
        def __call__(self, text, add_special_tokens):
            return {"input_ids": [128000] if add_special_tokens else []}

        def decode(self, ids, skip_special_tokens, clean_up_tokenization_spaces):
            assert not skip_special_tokens
            return "|".join(map(str, ids))

    engine._server_tok = Tok()
    assert engine.fork_prompt_text([128000, 9906, 128009]) == "9906|128009"
    assert engine.fork_prompt_text([9906]) == "9906"


def test_an_idle_unit_keeps_its_followers_alive_with_one_token_requests(fork_leader, monkeypatch):
    # The followers' gloo wait times out after 2 s here (30 min in the fork, torch's default): with a
    # keepalive every 0.4 s the follower sees a step before each timeout and stays up.
    monkeypatch.setenv("STANDIN_GLOO_TIMEOUT_S", "2")

    async def scenario():
        engine, follower, log = await fork_leader(keepalive_s=0.4)
        try:
            deadline = time.monotonic() + 30
            while engine.keepalives < 12:  # 12 x 0.4 s: more than twice the timeout, idle
                assert time.monotonic() < deadline and follower.poll() is None
                await asyncio.sleep(0.1)
            assert follower.poll() is None
            keepalives = [b for b in _bodies(log) if b["prompt"] == "ping"]
            assert len(keepalives) >= 12 and all(b["max_tokens"] == 1 for b in keepalives)
            evs = await collect(engine, "after-idle", word_ids("hello"), max_tokens=2)
            assert [e.text for e in evs] == ["world", " flotilla", ""]
        finally:
            await engine.shutdown()

    asyncio.run(scenario())


def test_cancel_closes_the_forks_stream_and_the_engine_keeps_serving(fork_leader, monkeypatch):
    monkeypatch.setenv("STANDIN_TOKEN_DELAY", "0.1")

    async def scenario():
        engine, _follower, log = await fork_leader()
        try:
            got = []
            async with asyncio.timeout(30):
                async for ev in engine.generate(
                    GenerationRequest(request_id="c", prompt_token_ids=(2,), sampling=SamplingParams(max_tokens=100))
                ):
                    got.append(ev.text)
                    if len(got) == 2:
                        engine.cancel("c")
            assert got == ["world", " flotilla"]  # ended quietly at the cancel
            deadline = time.monotonic() + 10
            while {"aborted": "c"} not in map(json.loads, log.read_text().splitlines()):
                assert time.monotonic() < deadline, "the server never saw the request closed"
                await asyncio.sleep(0.05)
            assert engine.health().state is EngineState.READY and not engine._running
            assert [e.text for e in await collect(engine, "next", (2,), max_tokens=1)] == ["world", ""]
        finally:
            await engine.shutdown()

    asyncio.run(scenario())
