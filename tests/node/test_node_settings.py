"""Node settings: flags over environment variables, one-line errors naming the setting and the fix."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

import contract
from runtime.node.settings import (
    DOCS,
    NEURON_SETTINGS,
    SETTINGS,
    STRATEGIES,
    SettingsError,
    build_parser,
    docs_with_settings,
    load_settings,
)
from runtime.rendezvous.static import StaticRendezvous

PEERS = "10.0.0.1:8000,10.0.0.2:8000"
REPO = Path(__file__).resolve().parents[2]


def test_static_settings_come_from_the_environment():
    s = load_settings(
        [],
        {
            contract.ENV_PEERS: PEERS,
            contract.ENV_RANK: "1",
            contract.ENV_REVISION: "r7",
            contract.ENV_UNIT_ID: "cell0-unit3",
            contract.ENV_DRAIN_TIMEOUT: "12.5",
        },
    )
    assert (s.rank, s.world_size, s.api_port, s.revision, s.unit_id) == (1, 2, 8000, "r7", "cell0-unit3")
    assert s.drain_timeout_s == 12.5
    assert s.dist_port == contract.DIST_PORT


def test_the_cell_comes_from_the_environment_or_flag_and_is_empty_locally():
    base = {contract.ENV_PEERS: PEERS, contract.ENV_RANK: "0"}
    assert load_settings([], base).cell_id == ""
    assert load_settings([], {**base, contract.ENV_CELL_ID: "cell3"}).cell_id == "cell3"
    assert load_settings(["--cell", "cell4"], {**base, contract.ENV_CELL_ID: "cell3"}).cell_id == "cell4"


def test_flags_win_over_environment_variables():
    s = load_settings(
        ["--rank", "0", "--revision", "flag"],
        {contract.ENV_PEERS: PEERS, contract.ENV_RANK: "1", contract.ENV_REVISION: "env"},
    )
    assert (s.rank, s.revision) == (0, "flag")


def test_ecs_settings_need_the_node_count_and_default_the_port():
    s = load_settings([], {contract.ENV_RENDEZVOUS: "ecs", contract.ENV_NODES_PER_UNIT: "4"})
    assert (s.world_size, s.api_port, s.rank) == (4, contract.NODE_API_PORT, None)


@pytest.mark.parametrize(
    "env, argv, names",
    [
        ({}, [], [contract.ENV_PEERS, "required"]),
        ({contract.ENV_PEERS: PEERS}, [], [contract.ENV_RANK, "from 0 to 1"]),
        ({contract.ENV_PEERS: PEERS, contract.ENV_RANK: "2"}, [], [contract.ENV_RANK, "from 0 to 1"]),
        ({contract.ENV_PEERS: PEERS, contract.ENV_RANK: "one"}, [], [contract.ENV_RANK, "integer"]),
        ({contract.ENV_PEERS: "10.0.0.1", contract.ENV_RANK: "0"}, [], [contract.ENV_PEERS, "host:port"]),
        ({contract.ENV_PEERS: "a:1,a:1", contract.ENV_RANK: "0"}, [], [contract.ENV_PEERS, "twice"]),
        ({contract.ENV_PEERS: "a:99999", contract.ENV_RANK: "0"}, [], ["port", "from 1 to 65535"]),
        (
            {contract.ENV_PEERS: PEERS, contract.ENV_RANK: "0", contract.ENV_PORT: "9000"},
            [],
            [contract.ENV_PORT, "agree"],
        ),
        ({contract.ENV_RENDEZVOUS: "k8s"}, [], [contract.ENV_RENDEZVOUS, "static, ecs"]),
        ({contract.ENV_RENDEZVOUS: "ecs"}, [], [contract.ENV_NODES_PER_UNIT, "required"]),
        ({contract.ENV_PEERS: PEERS}, ["--rank", "0", "--engine", "vllm"], ["--engine", "reference"]),
        (
            {contract.ENV_PEERS: PEERS, contract.ENV_RANK: "0", contract.ENV_MODEL: "/no/such/dir"},
            [],
            [contract.ENV_MODEL, "checkpoint"],
        ),
        (
            {contract.ENV_PEERS: PEERS, contract.ENV_RANK: "0", contract.ENV_DRAIN_TIMEOUT: "-1"},
            [],
            [contract.ENV_DRAIN_TIMEOUT, "of at least 0"],
        ),
        (
            {contract.ENV_PEERS: PEERS, contract.ENV_RANK: "0", contract.ENV_DRAIN_TIMEOUT: "nan"},
            [],
            [contract.ENV_DRAIN_TIMEOUT],
        ),
        (
            {contract.ENV_PEERS: PEERS, contract.ENV_RANK: "0", contract.ENV_DECODE_STRATEGY: "data"},
            [],
            [contract.ENV_DECODE_STRATEGY, "pipeline, tensor"],
        ),
        (
            {contract.ENV_PEERS: PEERS, contract.ENV_RANK: "0", contract.ENV_REVISION: " "},
            [],
            [contract.ENV_REVISION, "empty"],
        ),
        (
            {contract.ENV_PEERS: PEERS, contract.ENV_RANK: "0", "FLOTILLA_QUEUE_TIMEOUT_S": "0"},
            [],
            ["FLOTILLA_QUEUE_TIMEOUT_S=0", "of at least 0.01"],
        ),
        (
            {contract.ENV_PEERS: PEERS, contract.ENV_RANK: "0", "FLOTILLA_REQUEST_TIMEOUT_S": "10"},
            [],
            ["FLOTILLA_QUEUE_TIMEOUT_S", "FLOTILLA_REQUEST_TIMEOUT_S", "at most 10"],
        ),
        (
            {contract.ENV_PEERS: PEERS, contract.ENV_RANK: "0"},
            ["--queue-timeout", "30", "--request-timeout", "20"],
            ["--queue-timeout=30", "at most 20"],
        ),
    ],
)
def test_bad_settings_name_the_setting_and_the_fix(env, argv, names):
    with pytest.raises(SettingsError) as e:
        load_settings(argv, env)
    msg = str(e.value)
    assert "\n" not in msg
    for n in names:
        assert n in msg


def run_node(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`python -m runtime node` from the checkout with only `env`, to its exit."""
    return subprocess.run(
        [sys.executable, "-m", "runtime", "node"],
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=str(__import__("pathlib").Path(__file__).resolve().parents[2]),
    )


def test_the_command_exits_2_with_a_one_line_error():
    env = {"PATH": "/usr/bin:/bin", contract.ENV_PEERS: PEERS, contract.ENV_RANK: "5"}
    r = run_node(env)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"flotilla-node: error: {contract.ENV_RANK}=5 is out of range: give an integer from 0 to 1"
    ]


def test_static_rendezvous_gives_ranks_in_peer_order_with_rank_0_leading():
    r = StaticRendezvous(
        unit_id="u", revision="r", peers=[("10.0.0.1", 8000), ("10.0.0.2", 8001)], rank=1, dist_port=29500
    )
    m = asyncio.run(r.join())
    assert (m.rank, m.world_size, m.role, m.dist_host, m.dist_port) == (1, 2, "follower", "10.0.0.1", 29500)
    assert [(x.rank, x.host, x.api_port) for x in m.members] == [(0, "10.0.0.1", 8000), (1, "10.0.0.2", 8001)]
    assert asyncio.run(r.changed(m)) is False


def test_ecs_rendezvous_outside_ecs_exits_2_naming_the_metadata_variable():
    env = {"PATH": "/usr/bin:/bin", contract.ENV_RENDEZVOUS: "ecs", contract.ENV_NODES_PER_UNIT: "2", "PORT": "18999"}
    r = run_node(env)
    assert r.returncode == 2
    assert "ECS_CONTAINER_METADATA_URI_V4 is not set" in r.stderr and "static" in r.stderr


def test_docs_node_md_shows_the_settings_as_declared():
    doc = DOCS.read_text()
    assert docs_with_settings(doc) == doc, (
        "docs/node.md's settings tables differ from the declarations in runtime/node/settings.py: "
        "run `.venv/bin/python -m runtime.node.settings --write-docs` and commit the result"
    )
    for d in SETTINGS + NEURON_SETTINGS:
        assert f"| `{d.env}` | `{d.flag}` |" in doc, d.env


def test_help_names_every_flag_with_its_environment_variable_and_default():
    text = " ".join(build_parser().format_help().split())
    for d in SETTINGS + NEURON_SETTINGS:
        assert d.flag in text and d.env in text, d.flag
    assert "[FLOTILLA_MAX_RUNNING, default 16]" in text
    assert "[FLOTILLA_FORM_TIMEOUT_S, default 600 (neuron: 3600)]" in text
    assert "--engine {reference,echo,neuron}" in text


def test_the_command_line_help_is_the_declared_help():
    r = subprocess.run(
        [sys.executable, "-m", "runtime", "node", "--help"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=str(REPO),
    )
    assert r.returncode == 0
    assert " ".join(r.stdout.split()).endswith(" ".join(build_parser().format_help().split()[-12:]))
    assert contract.ENV_NODES_PER_UNIT in r.stdout and "--nodes" in r.stdout


# Free text: any string is a valid value.
FREE_TEXT = {"unit_id", "cell_id", "revision", "bind_host", "model_name", "cache_dir", "launcher"}


@pytest.mark.parametrize(
    "d", [d for d in SETTINGS + NEURON_SETTINGS if d.path[-1] not in FREE_TEXT], ids=lambda d: d.env
)
def test_every_checked_setting_refuses_a_bad_value_in_one_line_naming_it(d):
    neuron = {contract.ENV_ENGINE: "neuron", contract.ENV_MODEL_URI: "s3://models/llama"}
    env = {
        contract.ENV_PEERS: PEERS,
        contract.ENV_RANK: "0",
        **(neuron if d.path[0] == "neuron" else {}),
        d.env: "bogus",
    }
    with pytest.raises(SettingsError) as e:
        load_settings([], env)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{d.env}=bogus "), msg
    assert "Input should" not in msg and "validation error" not in msg, msg


def test_a_bad_flag_is_named_as_the_flag_and_says_what_is_allowed():
    with pytest.raises(SettingsError) as e:
        load_settings(
            ["--max-running", "0"], {contract.ENV_PEERS: PEERS, contract.ENV_RANK: "0", "FLOTILLA_MAX_RUNNING": "8"}
        )
    assert str(e.value) == "--max-running=0 is out of range: give an integer from 1 to 4096"


def test_a_flag_wins_over_the_environment_in_the_neuron_group_too():
    env = {
        contract.ENV_PEERS: PEERS,
        contract.ENV_RANK: "0",
        contract.ENV_ENGINE: "neuron",
        contract.ENV_MODEL_URI: "s3://models/llama",
        "FLOTILLA_NEURON_SEQ_LEN": "8192",
    }
    assert load_settings(["--seq-len", "1024"], env).neuron.seq_len == 1024
    assert load_settings([], env).neuron.seq_len == 8192


def test_static_world_size_is_the_peer_count_and_the_node_count_must_agree():
    base = {contract.ENV_PEERS: PEERS, contract.ENV_RANK: "0"}
    assert load_settings(["--nodes", "2"], base).world_size == 2
    with pytest.raises(SettingsError, match="--nodes=3 but 2 peers are listed"):
        load_settings(["--nodes", "3"], base)


def test_the_strategies_are_the_engines_strategies():
    from runtime.engines.calibrate import AUTO
    from runtime.engines.layout import STRATEGIES as ENGINE_STRATEGIES

    assert STRATEGIES == (AUTO, *ENGINE_STRATEGIES)
