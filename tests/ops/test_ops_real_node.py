"""`flotilla status` against real unit members (`python -m runtime node`, echo engine, static
rendezvous on 127.0.0.1): the CLI reads the node runtime's own /health/ready, not a stand-in."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import contract
from testnet import free_port

REPO = Path(__file__).resolve().parents[2]


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{contract.NODE_READY_PATH}", timeout=1) as r:
            return json.load(r).get("ready") is True
    except (urllib.error.URLError, OSError, ValueError):
        return False


@pytest.fixture
def real_unit(tmp_path):
    ports, dist_port = [free_port(), free_port()], free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), contract.ENV_PEERS: ",".join(f"127.0.0.1:{p}" for p in ports),
           contract.ENV_UNIT_ID: "cell0-unit0", contract.ENV_CELL_ID: "cell0", contract.ENV_REVISION: "1",
           contract.ENV_ENGINE: "echo", contract.ENV_RENDEZVOUS: "static", "FLOTILLA_DIST_PORT": str(dist_port),
           "FLOTILLA_BIND_HOST": "127.0.0.1", "FLOTILLA_PEER_DEAD_AFTER_S": "2"}
    procs = []
    for rank in range(2):
        log = open(tmp_path / f"rank{rank}.log", "ab")
        procs.append(subprocess.Popen([sys.executable, "-m", "runtime", "node"], cwd=REPO, stdout=log,
                                      stderr=subprocess.STDOUT, env={**env, contract.ENV_RANK: str(rank)}))
        log.close()
    deadline = time.monotonic() + 90
    while not all(_ready(p) for p in ports):
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            logs = "\n".join((tmp_path / f"rank{r}.log").read_text()[-2000:] for r in range(2))
            pytest.fail(f"the real unit did not become ready:\n{logs}")
        time.sleep(0.2)
    yield ports, procs
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)


def test_status_reads_real_members_and_exits_one_once_a_follower_dies(fleet, real_unit, run_cli):
    ports, procs = real_unit
    unit = fleet.add_unit(cell=0, index=0, ports=ports)
    code, out = run_cli("status", "--json")
    assert code == 0, out
    nodes = json.loads(out)[0]["nodes"]
    assert [(n["rank"], n["role"], n["ready"], n["state"]) for n in nodes] == [
        (0, "leader", True, "ready"), (1, "follower", True, "ready")]
    assert nodes[0]["instance_id"] == unit.nodes[0].instance_id
    assert set(nodes[0]["health"]["load"]) == {"queue_depth", "running", "max_running", "kv_cache_used"}

    procs[1].kill()          # the follower dies: the leader must stop reporting ready
    procs[1].wait(timeout=10)
    deadline = time.monotonic() + 30
    while _ready(ports[0]) and time.monotonic() < deadline:
        time.sleep(0.2)
    code, out = run_cli("status", "--health-timeout", "1")
    assert code == 1
    assert f"node {unit.nodes[1].instance_id} unreachable" in out
