"""A follower that dies (SIGKILL) or wedges (SIGSTOP) mid-generation: every pending request ends
with EngineBroken within a bounded time, health says BROKEN, and the same leader process forms a
fresh unit afterwards. A dying leader makes the follower's run_worker raise EngineBroken."""

from __future__ import annotations

import json
import signal
import time

import pytest
import torch

COLLECTIVE_TIMEOUT_S = 5


def streaming_pair(tmp_path, launch_rank, free_ports, collectives="auto"):
    """A leader and a follower of the `failure` job, returned once the leader's requests are streaming."""
    spec, out = tmp_path / "failure.json", tmp_path / "failure.pt"
    spec.write_text(json.dumps({"timeout": COLLECTIVE_TIMEOUT_S, "collectives": collectives}))
    port = free_ports(2)
    leader = launch_rank("failure", 0, port, spec, out)
    follower = launch_rank("failure", 1, port, spec, out)
    transport = leader.wait_for("transport", timeout=120)["transport"]
    assert transport == ("shm" if collectives == "auto" else collectives)  # ranks on one host share memory
    leader.wait_for("streaming", timeout=120)
    return leader, follower, port, out


@pytest.mark.parametrize(
    "how, bound_s, collectives",
    [
        # dead: its lock on the segment is released (shm) or its connection closes (gloo), noticed
        # at the next collective
        ("kill", COLLECTIVE_TIMEOUT_S, "auto"),
        ("kill", COLLECTIVE_TIMEOUT_S, "gloo"),
        ("stop", 2 * COLLECTIVE_TIMEOUT_S, "auto"),  # silent peer: noticed by the collective timeout
    ],
)
def test_follower_failure_fails_pending_requests_and_the_leader_can_reform(
    how, bound_s, collectives, tmp_path, launch_rank, free_ports
):
    leader, follower, port, out = streaming_pair(tmp_path, launch_rank, free_ports, collectives)
    failed_at = time.time()
    follower.proc.send_signal(signal.SIGKILL if how == "kill" else signal.SIGSTOP)
    leader.wait_for("broken", timeout=bound_s + 30)
    spec2 = tmp_path / "failure2.json"
    spec2.write_text(json.dumps({"timeout": COLLECTIVE_TIMEOUT_S, "generation": 1}))
    launch_rank("failure", 1, port, spec2, tmp_path / "unused.pt")  # the replacement follower
    assert leader.proc.wait(timeout=120) == 0

    found = torch.load(out, weights_only=False)
    assert set(found["outcomes"]) == {"r0", "r1", "r2"}
    assert all(v.startswith("EngineBroken") for v in found["outcomes"].values()), found["outcomes"]
    assert found["health"][0] == "broken" and found["health"][1]
    # noticed within the bound after the failure (wall clocks of one machine)
    assert found["broken_wall"] - failed_at <= bound_s
    # and every stream ended right after the engine noticed
    assert found["requests_ended_after_broken_s"] <= COLLECTIVE_TIMEOUT_S
    assert len(found["reformed_tokens"]) == 4


def test_leader_death_makes_the_follower_loop_raise_engine_broken(tmp_path, launch_rank, free_ports):
    leader, follower, port, out = streaming_pair(tmp_path, launch_rank, free_ports)
    leader.proc.kill()
    msg = follower.wait_for("worker_broken", timeout=COLLECTIVE_TIMEOUT_S + 30)
    assert msg["worker_broken"]
    assert follower.proc.wait(timeout=30) == 0


def test_followers_with_other_strategies_are_refused_at_start(tmp_path, launch_rank, free_ports):
    spec, out = tmp_path / "mismatch.json", tmp_path / "mismatch.pt"
    port = free_ports(1)
    spec.write_text(json.dumps({"timeout": COLLECTIVE_TIMEOUT_S}))
    spec_follower = tmp_path / "mismatch1.json"
    spec_follower.write_text(json.dumps({"timeout": COLLECTIVE_TIMEOUT_S, "decode": "pipeline"}))
    leader = launch_rank("mismatch", 0, port, spec, out)
    follower = launch_rank("mismatch", 1, port, spec_follower, out)
    lead_msg = leader.wait_for("refused", timeout=120)
    follow_msg = follower.wait_for("refused", timeout=120)
    for msg in (lead_msg, follow_msg):
        assert "disagree" in msg["refused"] and "same model and strategies" in msg["refused"]
