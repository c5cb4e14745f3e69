"""Real unit members (`python -m runtime node`) on 127.0.0.1, for every suite that needs them.

`Unit(log_dir, world_size=N, **settings)` is N members with static rendezvous: start it, wait until
it is ready or a member logs an event, read a member's JSON log lines, SIGTERM/SIGKILL a member and
start it again, stop everything. Every wait is bounded; every process is stopped by its own handle.
Tests that start units take the `new_unit` fixture (tests/conftest.py), which stops them all.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from testnet import free_port

import contract
from bench.measure import process_tree

REPO = Path(__file__).resolve().parents[1]
T = TypeVar("T")


# The leader's load in /health/ready, as docs/node.md documents it (the router and `flotilla status`
# read these keys).
READY_LOAD_KEYS = {
    "queue_depth",
    "running",
    "max_running",
    "kv_cache_used",
    "in_flight",
    "prefill_tokens",
    "wait_s",
    "queue_timeout_s",
    "prefix_cache_queries",
    "prefix_cache_hits",
    "prefix_cache_hit_rate",
    "step_s",
    "spec_draft_tokens",
    "spec_accepted_tokens",
    "spec_acceptance_rate",
    "tokens_per_step",
}


def get_json(url: str, timeout: float = 2.0) -> tuple[int, Any]:
    """(status, parsed body) of a GET; an HTTP error status is an answer, not an exception."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def wait_for(predicate: Callable[[], T], *, timeout: float, what: str, every: float = 0.1) -> T:
    """predicate()'s first truthy value, polled every `every` s; an OSError (nothing listening
    yet) counts as not yet. Fails naming `what` and the last value seen after `timeout` s."""
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
    """One rank of a Unit: its own process, port and log file (stdout and stderr together)."""

    def __init__(self, unit: Unit, rank: int) -> None:
        self.unit, self.rank = unit, rank
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.log_path = unit.log_dir / f"{unit.name}-rank{rank}.log"

    @property
    def url(self) -> str:
        """This member's HTTP root (health, metrics; the leader's also serves /v1)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, **env: str) -> Member:
        """Start (or, after it exited, start again) this member; `env` overrides the unit's
        settings for this start only. A PYTHONPATH given here or to the Unit goes after the repo."""
        assert not self.running, f"{self.unit.name} rank {self.rank} is already running"
        settings = {**self.unit.env, **env}
        extra_path = [settings.pop("PYTHONPATH")] if settings.get("PYTHONPATH") else []
        full_env = {
            **os.environ,
            **settings,
            contract.ENV_RANK: str(self.rank),
            "PYTHONPATH": os.pathsep.join([str(REPO), *extra_path]),
        }
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "runtime", "node"],
                env=full_env,
                cwd=str(REPO),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        return self

    def ready(self) -> tuple[int, Any]:
        return get_json(self.url + contract.NODE_READY_PATH)

    def live(self) -> tuple[int, Any]:
        return get_json(self.url + contract.NODE_LIVE_PATH)

    def sigterm(self) -> None:
        """Ask this member to drain and exit (what ECS does when it stops a task)."""
        assert self.proc is not None, f"{self.unit.name} rank {self.rank} was never started"
        self.proc.send_signal(signal.SIGTERM)

    def sigkill(self) -> None:
        """kill -9, then reap: the member is gone when this returns."""
        assert self.proc is not None, f"{self.unit.name} rank {self.rank} was never started"
        self.proc.kill()
        self.proc.wait(timeout=10)

    def sigkill_with_engine(self) -> None:
        """kill -9 this member and its engine process (which runs in a session of its own, so killing
        the member alone would leave it running), then reap the member."""
        for pid in reversed(self._tree()):  # the member last: its engine first
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.wait(timeout=10)

    def sigstop(self) -> None:
        """Freeze this member and its engine process (a gray failure, as a paused container: its
        sockets stay open, nothing it owes arrives). The engine runs in its own session, so it is
        signalled by pid."""
        for pid in self._tree():
            os.kill(pid, signal.SIGSTOP)

    def sigstop_node(self) -> None:
        """Freeze only this member's own process, not its engine: a node whose loop is held up (a busy
        host, a long pause) while its engine keeps computing. sigcont lets it go."""
        assert self.proc is not None, f"{self.unit.name} rank {self.rank} was never started"
        os.kill(self.proc.pid, signal.SIGSTOP)

    def sigcont(self) -> None:
        for pid in self._tree():
            os.kill(pid, signal.SIGCONT)

    def sigstop_engine(self) -> None:
        """Freeze only this member's engine process (a hung engine: the member itself keeps answering
        HTTP, its watch and its health checks, while no step completes). sigcont lets it go."""
        assert self.proc is not None, f"{self.unit.name} rank {self.rank} was never started"
        for pid in self._tree():
            if pid != self.proc.pid:
                os.kill(pid, signal.SIGSTOP)

    def _tree(self) -> list[int]:
        """This member's pid and its descendants'."""
        assert self.proc is not None, f"{self.unit.name} rank {self.rank} was never started"
        return process_tree(self.proc.pid)

    def wait(self, timeout: float) -> int:
        """This member's exit status, once it exits (at most `timeout` s)."""
        assert self.proc is not None, f"{self.unit.name} rank {self.rank} was never started"
        return self.proc.wait(timeout=timeout)

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM and wait; kill -9 if it has not exited after `timeout` s."""
        if self.running:
            self.sigterm()
        if self.proc is not None:
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.sigkill()

    def _lines(self) -> list[str]:
        if not self.log_path.exists():
            return []
        # The last piece may be a line the member is still writing: only whole lines count.
        return self.log_path.read_text(errors="replace").split("\n")[:-1]

    def log_lines(self) -> list[dict]:
        """Every log line this member wrote so far: JSON objects with "ts" and "event"
        (runtime/logs.py). Other output (EMF lines, a traceback's text) is left out."""
        out = []
        for line in self._lines():
            if line.startswith("{") and not line.startswith('{"_aws"'):
                rec = json.loads(line)
                if "event" in rec:
                    out.append(rec)
        return out

    def log_events(self, event: str) -> list[dict]:
        """The log lines of one event, in the order written."""
        return [rec for rec in self.log_lines() if rec["event"] == event]

    def wait_for_event(self, event: str, *, timeout: float) -> list[dict]:
        """The lines of `event`, once there is at least one (at most `timeout` s)."""
        return wait_for(
            lambda: self.log_events(event), timeout=timeout, what=f"{self.unit.name} rank {self.rank} to log {event!r}"
        )

    def emf_lines(self) -> list[dict]:
        """The CloudWatch EMF lines this member wrote to stdout."""
        return [json.loads(line) for line in self._lines() if line.startswith('{"_aws"')]


class Unit:
    """world_size members of one unit on 127.0.0.1 with static rendezvous; rank 0 leads.

    Settings are environment variables (contract.ENV_*, FLOTILLA_*); the defaults here keep a unit
    quick to form and quick to notice a dead peer on a busy 2-core machine. `unit.env` may be
    changed before a member starts."""

    def __init__(
        self,
        log_dir: Path,
        *,
        name: str = "unit-t",
        world_size: int = 2,
        engine: str = "reference",
        model: str = "tiny",
        revision: str = "r1",
        **env: str,
    ) -> None:
        self.name, self.log_dir = name, Path(log_dir)
        self.members = [Member(self, rank) for rank in range(world_size)]
        clash = [m.log_path.name for m in self.members if m.log_path.exists()]
        assert not clash, f"another unit named {name!r} already logs to {log_dir}: {clash}"
        self.env = {
            contract.ENV_PEERS: ",".join(f"127.0.0.1:{m.port}" for m in self.members),
            contract.ENV_RENDEZVOUS: "static",
            contract.ENV_UNIT_ID: name,
            contract.ENV_REVISION: revision,
            contract.ENV_ENGINE: engine,
            contract.ENV_MODEL: model,
            "FLOTILLA_DIST_PORT": str(free_port()),
            "FLOTILLA_BIND_HOST": "127.0.0.1",
            "FLOTILLA_PEER_DEAD_AFTER_S": "2",
            "FLOTILLA_TORCH_THREADS": "1",
            "FLOTILLA_COLLECTIVE_TIMEOUT_S": "10",
            "FLOTILLA_MAX_TOKENS_LIMIT": "2048",
            **env,
        }

    @property
    def leader(self) -> Member:
        return self.members[0]

    @property
    def url(self) -> str:
        """The leader's OpenAI-compatible API base (…/v1), what a client's base_url is."""
        return self.leader.url + "/v1"

    def start(self) -> Unit:
        for m in self.members:
            m.start()
        return self

    def wait_ready(self, timeout: float = 120.0) -> Unit:
        """Until every member reports the unit ready; fails at once, with the logs, if a member
        is not running."""
        deadline = time.monotonic() + timeout
        for m in self.members:
            while True:
                if not m.running:
                    raise AssertionError(
                        f"{self.name} rank {m.rank} is not running "
                        f"(exit status {m.proc and m.proc.returncode}):\n{self.dump_logs()}"
                    )
                try:
                    if m.ready()[0] == 200:
                        break
                except OSError:
                    pass  # not listening yet
                if time.monotonic() > deadline:
                    raise AssertionError(f"{self.name} not ready after {timeout}s:\n{self.dump_logs()}")
                time.sleep(0.1)
        return self

    def sigterm(self) -> None:
        """SIGTERM every running member (ECS stopping the unit's tasks)."""
        for m in self.members:
            if m.running:
                m.sigterm()

    def thaw(self) -> None:
        """SIGCONT every running member: one a test froze (sigstop) would never stop otherwise."""
        for m in self.members:
            if m.running:
                m.sigcont()

    def exited(self) -> bool:
        return not any(m.running for m in self.members)

    def stop(self) -> None:
        """SIGTERM every member, wait, kill -9 what is left. Safe to call more than once."""
        self.sigterm()
        for m in self.members:
            m.stop()

    def continued_requests(self, *, wait_s: float = 0.0) -> list[dict]:
        """The log records of the requests this unit's leader continued from another unit's tokens. With
        wait_s, waits up to that long for the first one: the node logs a request as its handler returns,
        after the stream's last byte went out, so a client can hold a whole moved answer a moment before
        the record is written (runs under load lost that race)."""

        def moved() -> list[dict]:
            return [r for r in self.leader.log_events("request") if r.get("continued_from")]

        if not wait_s:
            return moved()
        return wait_for(moved, timeout=wait_s, what=f"{self.name} to log the request it continued")

    def dump_logs(self, chars: int = 4000) -> str:
        """The end of every member's log, for a failure message."""
        return "\n".join(
            f"--- {m.log_path.name} ---\n" + m.log_path.read_text(errors="replace")[-chars:]
            for m in self.members
            if m.log_path.exists()
        )
