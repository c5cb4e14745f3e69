"""The router's event loop: uvloop (pinned in runtime/requirements.txt) when it imports, asyncio's
own loop otherwise, and the choice said at start.

uvloop's README (MagicStack/uvloop, "Using uvloop") runs a coroutine on it under Python 3.11 with
`asyncio.Runner(loop_factory=uvloop.new_event_loop)`, the form the router uses."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from runtime.router import cli
from runtime.router.settings import router_command

REPO = Path(__file__).resolve().parents[2]


def pinned_uvloop() -> str:
    for line in (REPO / "runtime" / "requirements.txt").read_text().splitlines():
        if line.startswith("uvloop=="):
            return line.split("==", 1)[1]
    raise AssertionError("runtime/requirements.txt pins no uvloop")


def start_and_stop_router(*flags: str) -> tuple[list[dict], str]:
    """A router over one unreachable unit, stopped as soon as it listens: its JSON log lines, and
    the shared objects its process had loaded."""
    proc = subprocess.Popen(
        router_command(
            host="127.0.0.1",
            port=0,
            metrics_port=0,
            units=["http://127.0.0.1:9"],
            drain_grace_s=0,
            log_level="INFO",
            extra=flags,
        ),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith(b"router listening on "), line
        maps = Path(f"/proc/{proc.pid}/maps").read_text()
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    logs = [json.loads(x) for x in err.decode().splitlines() if x.startswith("{")]
    return logs, maps


def loop_lines(logs: list[dict]) -> list[str]:
    return [str(x.get("msg")) for x in logs if str(x.get("msg", "")).startswith("router event loop:")]


def test_router_runs_on_the_pinned_uvloop_by_default_and_says_so_at_start():
    logs, maps = start_and_stop_router()
    assert loop_lines(logs) == [f"router event loop: uvloop {pinned_uvloop()}"]
    assert "/uvloop/loop." in maps  # the libuv-backed loop is what the process runs, not only a log line


def test_event_loop_asyncio_keeps_the_standard_loop_and_says_so():
    logs, maps = start_and_stop_router("--event-loop", "asyncio")
    assert loop_lines(logs) == ["router event loop: asyncio (--event-loop asyncio)"]
    assert "/uvloop/loop." not in maps


def test_auto_falls_back_to_asyncio_when_uvloop_is_not_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop now raises ImportError
    factory, name = cli.event_loop_factory("auto")
    assert factory is None
    assert name == "asyncio (uvloop is not installed)"


def test_event_loop_uvloop_without_uvloop_is_a_one_line_error_naming_the_flag(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "uvloop", None)
    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers())
    args = parser.parse_args(["router", "--event-loop", "uvloop", "--units", "http://127.0.0.1:9"])
    assert cli.run(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "router: --event-loop uvloop needs the uvloop package (pip install uvloop)"


@pytest.mark.parametrize("choice", ["auto", "uvloop"])
def test_auto_and_uvloop_build_uvloop_loops(choice):
    import uvloop

    factory, _ = cli.event_loop_factory(choice)
    assert factory is uvloop.new_event_loop
