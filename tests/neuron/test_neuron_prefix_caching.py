"""Prefix caching on a single-node neuron unit, an opt-in (FLOTILLA_NEURON_PREFIX_CACHING_BLOCK): the
flags the plan adds, the batch size it refuses, and vLLM's cached_tokens and prefix-cache counters carried
through the engine, against the stand-in of the image's vLLM 0.13.0 server (tests/neuron/standins, NOT vLLM).
Each flag's source is in runtime/engines/neuron/launch.py PREFIX_CACHING_SOURCES."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from llama_shapes import LLAMA_3_8B
from standin_model import make_checkpoint
from test_neuron_engine import MODEL_URI, collect, engine_for, s3  # noqa: F401 - s3 is a fixture

from contract.layout import LayoutError
from runtime.artifacts import publish
from runtime.node.settings import SettingsError, load_settings


def _leader(unit_plan, nodes: int = 1, **options):
    plan = unit_plan("llama-3.1-70b", nodes=nodes, **{"seq_len": 4096, "batch_size": 8, **options})
    return plan, plan.ranks[0]


def _after(command, flag):
    return command[list(command).index(flag) + 1]


def test_prefix_caching_is_off_unless_a_block_size_is_given(unit_plan):
    _, leader = _leader(unit_plan)
    assert "--no-enable-prefix-caching" in leader.command
    assert "--enable-prefix-caching" not in leader.command and "--enable-prompt-tokens-details" not in leader.command
    assert _after(leader.command, "--num-gpu-blocks-override") == "8"  # exactly max_num_seqs without it
    assert leader.nxdi_config["is_prefix_caching"] is False and "is_block_kv_layout" not in leader.nxdi_config


def test_a_block_size_turns_on_prefix_caching_with_the_plugins_block_count_and_cached_token_reports(unit_plan):
    plan, leader = _leader(unit_plan, prefix_caching_block=32)
    command = list(leader.command)
    assert "--no-enable-prefix-caching" not in command
    assert "--enable-prefix-caching" in command and "--enable-prompt-tokens-details" in command
    assert _after(command, "--block-size") == "32"
    # ceil(max_model_len / block_size) x max_num_seqs: 4096 / 32 x 8
    assert _after(command, "--num-gpu-blocks-override") == str(128 * 8)
    assert {k: leader.nxdi_config[k] for k in ("pa_num_blocks", "pa_block_size", "is_prefix_caching")} == {
        "pa_num_blocks": 1024,
        "pa_block_size": 32,
        "is_prefix_caching": True,
    }
    assert leader.nxdi_config["is_block_kv_layout"] is True  # another compiled model: another cache key
    sources = plan.to_dict()["sources"]
    for arg in command:
        if arg.startswith("--"):
            assert arg in sources, f"{arg} has no source"


def test_a_block_that_does_not_divide_the_sequence_rounds_the_block_count_up(unit_plan):
    _, leader = _leader(unit_plan, prefix_caching_block=32, seq_len=4000)
    assert _after(leader.command, "--num-gpu-blocks-override") == str(125 * 8)  # ceil(4000 / 32) = 125


def test_the_node_refuses_prefix_caching_at_batch_size_1_in_one_line():
    base = ["--peers", "127.0.0.1:18000", "--rank", "0", "--engine", "neuron", "--model-uri", "s3://b/p/"]
    base += ["--instance-type", "trn1.32xlarge"]
    with pytest.raises(SettingsError) as err:
        load_settings(base, {"FLOTILLA_NEURON_BATCH_SIZE": "1", "FLOTILLA_NEURON_PREFIX_CACHING_BLOCK": "32"})
    assert str(err.value) == (
        "FLOTILLA_NEURON_PREFIX_CACHING_BLOCK=32 needs a batch size of at least 2: the pinned vllm-neuron's "
        "prefix caching generates incorrect outputs at batch size 1; raise FLOTILLA_NEURON_BATCH_SIZE or set this to 0"
    )
    assert load_settings(base, {"FLOTILLA_NEURON_PREFIX_CACHING_BLOCK": "32"}).neuron.prefix_caching_block == 32


def test_the_node_refuses_a_block_size_vllm_does_not_take_in_one_line():
    base = ["--peers", "127.0.0.1:18000", "--rank", "0", "--engine", "neuron", "--model-uri", "s3://b/p/"]
    base += ["--instance-type", "trn1.32xlarge", "--neuron-prefix-caching-block", "48"]
    with pytest.raises(SettingsError) as err:
        load_settings(base, {})
    assert str(err.value) == (
        "--neuron-prefix-caching-block=48 is not a vLLM block size: use one of 1, 8, 16, 32, 64, 128, 256, or 0 (off)"
    )


def test_the_plan_refuses_prefix_caching_at_batch_size_1_and_across_nodes(unit_plan):
    with pytest.raises(LayoutError, match="batch_size=1: the plugin's prefix caching generates incorrect"):
        unit_plan("llama-3.1-70b", nodes=1, batch_size=1, prefix_caching_block=32)
    with pytest.raises(LayoutError, match="applies to single-node units only"):
        _leader(unit_plan, nodes=2, prefix_caching_block=32)


def test_vllms_cached_tokens_and_prefix_cache_counters_come_through_the_engine(tmp_path, s3, monkeypatch):  # noqa: F811
    publish(make_checkpoint(tmp_path / "src", LLAMA_3_8B), MODEL_URI, s3=s3)
    log = tmp_path / "standin.jsonl"
    monkeypatch.setenv("STANDIN_LOG", str(log))

    async def scenario():
        engine = engine_for(tmp_path, s3, compile_cache_uri=None, sampling="cpu", prefix_caching_block=16)
        await engine.start()
        try:
            prompt = list(range(2, 42))  # 40 tokens: two full blocks of 16 before the last token
            first = await collect(engine, "a", prompt, max_tokens=2)
            second = await collect(engine, "b", prompt, max_tokens=2)
            assert [e.cached_tokens for e in first] == [0, 0]
            # The finish event carries vLLM's usage.prompt_tokens_details.cached_tokens; earlier ones none.
            assert [(e.finish_reason, e.cached_tokens) for e in second] == [(None, 0), ("length", 32)]
            sent = json.loads(log.read_text().splitlines()[-1])
            assert sent["body"]["stream_options"] == {"include_usage": True}
            deadline = time.monotonic() + 30  # the engine reads vLLM's /metrics every 2 s
            while engine.load().prefix_cache_hits != 32:
                assert time.monotonic() < deadline, engine.load()
                await asyncio.sleep(0.1)
            assert engine.load().prefix_cache_queries == 80
        finally:
            await engine.shutdown()

    asyncio.run(scenario())
