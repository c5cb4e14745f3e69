"""`make local UNITS=2` (python -m runtime.local --units 2): two units behind the router on the public
port; requests reach both units; Ctrl-C stops the router and every member cleanly."""

from __future__ import annotations

import json
import urllib.request

import pytest
from localmode import LocalMode

import contract

pytestmark = pytest.mark.timeout(300)


def test_local_mode_with_two_units_routes_to_both_behind_the_router_and_stops_on_ctrl_c(tmp_path):
    local = LocalMode(tmp_path, "--units", "2")
    try:
        local.wait_ready(timeout=180)
        procs = local.processes()
        assert sorted((p["unit"] or "", p["role"]) for p in procs) == [
            ("", "router"),
            ("local-unit0", "follower"),
            ("local-unit0", "leader"),
            ("local-unit1", "follower"),
            ("local-unit1", "leader"),
        ]
        router = next(p for p in procs if p["role"] == "router")
        assert router["ports"]["http"] == local.port
        served = set()
        # Distinct prompts: one prompt sent again would stay on the unit holding its cache (routing by
        # cache), so only prompts of different keys can show both units serving.
        for i in range(40):
            body = json.dumps({"model": "tiny", "prompt": f"question {i}: hi", "max_tokens": 3}).encode()
            req = urllib.request.Request(
                f"{local.url}/v1/completions", data=body, headers={"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(req, timeout=30) as r:
                assert r.status == 200
                served.add(r.headers[contract.UNIT_HEADER])
            if len(served) == 2:
                break
        assert served == {"local-unit0", "local-unit1"}
        with urllib.request.urlopen(local.metrics_url(), timeout=5) as r:
            assert "flotilla_router_routable_units 2.0" in r.read().decode()
        local.ctrl_c(procs)
    finally:
        local.kill()
