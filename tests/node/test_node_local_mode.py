"""`python -m runtime.local` (what `make local` runs), on `tiny` for speed: it starts the unit and
the router, lists every process in local.json, serves, and stops everything cleanly on Ctrl-C."""

from __future__ import annotations

import json
import os
import urllib.request

from localmode import LocalMode


def test_local_mode_gives_every_process_its_own_ports(tmp_path):
    from runtime.local import parse_args, plan_processes

    a = parse_args(["--model", "tiny", "--units", "3", "--port", "18080"])
    procs = plan_processes(a, tmp_path)
    ports = [p for proc in procs for p in proc.ports.values()]
    assert len(ports) == len(set(ports)) and 18080 in ports
    assert [p for p in ports if p == 18080] == [procs[-1].ports["http"]]  # only the router is public


def test_local_mode_serves_lists_its_processes_stops_cleanly_on_ctrl_c_and_starts_again_on_that_port(tmp_path):
    """One launch checked both ways (a launch is most of the test's time). Ctrl-C leaves the public
    port's closed connections in TIME_WAIT for a minute; the servers bind over them with SO_REUSEADDR,
    so the launcher's check that the port is free must do the same: a second launch on the port the
    first just left starts at once."""
    import http.client

    first = LocalMode(tmp_path / "first")
    second = None
    try:
        first.wait_ready(timeout=120)
        text = "".join(first.out)
        assert f"{first.url}/v1" in text and "curl -N" in text
        procs = first.processes()
        assert [(p["unit"], p["rank"], p["role"]) for p in procs] == [
            ("local-unit0", 0, "leader"),
            ("local-unit0", 1, "follower"),
            (None, None, "router"),
        ]
        assert procs[2]["ports"]["http"] == first.port and procs[0]["ports"]["api"] != first.port
        for p in procs:
            os.kill(p["pid"], 0)  # every listed pid is a live process
        body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5})
        req = urllib.request.Request(
            f"{first.url}/v1/chat/completions", data=body.encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.status == 200 and json.load(r)["object"] == "chat.completion"
        conn = http.client.HTTPConnection("127.0.0.1", first.port, timeout=30)
        conn.request("GET", "/health")  # a keep-alive connection the router closes when it stops
        assert conn.getresponse().read()
        first.ctrl_c(procs)
        conn.close()
        assert not (first.state / "local.json").exists()
        second = LocalMode(tmp_path / "second", port=first.port)
        second.wait_ready(timeout=120)
        assert "is busy" not in "".join(second.out)
        second.ctrl_c(second.processes())
    finally:
        first.kill()
        if second is not None:
            second.kill()
