"""Killing a follower mid-generation: every pending request ends with EngineBroken within the
collective timeout, health says BROKEN, and the same leader process forms a fresh unit afterwards."""

from __future__ import annotations

import json
import time

import torch

COLLECTIVE_TIMEOUT_S = 10


def test_killing_a_follower_fails_pending_requests_and_the_leader_can_reform(
        tmp_path, launch_rank, free_ports):
    spec, out = tmp_path / "failure.json", tmp_path / "failure.pt"
    spec.write_text(json.dumps({"timeout": COLLECTIVE_TIMEOUT_S}))
    port = free_ports(2)
    leader = launch_rank("failure", 0, port, spec, out)
    follower = launch_rank("failure", 1, port, spec, out)
    leader.wait_for("streaming", timeout=120)
    killed_at = time.time()
    follower.proc.kill()                                     # SIGKILL: no goodbye on the wire
    leader.wait_for("broken", timeout=COLLECTIVE_TIMEOUT_S + 30)
    spec2 = tmp_path / "failure2.json"
    spec2.write_text(json.dumps({"timeout": COLLECTIVE_TIMEOUT_S, "generation": 1}))
    launch_rank("failure", 1, port, spec2, tmp_path / "unused.pt")   # the replacement follower
    assert leader.proc.wait(timeout=120) == 0

    found = torch.load(out, weights_only=False)
    assert set(found["outcomes"]) == {"r0", "r1", "r2"}
    assert all(v.startswith("EngineBroken") for v in found["outcomes"].values()), found["outcomes"]
    assert found["health"][0] == "broken" and found["health"][1]
    # noticed within the collective timeout of the kill (wall clocks of one machine)
    assert found["broken_wall"] - killed_at <= COLLECTIVE_TIMEOUT_S
    # every stream ended within the collective timeout of the engine noticing
    assert found["requests_ended_after_broken_s"] <= COLLECTIVE_TIMEOUT_S
    assert len(found["reformed_tokens"]) == 4
