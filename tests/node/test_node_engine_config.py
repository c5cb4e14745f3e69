"""A member's settings reach its engine as one typed object: what the operator sets in the
environment is what the engine object holds, and a config with a key missing or unknown (a node and
an engine process of different code) stops the engine process at once, naming the key."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from memberships import membership
from pydantic import ValidationError

import contract
from runtime.membership import Membership
from runtime.node import engine_host
from runtime.node.engine_config import CONFIG_ENV, ENGINE_SETTINGS, EngineConfig
from runtime.node.settings import NodeSettings, load_settings

SOLO = Membership(unit_id="u", revision="1", rank=0, world_size=1, dist_host="127.0.0.1", dist_port=1)
STATIC = ["--peers", "127.0.0.1:1", "--rank", "0"]
# Each differs from its setting's default (runtime/node/settings.py), so a dropped one shows.
CHANGED = {
    "FLOTILLA_MAX_RUNNING": "3",
    "FLOTILLA_MAX_PREFILL_TOKENS": "96",
    "FLOTILLA_KV_BUDGET_TOKENS": "512",
    "FLOTILLA_COLLECTIVE_TIMEOUT_S": "7",
    "FLOTILLA_FORM_TIMEOUT_S": "42",
    "FLOTILLA_TORCH_THREADS": "2",
    "FLOTILLA_PREFILL_STRATEGY": "pipeline",
    "FLOTILLA_DECODE_STRATEGY": "tensor",
    "FLOTILLA_MODEL_NAME": "served-name",
    "FLOTILLA_ECHO_LOAD_S": "0.5",
}


def _sent_and_parsed(engine: str) -> EngineConfig:
    """The config as the engine process parses it from the supervisor's JSON."""
    s = load_settings(["--engine", engine, *STATIC], CHANGED)
    return EngineConfig.from_json(EngineConfig.from_settings(s, SOLO).to_json())


def test_settings_changed_in_the_environment_reach_the_reference_engine_object():
    engine = engine_host._build_leader_engine(_sent_and_parsed("reference"))
    assert (engine.max_running, engine.kv_budget_tokens, engine.collective_timeout_s) == (3, 512, 7.0)
    assert engine.max_prefill_tokens == 96
    assert (engine.start_timeout_s, engine.threads, engine.model_name) == (42.0, 2, "served-name")
    assert (engine.prefill, engine.decode, engine.membership) == ("pipeline", "tensor", SOLO)


def test_settings_changed_in_the_environment_reach_the_echo_engine_object():
    engine = engine_host._build_leader_engine(_sent_and_parsed("echo"))
    assert engine.load().max_running == 3
    assert (engine.model_name, engine._form_timeout_s, engine._load_s) == ("served-name", 42.0, 0.5)


def test_the_batch_slots_setting_reaches_a_running_echo_unit(new_unit):
    # An engine built without the setting would report its own default slot count instead.
    unit = new_unit(engine="echo", world_size=1, FLOTILLA_MAX_RUNNING="3").start().wait_ready()
    assert unit.leader.ready()[1]["load"]["max_running"] == 3


def test_the_engine_config_sends_node_settings_by_their_names():
    # Its fields are NodeSettings' own (types included): only the names are listed, and each must be
    # a setting. membership: the formation's; speculation: the stacks' FLOTILLA_SPECULATIVE_*
    # variables (contract/speculation.py), read and checked by runtime/node/speculation.py.
    assert set(ENGINE_SETTINGS) <= set(NodeSettings.model_fields)
    assert set(EngineConfig.model_fields) == {*ENGINE_SETTINGS, "membership", "speculation"}


def test_the_speculation_variables_reach_the_reference_engine_object(monkeypatch):
    monkeypatch.setenv("FLOTILLA_SPECULATIVE_METHOD", "ngram")
    monkeypatch.setenv("FLOTILLA_SPECULATIVE_TOKENS", "6")
    engine = engine_host._build_leader_engine(_sent_and_parsed("reference"))
    assert engine.speculator.s is not None and engine.speculator.s.num_tokens == 6
    monkeypatch.delenv("FLOTILLA_SPECULATIVE_METHOD")
    assert engine_host._build_leader_engine(_sent_and_parsed("reference")).speculator.s is None


def _config_json() -> dict:
    return json.loads(EngineConfig.from_settings(load_settings(["--engine", "echo", *STATIC], {}), SOLO).to_json())


@pytest.mark.parametrize(
    "change, key",
    [
        (lambda d: d.pop("max_running"), "max_running"),
        (lambda d: d.update(max_runing=3), "max_runing"),
        (lambda d: d.update(max_running="many"), "max_running"),
    ],
    ids=["missing", "misspelt", "ill-typed"],
)
def test_a_config_with_a_key_missing_or_unknown_fails_naming_it(change, key):
    d = _config_json()
    change(d)
    with pytest.raises(ValidationError, match=key):
        EngineConfig.from_json(json.dumps(d))


def test_the_engine_process_refuses_a_config_with_an_unknown_key_at_start():
    d = {**_config_json(), "max_runing": 3}
    env = {**os.environ, CONFIG_ENV: json.dumps(d)}
    done = subprocess.run(
        [sys.executable, "-m", "runtime.node.engine_host"],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert b"max_runing" in done.stderr


PAIR = membership([("10.0.0.1", 8000), ("10.0.0.2", 8000)], revision="1", dist_port=1)


def _neuron_config_json() -> dict:
    s = load_settings(["--engine", "neuron", *STATIC], {contract.ENV_MODEL_URI: "s3://bucket/model/"})
    return json.loads(EngineConfig.from_settings(s, PAIR).to_json())


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: d["membership"].pop("members"), "membership: keys missing members"),
        (lambda d: d["membership"].update(leader=0), "membership: keys unknown leader"),
        (lambda d: d["membership"]["members"][1].pop("instance_id"), "membership.members.1: keys missing instance_id"),
        (lambda d: d["membership"]["members"][0].update(zone="a"), "membership.members.0: keys unknown zone"),
        (lambda d: d["neuron"].pop("seq_len"), "neuron: keys missing seq_len"),
        (lambda d: d["neuron"].update(seq_length=1), "neuron: keys unknown seq_length"),
        (lambda d: d["speculation"].pop("num_speculative_tokens"), "speculation: keys missing num_speculative_tokens"),
    ],
    ids=[
        "members-missing",
        "membership-unknown",
        "member-missing",
        "member-unknown",
        "neuron-missing",
        "neuron-unknown",
        "speculation-missing",
    ],
)
def test_a_nested_part_with_a_key_missing_or_unknown_fails_naming_it_like_the_top_level(change, message):
    d = _neuron_config_json()
    assert EngineConfig.from_json(json.dumps(d)).membership == PAIR  # whole, it reads back as sent
    change(d)
    with pytest.raises(ValidationError, match=message):
        EngineConfig.from_json(json.dumps(d))
