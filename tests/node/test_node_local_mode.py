"""`python -m runtime.local` (what `make local` runs), on `tiny` for speed: it starts the unit and
the router, lists every process in local.json, serves, and stops everything cleanly on Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import urllib.request

import pytest

import contract
from node_harness import REPO, free_port, wait_for



def test_local_mode_serves_lists_its_processes_and_stops_cleanly_on_ctrl_c(tmp_path):
    port = free_port()
    state = tmp_path / "state"
    proc = subprocess.Popen([sys.executable, "-m", "runtime.local", "--model", "tiny",
                             "--state-dir", str(state), "--drain-timeout", "10"],
                            cwd=str(REPO), env={**os.environ, contract.ENV_PORT: str(port), "PYTHONPATH": str(REPO)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out: list[str] = []
    threading.Thread(target=lambda: out.extend(proc.stdout), daemon=True).start()
    try:
        wait_for(lambda: any("Ctrl-C stops everything" in line for line in out), timeout=120,
                 what="the launcher to report the unit ready")
        text = "".join(out)
        assert f"http://127.0.0.1:{port}/v1" in text and "curl -N" in text
        manifest = json.loads((state / "local.json").read_text())
        procs = manifest["processes"]
        assert [(p["unit"], p["rank"], p["role"]) for p in procs] == [
            ("local-unit0", 0, "leader"), ("local-unit0", 1, "follower"), (None, None, "router")]
        assert procs[2]["ports"]["http"] == port and procs[0]["ports"]["api"] != port
        for p in procs:
            os.kill(p["pid"], 0)                         # every listed pid is a live process
        body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5})
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body.encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.status == 200 and json.load(r)["object"] == "chat.completion"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
        for p in procs:
            with pytest.raises(ProcessLookupError):
                os.kill(p["pid"], 0)
        assert not (state / "local.json").exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def test_local_mode_gives_every_process_its_own_ports(tmp_path):
    from runtime.local import parse_args, plan_processes
    a = parse_args(["--model", "tiny", "--units", "3", "--port", "18080"])
    procs = plan_processes(a, tmp_path)
    ports = [p for proc in procs for p in proc.ports.values()]
    assert len(ports) == len(set(ports)) and 18080 in ports
    assert [p for p in ports if p == 18080] == [procs[-1].ports["http"]]   # only the router is public
