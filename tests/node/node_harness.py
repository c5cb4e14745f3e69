"""Start real unit members (`python -m runtime node`) on 127.0.0.1 for tests; every wait is bounded."""

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
from typing import Any

import contract
from testnet import free_port

REPO = Path(__file__).resolve().parents[2]


def get_json(url: str, timeout: float = 2.0) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def wait_for(predicate, *, timeout: float, what: str, every: float = 0.1):
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
            if last:
                return last
        except OSError as e:
            last = e
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


class Member:
    def __init__(self, unit: "Unit", rank: int) -> None:
        self.unit, self.rank = unit, rank
        self.port = unit.ports[rank]
        self.proc: subprocess.Popen | None = None
        self.log_path = unit.log_dir / f"rank{rank}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, **env: str) -> "Member":
        e = {**os.environ, **self.unit.env, **env, contract.ENV_RANK: str(self.rank),
             "PYTHONPATH": os.pathsep.join([str(REPO), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])}
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "runtime", "node"], env=e, cwd=str(REPO),
                                     stdout=log, stderr=subprocess.STDOUT)
        log.close()
        return self

    def ready(self) -> tuple[int, Any]:
        return get_json(self.url + contract.NODE_READY_PATH)

    def live(self) -> tuple[int, Any]:
        return get_json(self.url + contract.NODE_LIVE_PATH)

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=10)

    def sigterm(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)

    def wait(self, timeout: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)

    def emf_lines(self) -> list[dict]:
        """The CloudWatch EMF lines this member wrote to stdout (its log holds stdout and stderr)."""
        return [json.loads(line) for line in self.log_path.read_text(errors="replace").splitlines()
                if line.startswith('{"_aws"')]

    def log_events(self, event: str) -> list[dict]:
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            if line.startswith("{") and f'"event": "{event}"' in line:
                out.append(json.loads(line))
        return out


class Unit:
    """world_size members of one unit; rank 0 leads."""

    def __init__(self, tmp: Path, *, world_size: int = 2, engine: str = "reference", model: str = "tiny",
                 revision: str = "r1", **env: str) -> None:
        self.ports = [free_port() for _ in range(world_size)]
        self.dist_port = free_port()
        self.log_dir = tmp
        self.env = {contract.ENV_PEERS: ",".join(f"127.0.0.1:{p}" for p in self.ports),
                    contract.ENV_UNIT_ID: "unit-t", contract.ENV_REVISION: revision,
                    contract.ENV_ENGINE: engine, contract.ENV_MODEL: model, "FLOTILLA_DIST_PORT": str(self.dist_port),
                    "FLOTILLA_BIND_HOST": "127.0.0.1", "FLOTILLA_PEER_DEAD_AFTER_S": "2",
                    "FLOTILLA_TORCH_THREADS": "1", "FLOTILLA_COLLECTIVE_TIMEOUT_S": "10",
                    "FLOTILLA_MAX_TOKENS_LIMIT": "2048", **env}
        self.members = [Member(self, r) for r in range(world_size)]

    @property
    def leader(self) -> Member:
        return self.members[0]

    @property
    def url(self) -> str:
        return self.leader.url + "/v1"

    def start(self) -> "Unit":
        for m in self.members:
            m.start()
        return self

    def wait_ready(self, timeout: float = 120.0) -> None:
        for m in self.members:
            wait_for(lambda m=m: m.ready()[0] == 200, timeout=timeout, what=f"rank {m.rank} ready")

    def stop(self) -> None:
        for m in self.members:
            if m.proc is not None and m.proc.poll() is None:
                m.proc.send_signal(signal.SIGTERM)
        for m in self.members:
            if m.proc is not None:
                try:
                    m.proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    m.proc.kill()
                    m.proc.wait(timeout=10)

    def dump_logs(self) -> str:
        return "\n".join(f"--- rank {m.rank} ---\n" + m.log_path.read_text(errors="replace")[-4000:]
                         for m in self.members if m.log_path.exists())
