"""Shared fixtures: the built-in models, free ports, and a launcher for 2-rank harness jobs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from testnet import free_port

REPO = Path(__file__).resolve().parents[2]
HARNESS = Path(__file__).with_name("harness.py")


@pytest.fixture(scope="session")
def smollm2_dir():
    from runtime.models.smollm2 import ensure_smollm2

    return ensure_smollm2()


def start_rank(job: str, rank: int, port: int, spec_file: Path, out: Path) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    return subprocess.Popen(
        [sys.executable, str(HARNESS), job, str(rank), str(port), str(spec_file), str(out)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )


# A job's bound catches a hang, not slowness: the `engine` job (four units of SmolLM2 in turn) took
# longer than 240 s on a 2-core AMD EPYC at load average 18-22, against well under that on a quiet
# Intel Xeon. Just under pytest's --timeout (pytest.ini), so the job's own error, naming it, comes first.
JOB_TIMEOUT_S = 540


def run_job(job: str, spec: dict, tmp_path: Path, *, timeout: float = JOB_TIMEOUT_S, ports: int = 4):
    """Run a 2-rank harness job to completion; returns rank 0's saved findings."""
    spec_file, out = tmp_path / f"{job}.json", tmp_path / f"{job}.pt"
    spec_file.write_text(json.dumps(spec))
    port = free_port(ports)
    procs = [start_rank(job, r, port, spec_file, out) for r in range(2)]
    try:
        for p in procs:
            p.wait(timeout=timeout)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0], f"harness {job} ranks exited {[p.returncode for p in procs]}"
    return torch.load(out, weights_only=False)


@pytest.fixture(scope="session")
def two_rank_job():
    """run_job(job, spec, tmp_path): a 2-rank harness job (see harness.py)."""
    return run_job


class RankProcess:
    """A harness rank whose JSON stdout lines can be awaited with a timeout."""

    def __init__(self, job: str, rank: int, port: int, spec_file: Path, out: Path) -> None:
        import queue
        import threading

        self.proc = start_rank(job, rank, port, spec_file, out)
        self.lines: "queue.Queue[dict]" = queue.Queue()
        self.seen: list[dict] = []  # every JSON line so far, for assertions on what was said
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            self.seen.append(msg)
            self.lines.put(msg)

    def wait_for(self, key: str, timeout: float) -> dict:
        import queue
        import time

        deadline = time.monotonic() + timeout
        while True:
            try:
                msg = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no {key!r} line from the harness within {timeout} s")
            if key in msg:
                return msg


@pytest.fixture
def launch_rank():
    """launch_rank(job, rank, port, spec_file, out) -> RankProcess; killed at teardown if alive."""
    started = []

    def launch(*args) -> RankProcess:
        rp = RankProcess(*args)
        started.append(rp)
        return rp

    yield launch
    for rp in started:
        if rp.proc.poll() is None:
            rp.proc.kill()
        rp.proc.wait(timeout=30)


@pytest.fixture
def free_ports():
    return free_port
