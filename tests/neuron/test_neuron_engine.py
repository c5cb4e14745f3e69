"""The leader's single-node neuron engine against the stand-in of the image's vLLM 0.13.0 OpenAI server
(tests/neuron/standins/vllm_0_13_0, NOT vLLM) launched through launch_spec, with the model and
compile cache on moto S3."""

from __future__ import annotations

import asyncio
import json
import time

import boto3
import pytest
from llama_shapes import LLAMA_3_8B, SMOLLM2_135M
from memberships import membership
from moto import mock_aws
from standin_model import STANDIN_LAUNCHER, VLLM_0_13_0, WEIGHTS, make_checkpoint, word_ids
from testnet import free_port

import contract
from contract import node_exit
from runtime.artifacts import publish
from runtime.engines.base import (
    EngineBroken,
    EngineCannotServe,
    EngineError,
    EngineState,
    GenerationRequest,
    SamplingParams,
)
from runtime.engines.neuron.engine import NeuronEngine, NeuronEngineSettings
from runtime.engines.neuron.launch import NeuronOptions
from runtime.membership import Membership

BUCKET = "flotilla-models"
MODEL_URI = f"s3://{BUCKET}/llama/v1"
CACHE_URI = f"s3://{BUCKET}/compile-cache"


@pytest.fixture
def s3(monkeypatch):
    for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("FLOTILLA_NEURON_SDK_VERSION", "2.28.0")  # Dockerfile.neuron sets it
    monkeypatch.setenv("PYTHONPATH", VLLM_0_13_0)  # the launched server imports the stand-in `vllm`
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        yield client


def one_node() -> Membership:
    return membership([("127.0.0.1", free_port())], unit_id="u0", revision="r1", dist_port=free_port())


def engine_for(
    tmp_path, s3, *, compile_cache_uri=CACHE_URI, start_timeout_s=60.0, sampling="device", prefix_caching_block=0, **kw
) -> NeuronEngine:
    options = NeuronOptions(
        seq_len=256,
        batch_size=4,
        served_model_name="llama",
        compiled_artifacts_dir=str(tmp_path / "compiled"),
        engine_port=free_port(),
        sampling=sampling,
        prefix_caching_block=prefix_caching_block,
    )
    settings = NeuronEngineSettings(
        model_uri=MODEL_URI,
        model_dir=str(tmp_path / "model"),
        instance_type="trn1.32xlarge",
        options=options,
        compile_cache_uri=compile_cache_uri,
        launcher=STANDIN_LAUNCHER,
    )
    return NeuronEngine(one_node(), settings=settings, model_name="llama", start_timeout_s=start_timeout_s, s3=s3, **kw)


async def collect(engine, rid, ids, **sampling):
    return [
        ev
        async for ev in engine.generate(
            GenerationRequest(request_id=rid, prompt_token_ids=tuple(ids), sampling=SamplingParams(**sampling))
        )
    ]


def test_start_refuses_an_impossible_layout_before_fetching_any_weights(tmp_path, s3, monkeypatch):
    # SmolLM2's 9 attention heads cannot split over one trn1.32xlarge's 32 NeuronCores.
    publish(make_checkpoint(tmp_path / "src", SMOLLM2_135M), MODEL_URI, s3=s3)
    log = tmp_path / "standin.jsonl"
    monkeypatch.setenv("STANDIN_LOG", str(log))
    engine = engine_for(tmp_path, s3)
    with pytest.raises(EngineCannotServe) as e:
        asyncio.run(engine.start())
    msg = str(e.value)
    assert e.value.exit_code == node_exit.LAYOUT_REFUSED  # the node stops with it: no re-form can help
    assert "refused before fetching weights" in msg and "num_attention_heads=9" in msg
    # The planner's fix, in the variable the node was given its batch size by.
    assert msg.endswith(f": raise {contract.ENV_NEURON_BATCH_SIZE} to a multiple of 32")
    assert not (tmp_path / "model" / WEIGHTS).exists()
    assert not log.exists() and engine._proc is None  # no server was started


def test_engine_streams_the_servers_tokens_and_stores_the_compile_cache_once_healthy(tmp_path, s3, monkeypatch):
    publish(make_checkpoint(tmp_path / "src", LLAMA_3_8B), MODEL_URI, s3=s3)
    log = tmp_path / "standin.jsonl"
    monkeypatch.setenv("STANDIN_LOG", str(log))
    monkeypatch.setenv("STANDIN_HEALTH_AFTER", "1.0")
    monkeypatch.setenv("STANDIN_COMPILE_TO", "1")

    async def scenario():
        engine = engine_for(tmp_path, s3, sampling="cpu")
        await engine.start()
        try:
            assert engine.health().state is EngineState.READY
            assert engine.prepared.compile_cache_hit is False
            cached = s3.list_objects_v2(Bucket=BUCKET, Prefix=f"compile-cache/{engine.prepared.compile_key}/")
            assert [o["Key"].rsplit("/", 1)[-1] for o in cached.get("Contents", [])] == [
                "compiled.neff",
                "flotilla-manifest.json",
            ]
            ids = word_ids("hello flotilla")
            evs = await collect(engine, "req-1", ids, max_tokens=3, temperature=0.5, top_p=0.9, stop=("units",))
            assert [e.token_id for e in evs] == [ids[-1] + 1, ids[-1] + 2, ids[-1] + 3]
            # The text is cut here from the ids with the checkpoint's tokenizer, up to the stop string.
            assert [e.text for e in evs] == ["serves", " trainium", " "]
            assert [e.finish_reason for e in evs] == [None, None, "stop"]
            sent = json.loads(log.read_text().splitlines()[-1])
            assert sent["request_id"] == "req-1"
            assert sent["body"] == {
                "model": "llama",
                "prompt": ids,
                "stream": True,
                "max_tokens": 3,
                "temperature": 0.5,
                "top_p": 0.9,
                "ignore_eos": False,
                "return_token_ids": True,
            }
            # A request vLLM refuses as too long is the client's error, not a broken unit.
            with pytest.raises(EngineError) as e:
                await collect(engine, "req-2", ids, max_tokens=1000)
            assert "maximum context length" in str(e.value) and not isinstance(e.value, EngineBroken)
            assert engine.health().state is EngineState.READY
        finally:
            await engine.shutdown()
        assert engine._proc.returncode is not None and engine.health().state is EngineState.STOPPED
        # The next start finds the cache: nothing is uploaded again.
        again = engine_for(tmp_path, s3, sampling="cpu")  # same NxD Inference config, same cache key
        await again.start()
        try:
            assert again.prepared.compile_cache_hit is True
        finally:
            await again.shutdown()

    asyncio.run(scenario())


def test_server_dying_mid_stream_fails_the_stream_and_breaks_the_engine(tmp_path, s3, monkeypatch):
    publish(make_checkpoint(tmp_path / "src", LLAMA_3_8B), MODEL_URI, s3=s3)
    monkeypatch.setenv("STANDIN_DIE_AFTER", "2")

    async def scenario():
        engine = engine_for(tmp_path, s3, compile_cache_uri=None)
        await engine.start()
        got = []
        try:
            with pytest.raises(EngineBroken, match="dropped the stream|without a finish reason"):
                async with asyncio.timeout(20):
                    async for ev in engine.generate(
                        GenerationRequest(
                            request_id="r", prompt_token_ids=(2, 3), sampling=SamplingParams(max_tokens=10)
                        )
                    ):
                        got.append(ev.token_id)
            assert got == [4, 5]
            deadline = time.monotonic() + 10
            while engine.health().state is not EngineState.BROKEN and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert engine.health().state is EngineState.BROKEN
            assert "exited with code 1" in engine.health().detail
            with pytest.raises(EngineBroken):
                await collect(engine, "after", [2])
        finally:
            await engine.shutdown()

    asyncio.run(scenario())


def test_start_fails_with_the_exit_code_when_the_server_dies_before_healthy(tmp_path, s3, monkeypatch):
    publish(make_checkpoint(tmp_path / "src", LLAMA_3_8B), MODEL_URI, s3=s3)
    engine = engine_for(tmp_path, s3, compile_cache_uri=None)
    engine.s = NeuronEngineSettings(**{**engine.s.__dict__, "launcher": "python3 -c 'import sys; sys.exit(3)'"})
    with pytest.raises(EngineError, match="exited with code 3 before it became healthy"):
        asyncio.run(engine.start())


def test_cancel_closes_the_upstream_request_and_load_comes_from_vllm_metrics(tmp_path, s3, monkeypatch):
    publish(make_checkpoint(tmp_path / "src", LLAMA_3_8B), MODEL_URI, s3=s3)
    log = tmp_path / "standin.jsonl"
    monkeypatch.setenv("STANDIN_LOG", str(log))

    async def scenario():
        engine = engine_for(tmp_path, s3, compile_cache_uri=None)
        await engine.start()
        try:
            got = []
            async with asyncio.timeout(20):
                async for ev in engine.generate(
                    GenerationRequest(request_id="c", prompt_token_ids=(2,), sampling=SamplingParams(max_tokens=200))
                ):
                    got.append(ev.token_id)
                    if len(got) == 2:
                        engine.cancel("c")
            assert got == [3, 4]  # ended quietly at the cancel, no error
            assert engine.health().state is EngineState.READY and not engine._running
            deadline = time.monotonic() + 10
            while {"aborted": "c"} not in map(json.loads, log.read_text().splitlines()):
                assert time.monotonic() < deadline, "the server never saw the request closed"
                await asyncio.sleep(0.05)
            # Load is the server's own gauges (the stand-in reports kv 0.25), polled every 2 s.
            while (engine.load().kv_cache_used, engine.load().running) != (0.25, 0):
                assert time.monotonic() < deadline + 5, engine.load()
                await asyncio.sleep(0.1)
            assert (engine.load().queue_depth, engine.load().max_running) == (0, 4)
        finally:
            await engine.shutdown()

    asyncio.run(scenario())


def test_a_server_whose_health_keeps_failing_breaks_the_engine_and_its_open_streams(tmp_path, s3, monkeypatch):
    publish(make_checkpoint(tmp_path / "src", LLAMA_3_8B), MODEL_URI, s3=s3)
    monkeypatch.setenv("STANDIN_SICK_AFTER", "1.5")
    monkeypatch.setenv("STANDIN_TOKEN_DELAY", "0.1")

    async def scenario():
        engine = engine_for(tmp_path, s3, compile_cache_uri=None, unhealthy_after_s=1.0)
        await engine.start()
        try:
            with pytest.raises(EngineBroken, match="/health has failed"):
                async with asyncio.timeout(30):
                    async for _ in engine.generate(
                        GenerationRequest(  # 250 tokens: 25 s
                            request_id="long", prompt_token_ids=(2,), sampling=SamplingParams(max_tokens=250)
                        )
                    ):
                        pass
            assert engine.health().state is EngineState.BROKEN
        finally:
            await engine.shutdown()

    asyncio.run(scenario())


# A document the stand-in model answers with, byte by byte: "Ç", "û" and "€" take 2, 2 and 3 tokens, and
# "STA" starts like the stop string "STOP" without becoming it (held back, then released).
ANSWER = "Ça coûte 5 € STAY STOP après"


@pytest.mark.parametrize("stop", [("STOP",), ()], ids=["stop-string", "eos"])
def test_a_stream_continued_from_any_token_comes_out_as_the_unmoved_one(tmp_path, s3, monkeypatch, stop):
    """A single-node stream moved after each of its tokens in turn: the other unit's continuation (prompt +
    the generated ids) ends token-exact and text-exact with the unmoved stream, though the stand-in, as
    vLLM does, starts its text afresh after the prompt and holds back the start of a stop string and half
    a character: the cut falls inside "€" and inside "STOP" too."""
    publish(make_checkpoint(tmp_path / "src", LLAMA_3_8B, tokenizer="bytes"), MODEL_URI, s3=s3)
    log = tmp_path / "standin.jsonl"
    monkeypatch.setenv("STANDIN_LOG", str(log))
    monkeypatch.setenv("STANDIN_TEXT", ANSWER)
    monkeypatch.setenv("STANDIN_TOKEN_DELAY", "0")

    async def scenario():
        engine = engine_for(tmp_path, s3, compile_cache_uri=None)
        await engine.start()
        prompt = tuple(engine.tokenizer.encode("Prix ?"))
        sampling = SamplingParams(max_tokens=40, temperature=0.0, stop=stop)
        try:
            whole = [
                ev
                async for ev in engine.generate(
                    GenerationRequest(request_id="whole", prompt_token_ids=prompt, sampling=sampling)
                )
            ]
            ids, text = [e.token_id for e in whole], "".join(e.text for e in whole)
            assert text == ("Ça coûte 5 € STAY " if stop else ANSWER) and whole[-1].finish_reason == "stop"
            assert len(ids) == len(text.encode()) + (len("STOP") if stop else 1)  # one token a byte, and EOS
            for m in range(1, len(ids)):
                before = tuple(ids[:m])
                rest = [
                    ev
                    async for ev in engine.generate(
                        GenerationRequest(
                            request_id=f"moved-{m}", prompt_token_ids=prompt, sampling=sampling, generated=before
                        )
                    )
                ]
                assert [*before, *(e.token_id for e in rest)] == ids, m
                # The client has the text the first unit released for its m tokens, then only what comes here.
                assert "".join(e.text for e in whole[:m]) + "".join(e.text for e in rest) == text, m
                assert rest[-1].finish_reason == "stop"
            sent = [json.loads(line)["body"] for line in log.read_text().splitlines() if '"body"' in line][-1]
            last = len(ids) - 1
            assert sent["prompt"] == [*prompt, *ids[:last]] and sent["max_tokens"] == 40 - last
            assert "stop" not in sent  # the leader cuts stop strings itself
        finally:
            await engine.shutdown()

    asyncio.run(scenario())
