"""Node settings: flags over environment variables, one-line errors naming the setting and the fix."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

import contract
from runtime.node.settings import SettingsError, load_settings
from runtime.rendezvous.static import StaticRendezvous

PEERS = "10.0.0.1:8000,10.0.0.2:8000"


def test_static_settings_come_from_the_environment():
    s = load_settings([], {contract.ENV_PEERS: PEERS, contract.ENV_RANK: "1", contract.ENV_REVISION: "r7",
                           contract.ENV_UNIT_ID: "cell0-unit3", contract.ENV_DRAIN_TIMEOUT: "12.5"})
    assert (s.rank, s.world_size, s.api_port, s.revision, s.unit_id) == (1, 2, 8000, "r7", "cell0-unit3")
    assert s.drain_timeout_s == 12.5
    assert s.dist_port == contract.DIST_PORT


def test_the_cell_comes_from_the_environment_or_flag_and_is_empty_locally():
    base = {contract.ENV_PEERS: PEERS, contract.ENV_RANK: "0"}
    assert load_settings([], base).cell_id == ""
    assert load_settings([], {**base, contract.ENV_CELL_ID: "cell3"}).cell_id == "cell3"
    assert load_settings(["--cell", "cell4"], {**base, contract.ENV_CELL_ID: "cell3"}).cell_id == "cell4"


def test_flags_win_over_environment_variables():
    s = load_settings(["--rank", "0", "--revision", "flag"], {contract.ENV_PEERS: PEERS, contract.ENV_RANK: "1",
                                                               contract.ENV_REVISION: "env"})
    assert (s.rank, s.revision) == (0, "flag")


def test_ecs_settings_need_the_node_count_and_default_the_port():
    s = load_settings([], {contract.ENV_RENDEZVOUS: "ecs", contract.ENV_NODES_PER_UNIT: "4"})
    assert (s.world_size, s.api_port, s.rank) == (4, contract.NODE_API_PORT, None)


@pytest.mark.parametrize("env, argv, names", [
    ({}, [], [contract.ENV_PEERS, "required"]),
    ({contract.ENV_PEERS: PEERS}, [], [contract.ENV_RANK, "0..1"]),
    ({contract.ENV_PEERS: PEERS, contract.ENV_RANK: "2"}, [], [contract.ENV_RANK, "0..1"]),
    ({contract.ENV_PEERS: PEERS, contract.ENV_RANK: "one"}, [], [contract.ENV_RANK, "integer"]),
    ({contract.ENV_PEERS: "10.0.0.1", contract.ENV_RANK: "0"}, [], [contract.ENV_PEERS, "host:port"]),
    ({contract.ENV_PEERS: "a:1,a:1", contract.ENV_RANK: "0"}, [], [contract.ENV_PEERS, "twice"]),
    ({contract.ENV_PEERS: "a:99999", contract.ENV_RANK: "0"}, [], ["port", "1..65535"]),
    ({contract.ENV_PEERS: PEERS, contract.ENV_RANK: "0", contract.ENV_PORT: "9000"}, [], [contract.ENV_PORT, "agree"]),
    ({contract.ENV_RENDEZVOUS: "k8s"}, [], [contract.ENV_RENDEZVOUS, "static, ecs"]),
    ({contract.ENV_RENDEZVOUS: "ecs"}, [], [contract.ENV_NODES_PER_UNIT, "required"]),
    ({contract.ENV_PEERS: PEERS}, ["--rank", "0", "--engine", "vllm"], ["--engine", "reference"]),
    ({contract.ENV_PEERS: PEERS, contract.ENV_RANK: "0", contract.ENV_MODEL: "/no/such/dir"}, [], [contract.ENV_MODEL, "checkpoint"]),
    ({contract.ENV_PEERS: PEERS, contract.ENV_RANK: "0", contract.ENV_DRAIN_TIMEOUT: "-1"}, [], [contract.ENV_DRAIN_TIMEOUT, ">= 0"]),
    ({contract.ENV_PEERS: PEERS, contract.ENV_RANK: "0", contract.ENV_DRAIN_TIMEOUT: "nan"}, [], [contract.ENV_DRAIN_TIMEOUT]),
    ({contract.ENV_PEERS: PEERS, contract.ENV_RANK: "0", contract.ENV_DECODE_STRATEGY: "data"}, [], [contract.ENV_DECODE_STRATEGY, "pipeline, tensor"]),
    ({contract.ENV_PEERS: PEERS, contract.ENV_RANK: "0", contract.ENV_REVISION: " "}, [], [contract.ENV_REVISION, "empty"]),
])
def test_bad_settings_name_the_setting_and_the_fix(env, argv, names):
    with pytest.raises(SettingsError) as e:
        load_settings(argv, env)
    msg = str(e.value)
    assert "\n" not in msg
    for n in names:
        assert n in msg


def test_the_command_exits_2_with_a_one_line_error():
    env = {"PATH": "/usr/bin:/bin", contract.ENV_PEERS: PEERS, contract.ENV_RANK: "5"}
    r = subprocess.run([sys.executable, "-m", "runtime", "node"], env=env, capture_output=True, text=True,
                       timeout=60, cwd=str(__import__("pathlib").Path(__file__).resolve().parents[2]))
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"flotilla-node: error: {contract.ENV_RANK}=5 is out of range: give a value in 0..1"]


def test_static_rendezvous_gives_ranks_in_peer_order_with_rank_0_leading():
    r = StaticRendezvous(unit_id="u", revision="r", peers=[("10.0.0.1", 8000), ("10.0.0.2", 8001)], rank=1,
                         dist_port=29500)
    m = asyncio.run(r.join())
    assert (m.rank, m.world_size, m.role, m.dist_host, m.dist_port) == (1, 2, "follower", "10.0.0.1", 29500)
    assert [(x.rank, x.host, x.api_port) for x in m.members] == [(0, "10.0.0.1", 8000), (1, "10.0.0.2", 8001)]
    assert asyncio.run(r.changed(m)) is False


def test_ecs_rendezvous_outside_ecs_exits_2_naming_the_metadata_variable():
    env = {"PATH": "/usr/bin:/bin", contract.ENV_RENDEZVOUS: "ecs", contract.ENV_NODES_PER_UNIT: "2",
           "PORT": "18999"}
    r = subprocess.run([sys.executable, "-m", "runtime", "node"], env=env, capture_output=True, text=True,
                       timeout=60, cwd=str(__import__("pathlib").Path(__file__).resolve().parents[2]))
    assert r.returncode == 2
    assert "ECS_CONTAINER_METADATA_URI_V4 is not set" in r.stderr and "static" in r.stderr


def test_every_setting_is_documented_in_docs_node_md():
    from pathlib import Path

    from runtime.node.settings import _ENV
    doc = (Path(__file__).resolve().parents[2] / "docs" / "node.md").read_text()
    for var, _default in _ENV.values():
        assert f"`{var}`" in doc, var
