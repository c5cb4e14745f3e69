"""`flotilla status` against real unit members (`python -m runtime node`, echo engine, static
rendezvous on 127.0.0.1): the CLI reads the node runtime's own /health/ready, not a stand-in."""

from __future__ import annotations

import json

import pytest
from nodeproc import READY_LOAD_KEYS, wait_for

import contract


@pytest.fixture
def real_unit(new_unit):
    unit = new_unit(name="cell0-unit0", revision="1", engine="echo", **{contract.ENV_CELL_ID: "cell0"})
    return unit.start().wait_ready(timeout=90)


def test_status_reads_real_members_and_exits_critical_once_a_follower_dies(fleet, real_unit, run_cli):
    unit = fleet.add_unit(cell=0, index=0, ports=[m.port for m in real_unit.members])
    # status reads a follower through its leader, whose word on it trails the follower's own
    # /health/ready by up to a handshake round (docs/node.md): wait for that word, not the follower.
    wait_for(
        lambda: (lambda b: b["members"] and all(m["ready"] for m in b["members"]))(real_unit.leader.ready()[1]),
        timeout=30,
        what="the leader to report its follower ready",
    )
    code, out = run_cli("status", "--json")
    assert code == 0, out
    nodes = json.loads(out)[0]["nodes"]
    assert [(n["rank"], n["role"], n["ready"], n["state"]) for n in nodes] == [
        (0, "leader", True, "ready"),
        (1, "follower", True, "ready"),
    ]
    assert nodes[0]["instance_id"] == unit.nodes[0].instance_id
    assert set(nodes[0]["health"]["load"]) == READY_LOAD_KEYS

    real_unit.members[1].sigkill()  # the follower dies: the leader must stop reporting ready
    wait_for(lambda: real_unit.leader.ready()[0] != 200, timeout=30, what="the leader to report the unit unready")
    code, out = run_cli("status", "--health-timeout", "1")
    assert code == 3  # the fleet's only unit is down: below the FleetReadyUnits threshold of 1
    assert f"node {unit.nodes[1].instance_id} unreachable" in out
