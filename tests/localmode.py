"""`python -m runtime.local` (what `make local` runs) as a real process for tests: started on a free
public port, waited for until it says it is ready, stopped with Ctrl-C; every wait is bounded."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from testnet import free_port

import contract
from bench.measure import process_tree

REPO = Path(__file__).resolve().parents[1]
READY_BANNER = "Ctrl-C stops everything"


class LocalMode:
    def __init__(self, tmp_path: Path, *args: str, port: int | None = None, env: dict[str, str] | None = None) -> None:
        self.port = port if port is not None else free_port()
        self.state = tmp_path / "state"
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "runtime.local",
                *args,
                "--model",
                "tiny",
                "--state-dir",
                str(self.state),
                "--drain-timeout",
                "10",
            ],
            cwd=str(REPO),
            env={**os.environ, **(env or {}), contract.ENV_PORT: str(self.port), "PYTHONPATH": str(REPO)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.out: list[str] = []
        threading.Thread(target=lambda: self.out.extend(self.proc.stdout), daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 180.0) -> None:
        """Until the launcher prints its ready banner; fails at once if the launcher exits."""
        deadline = time.monotonic() + timeout
        while not any(READY_BANNER in line for line in self.out):
            assert self.proc.poll() is None, f"local mode exited with {self.proc.returncode}:\n{''.join(self.out)}"
            assert time.monotonic() < deadline, f"local mode not ready after {timeout} s:\n{''.join(self.out)}"
            time.sleep(0.2)

    def processes(self) -> list[dict[str, Any]]:
        return json.loads((self.state / "local.json").read_text())["processes"]

    def metrics_url(self) -> str:
        """The router's /metrics: its own port, never the public one."""
        router = next(p for p in self.processes() if p["role"] == "router")
        return f"http://127.0.0.1:{router['ports']['metrics']}{contract.METRICS_PATH}"

    def ctrl_c(self, processes: list[dict[str, Any]]) -> None:
        """Ctrl-C: the launcher exits 0 and every process it listed is gone."""
        self.proc.send_signal(signal.SIGINT)
        assert self.proc.wait(timeout=60) == 0
        for p in processes:
            with pytest.raises(ProcessLookupError):
                os.kill(p["pid"], 0)

    def kill(self) -> None:
        """Teardown, whatever happened: never leave the launcher or anything it started running (its
        nodes, engines and router live in sessions of their own, so killing the launcher alone would
        leave them to init)."""
        if self.proc.poll() is None:
            for pid in reversed(process_tree(self.proc.pid)):  # the launcher last: its children first
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self.proc.wait(timeout=10)
