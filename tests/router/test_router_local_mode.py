"""`make local UNITS=2` (python -m runtime.local --units 2): two units behind the router on the public
port; requests reach both units; Ctrl-C stops the router and every member cleanly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

import contract
from router_real_units import REPO, free_port

pytestmark = pytest.mark.timeout(300)


def test_local_mode_with_two_units_routes_to_both_behind_the_router_and_stops_on_ctrl_c(tmp_path):
    port = free_port()
    state = tmp_path / "state"
    proc = subprocess.Popen([sys.executable, "-m", "runtime.local", "--units", "2", "--model", "tiny",
                             "--state-dir", str(state), "--drain-timeout", "10"],
                            cwd=str(REPO), env={**os.environ, contract.ENV_PORT: str(port), "PYTHONPATH": str(REPO)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out: list[str] = []
    threading.Thread(target=lambda: out.extend(proc.stdout), daemon=True).start()
    try:
        deadline = time.monotonic() + 180
        while not any("Ctrl-C stops everything" in line for line in out):
            assert proc.poll() is None and time.monotonic() < deadline, "".join(out)
            time.sleep(0.2)
        procs = json.loads((state / "local.json").read_text())["processes"]
        assert sorted((p["unit"] or "", p["role"]) for p in procs) == [
            ("", "router"), ("local-unit0", "follower"), ("local-unit0", "leader"),
            ("local-unit1", "follower"), ("local-unit1", "leader")]
        router = next(p for p in procs if p["role"] == "router")
        assert router["ports"]["http"] == port
        served = set()
        body = json.dumps({"model": "tiny", "prompt": "hi", "max_tokens": 3}).encode()
        for _ in range(40):
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=30) as r:
                assert r.status == 200
                served.add(r.headers[contract.UNIT_HEADER])
            if len(served) == 2:
                break
        assert served == {"local-unit0", "local-unit1"}
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            assert "flotilla_router_routable_units 2.0" in r.read().decode()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
        for p in procs:
            with pytest.raises(ProcessLookupError):
                os.kill(p["pid"], 0)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
