"""`flotilla smoke` against `make local` (the same router and leader code as a fleet, tiny model):
every check passes on a healthy front door, the unit roll is skipped with its reason (local mode has
no ECS service; test_ops_smoke_roll.py rolls one on the ECS model); a front door that answers
nothing fails fast with the reason; bad arguments get one line."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from localmode import LocalMode  # noqa: E402
from testnet import free_port  # noqa: E402

pytestmark = pytest.mark.timeout(300)


def test_smoke_passes_every_check_against_local_mode(tmp_path, run_cli):
    local = LocalMode(tmp_path)
    try:
        local.wait_ready(timeout=180)
        code, out = run_cli("smoke", "--url", local.url, "--max-tokens", "8", "--timeout", "60")
        flat = " ".join(out.split())
        assert code == 0, out
        for check in ("models", "chat", "chat, streamed", "completion", "bad request refused"):
            assert check in flat
        assert out.count("PASS") == 6  # five checks and the verdict
        assert "models: tiny" in flat and "400:" in flat
        # Local mode has no ECS service to roll: the roll row says it was skipped and why.
        assert "roll a unit" in flat and "SKIP" in flat
        assert "make local has no ECS service to roll" in flat
        assert "PASS: every check (the unit roll skipped)" in flat
    finally:
        local.kill()


def test_smoke_against_a_dead_url_fails_at_the_first_check_with_the_reason(run_cli):
    code, out = run_cli("smoke", "--url", f"http://127.0.0.1:{free_port()}", "--timeout", "5")
    flat = " ".join(out.split())
    assert code == 1
    assert "FAIL" in flat and "APIConnectionError" in flat and "FAIL: models" in flat


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--url", "alb.example.com"], "--url=alb.example.com has no scheme: give the base URL with it"),
        (["--url", "http://x", "--max-tokens", "0"], "--max-tokens=0 is out of range: give an integer of at least 1"),
    ],
)
def test_smoke_bad_arguments_get_one_line(argv, message, run_cli):
    code, out = run_cli("smoke", *argv)
    assert code == 2 and message in " ".join(out.split())
