"""The transport between ranks on its own: shared memory on one host (exact, ordered, deadlock-free
in both ring directions), gloo when the ranks are not on one host, a clear error when a peer dies or
wedges mid-collective, and no segment left in /dev/shm whatever happens to the processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

from runtime.engines import collectives

SIZES = [1, 576, collectives.SLOT_BYTES // 4 * 2 + 3]  # the last one spans three rounds


def run_pair(tmp_path, launch_rank, free_ports, **spec):
    spec_file, out = tmp_path / "collectives.json", tmp_path / "collectives.pt"
    spec_file.write_text(json.dumps({"timeout": 60, **spec}))
    port = free_ports(1)
    return [launch_rank("collectives", r, port, spec_file, out) for r in range(2)], out


@pytest.fixture(scope="module")
def ops_on_shm(tmp_path_factory):
    from tests.engine.conftest import run_job  # noqa: PLC0415 - the module fixture needs the plain function

    tmp = tmp_path_factory.mktemp("shm")
    spec = {"timeout": 60, "script": "ops", "sizes": SIZES, "in_flight": collectives.RING_SLOTS + 3}
    leader = run_job("collectives", spec, tmp)
    return [leader, torch.load(tmp / "collectives.pt.rank1", weights_only=False)]


def test_all_reduce_sums_in_place_and_both_ranks_hold_the_same_bits(ops_on_shm):
    for n in SIZES:
        base = torch.arange(n, dtype=torch.float32) / 7
        want = (base * 1 + 0) + (base * 2 + 1)  # rank order, as every rank sums
        for found in ops_on_shm:
            assert torch.equal(found[f"all_reduce{n}"], want), n


def test_broadcast_and_gather_deliver_every_element(ops_on_shm):
    for n in SIZES:
        base = torch.arange(n, dtype=torch.float32) / 7
        assert all(torch.equal(f[f"broadcast{n}"], base) for f in ops_on_shm)
        gathered = ops_on_shm[0][f"gather{n}"]
        assert [torch.equal(g, torch.arange(n, dtype=torch.int64) + 1000 * r) for r, g in enumerate(gathered)] == [
            True,
            True,
        ]
        assert ops_on_shm[1][f"gather{n}"] is None


def test_ring_sends_arrive_in_order_both_ways_with_more_in_flight_than_slots(ops_on_shm):
    for rank, found in enumerate(ops_on_shm):
        peer = 1 - rank
        for n in SIZES:
            base = torch.arange(n, dtype=torch.float32) / 7
            got = found[f"recv{n}"]
            assert len(got) == collectives.RING_SLOTS + 3
            for i, t in enumerate(got):
                assert torch.equal(t, base + 100 * peer + i), (rank, n, i)


def test_ranks_on_one_host_choose_shared_memory_and_leave_no_segment_behind(tmp_path, launch_rank, free_ports):
    ranks, _ = run_pair(tmp_path, launch_rank, free_ports, script="ops", sizes=[8], in_flight=2)
    lead = ranks[0].wait_for("transport", timeout=120)
    assert lead["transport"] == "shm" and lead["segment"].startswith(collectives.SEGMENT_PREFIX)
    # Unlinked as soon as every rank mapped it: nothing in /dev/shm even while the unit runs.
    assert not os.path.exists(os.path.join(collectives.SHM_DIR, lead["segment"]))
    assert ranks[1].wait_for("transport", timeout=60)["transport"] == "shm"
    for r in ranks:
        r.wait_for("closed", timeout=120)
        assert r.proc.wait(timeout=60) == 0


def logged(rank_process) -> list[str]:
    return [m["log"] for m in rank_process.seen if "log" in m]


def test_ranks_on_different_hosts_use_gloo_and_log_why(tmp_path, launch_rank, free_ports):
    ranks, _ = run_pair(tmp_path, launch_rank, free_ports, script="ops", sizes=[8], in_flight=2, other_host_ranks=[1])
    assert ranks[0].wait_for("transport", timeout=120)["transport"] == "gloo"
    for r in ranks:
        r.wait_for("closed", timeout=120)
    assert any(line.startswith("collectives: gloo (rank 1 runs on elsewhere, rank 0 on") for line in logged(ranks[0]))


def test_a_missing_shm_directory_falls_back_to_gloo_but_a_required_shm_fails(tmp_path, launch_rank, free_ports):
    common = {"script": "ops", "sizes": [8], "in_flight": 2, "shm_dir": "/nonexistent"}
    ranks, _ = run_pair(tmp_path, launch_rank, free_ports, **common)
    assert ranks[0].wait_for("transport", timeout=120)["transport"] == "gloo"
    for r in ranks:
        r.wait_for("closed", timeout=120)
    assert "collectives: gloo (rank 0: /nonexistent is missing or not writable)" in logged(ranks[0])
    forced, _ = run_pair(tmp_path, launch_rank, free_ports, **common, collectives="shm")
    for r in forced:
        error = r.wait_for("connect_error", timeout=120)["connect_error"]
        assert error.startswith("the shared-memory transport was required but cannot be used: rank 0: /nonexistent")
        assert r.proc.wait(timeout=60) == 3


def test_a_sleeping_rank_is_woken_by_its_peer_and_a_polling_one_is_left_alone(tmp_path, launch_rank, free_ports):
    # A rank that waits past SPIN_S sleeps on a futex and must be woken by the peer's arrival: the
    # script stretches the liveness slice to an hour, so a lost wake-up would hang the test. A rank
    # that is polling needs no wake-up system call, and none is made for it.
    late, busy = 6, 300
    ranks, _ = run_pair(tmp_path, launch_rank, free_ports, script="sleepy", late=late, busy=busy)
    for r in ranks:
        assert r.wait_for("transport", timeout=120)["transport"] == "shm"
    late_phase = [r.wait_for("late_phase", timeout=120)["late_phase"] for r in ranks]
    done = [r.wait_for("sums", timeout=120) for r in ranks]
    want = [float(2 * i + 1) for i in range(2 * late)] + [float(2 * i + 1) for i in range(busy)]
    assert [d["sums"] for d in done] == [want, want]
    for rank in range(2):
        # every other round the peer was 50 ms late: this rank slept then, and was rung awake
        assert late_phase[rank]["sleeps"] >= late, late_phase
        assert late_phase[1 - rank]["rings"] >= late, late_phase
    for rank in range(2):
        # Rings only for a peer that announced it was asleep: one for the round it sleeps in, and
        # at most one more for the next round while it is being scheduled back in (its flag is
        # still up, and the round after that needs its arrival). Ringing every round would be 300.
        assert done[rank]["busy_phase"]["rings"] <= 2 * done[1 - rank]["busy_phase"]["sleeps"], done
    for r in ranks:
        assert r.proc.wait(timeout=60) == 0


@pytest.mark.parametrize("how", ["kill", "stop"])
def test_a_peer_lost_mid_collective_ends_the_collective_with_a_clear_error(how, tmp_path, launch_rank, free_ports):
    # kill: the dead peer's lock is gone, reported long before the 60 s timeout; stop: the peer is
    # alive but silent, reported when the (short) timeout expires.
    timeout = 60 if how == "kill" else 2
    ranks, _ = run_pair(tmp_path, launch_rank, free_ports, script="die", timeout=timeout)
    segment = ranks[0].wait_for("transport", timeout=120)["segment"]
    ranks[1].wait_for("waiting", timeout=60)
    ranks[1].proc.send_signal(signal.SIGKILL if how == "kill" else signal.SIGSTOP)
    error = ranks[0].wait_for("error", timeout=timeout + 30)["error"]
    if how == "kill":
        assert "rank 1 died during a shared-memory all_reduce" in error
    else:
        assert f"waited {timeout} s for rank(s) 1, which are alive but silent" in error
    ranks[0].wait_for("closed", timeout=30)
    assert ranks[0].proc.wait(timeout=30) == 0
    if how == "stop":
        ranks[1].proc.send_signal(signal.SIGKILL)
    ranks[1].proc.wait(timeout=30)
    assert not os.path.exists(os.path.join(collectives.SHM_DIR, segment))


HOLD_LOCK = textwrap.dedent(
    """
    import fcntl, os, sys
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
    print("locked", flush=True)
    sys.stdin.readline()
    """
)


def test_a_segment_whose_creator_died_is_swept_and_a_live_one_is_kept(tmp_path):
    shm = tmp_path / "shm"
    shm.mkdir()
    stale = shm / f"{collectives.SEGMENT_PREFIX}999-dead"
    stale.write_bytes(b"x" * 64)
    live = shm / f"{collectives.SEGMENT_PREFIX}998-live"
    other = shm / "someone-elses-file"
    other.write_bytes(b"")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(live)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert collectives.sweep_stale_segments(str(shm)) == [stale.name]
        assert sorted(p.name for p in shm.iterdir()) == sorted([live.name, other.name])
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    assert collectives.sweep_stale_segments(str(shm)) == [live.name]  # its holder has exited


def test_an_unknown_transport_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="collectives transport 'nccl' is not one of auto, shm, gloo"):
        collectives.connect(0, 2, timeout_s=1, transport="nccl")
