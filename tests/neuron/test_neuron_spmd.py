"""The multi-node loop on the NxD Inference stand-in: 2 and 4 "nodes" (processes) on one machine.

Split as NxD Inference's multi-node example splits (global tp_degree = nodes x local ranks), the unit's
greedy output equals the unsplit model's; launched as the old replicating launch did (tp_degree = one
node's cores) every node loads a whole copy and runs out of device memory; a node that runs forward with
other inputs fails the whole unit instead of hanging it.
"""

from __future__ import annotations

import io
import math

import pytest
from spmd_harness import SHAPE, run_unit, unsplit_greedy
from testnet import free_port

from runtime.models.registry import hf_tensor_shapes

LOCAL_RANKS = 2  # NeuronCores per stand-in node
PROMPTS = [[5, 9, 3, 17], [40, 2], [11, 12, 13, 14, 15, 16], [7]]
MAX_TOKENS = 5
# Every tensor of the checkpoint in fp32: what one node would hold if it held everything.
MODEL_BYTES = 4 * sum(math.prod(s) for s in hf_tensor_shapes(SHAPE).values())


def _spec(tmp_path, *, nodes: int, tp_degree: int, **extra) -> dict:
    return {
        "port": free_port(),
        "nodes": nodes,
        "local_ranks_size": LOCAL_RANKS,
        "tp_degree": tp_degree,
        "batch_size": 2,  # fewer slots than requests: continuous batching admits the rest as slots free
        "seq_len": 32,
        "compiled_dir": str(tmp_path / "compiled"),
        # A node holds 1.5 x its even share of the model: a split fits, a whole copy does not.
        "device_bytes_per_node": int(1.5 * MODEL_BYTES / nodes),
        "requests": [{"request_id": f"r{i}", "prompt": p, "max_tokens": MAX_TOKENS} for i, p in enumerate(PROMPTS)],
        **extra,
    }


# Four node processes at once: beside another worker it took 3x its time alone (docs/benchmarks.md).
@pytest.mark.parametrize("nodes", [2, pytest.param(4, marks=pytest.mark.whole_machine)])
def test_a_unit_split_over_every_nodes_cores_generates_what_the_unsplit_model_does(tmp_path, nodes):
    results = run_unit(_spec(tmp_path, nodes=nodes, tp_degree=nodes * LOCAL_RANKS))

    assert all(status == "ok" for status, _ in results.values()), results
    leader = results[0][1]
    assert [leader["outputs"][f"r{i}"] for i in range(len(PROMPTS))] == unsplit_greedy(PROMPTS, MAX_TOKENS)
    # Every follower ran every step the leader stamped, and nobody held the whole model.
    assert {results[r][1]["steps"] for r in range(1, nodes)} == {leader["steps"]}
    # and heard each broadcast, every step and the stop: what tells its node the leader's loop lives.
    assert {results[r][1]["heard"] for r in range(1, nodes)} == {leader["steps"] + 1}
    assert all(results[r][1]["bytes"] < MODEL_BYTES for r in range(nodes))


@pytest.mark.whole_machine  # a process per node, each loading a whole copy
@pytest.mark.parametrize("nodes", [2, 4])
def test_the_replicating_launch_loads_a_whole_copy_per_node_and_does_not_fit(tmp_path, nodes):
    # The replicating launch: tp_degree = one node's cores, world = nodes x cores. Global rank r holds
    # partition r % tp_degree, so every node holds partitions 0..LOCAL_RANKS-1: the whole model.
    results = run_unit(_spec(tmp_path, nodes=nodes, tp_degree=LOCAL_RANKS))

    assert {status for status, _ in results.values()} == {"error"}
    assert all("out of device memory" in str(err) for _, err in results.values()), results


def test_the_replicating_launch_holds_the_whole_model_on_every_node_even_with_room(tmp_path):
    results = run_unit(_spec(tmp_path, nodes=2, tp_degree=LOCAL_RANKS, device_bytes_per_node=None))

    assert all(status == "ok" for status, _ in results.values()), results
    assert all(value["bytes"] >= MODEL_BYTES for _, value in results.values())


def test_a_node_that_runs_forward_on_other_inputs_fails_the_unit_instead_of_hanging(tmp_path):
    results = run_unit(_spec(tmp_path, nodes=2, tp_degree=2 * LOCAL_RANKS, fault="perturb", fault_at=2))

    assert results[0][0] == "error" and results[1][0] == "error", results
    assert "out of step or with different inputs" in str(results[0][1])
    assert "forward #2" in str(results[0][1])


# A node whose forward never returns, as when a collective inside it stops making progress while every
# process lives: the loop must end itself (the node then re-forms the unit), not wait for ever.
STUCK_NODE = """
import datetime, sys, threading
import torch.distributed as dist
from runtime.engines.neuron import spmd

dist.init_process_group("gloo", init_method=sys.argv[1], rank=0, world_size=1, timeout=datetime.timedelta(seconds=30))


class StuckForward:
    def forward(self, **inputs):
        threading.Event().wait()


node = spmd.Node(StuckForward(), node_rank=0, step_timeout_s=0.5)
scheduler = spmd.Scheduler(batch_size=1, seq_len=8)
scheduler.add(spmd.Request("r0", prompt=[1, 2], max_tokens=2))
node.step(scheduler.next_step())
print("the forward returned")
"""


def test_a_forward_that_never_returns_ends_the_nodes_loop_with_exit_1_naming_the_step():
    import json
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-c", STUCK_NODE, f"tcp://127.0.0.1:{free_port()}"],
        cwd=repo,
        env={"PYTHONPATH": str(repo), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=120,  # a generous ceiling for a loaded machine, not the bound under test (0.5 s)
    )
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-2000:])
    assert "the forward returned" not in proc.stdout
    stuck = [json.loads(line) for line in proc.stderr.splitlines() if "neuron_step_stuck" in line]
    assert stuck and stuck[0]["node_rank"] == 0 and stuck[0]["step"] == 0 and stuck[0]["waited_s"] >= 0.5


def test_the_step_watch_keeps_its_pace_without_time_sleep_and_ends_when_closed(monkeypatch):
    """The watch waits on an event, not on time.sleep: with time.sleep replaced by a no-op (as a test
    of other code in the same process may do) it neither spins nor fires early, and close() ends its
    thread. Node objects dropped in a long test process (in-process models) would otherwise leave one
    watch each, polling for ever."""
    import threading
    import time

    from runtime.engines.neuron import spmd

    sleeps = []
    monkeypatch.setattr(time, "sleep", lambda s: sleeps.append(s))
    fired = threading.Event()
    stuck = []

    def on_stuck(rank, step, waited):
        stuck.append((rank, step, waited))
        fired.set()

    dog = spmd.StepWatchdog(node_rank=3, timeout_s=0.2, on_stuck=on_stuck)
    dog.running(7)
    assert fired.wait(5)
    assert stuck[0][:2] == (3, 7) and stuck[0][2] > 0.2
    assert sleeps == []

    quiet = spmd.StepWatchdog(node_rank=0, timeout_s=0.2, on_stuck=on_stuck)
    quiet.running(0)
    quiet.done()
    quiet.close()
    quiet._thread.join(timeout=5)
    assert not quiet._thread.is_alive()
    assert len(stuck) == 1


def test_every_load_phase_the_loop_reports_is_one_the_node_knows():
    # spmd.py runs without the flotilla package, so it spells the phases itself; the node parses
    # them as LoadPhase (runtime/engines/neuron/loading.py), and an unknown one would fail the load.
    from contract.ready import LoadPhase
    from runtime.engines.neuron import spmd

    spelled = {spmd.PHASE_COMPILE, spmd.PHASE_LOAD, spmd.PHASE_WARMUP, spmd.PHASE_JOIN}
    assert spelled == {LoadPhase.COMPILE.value, LoadPhase.LOAD.value, LoadPhase.WARMUP.value, LoadPhase.JOIN.value}


def _draws(logits, params, n=400):
    import torch

    from runtime.engines.neuron.spmd import sample_on_host

    g = torch.Generator().manual_seed(3)
    rows = torch.tensor([params], dtype=torch.float32)
    return [int(sample_on_host(logits.view(1, -1), rows, g)[0]) for _ in range(n)]


def test_host_sampling_keeps_exactly_the_top_k_tokens():
    import torch

    logits = torch.tensor([0.0, 3.0, 1.0, 2.9, -1.0])
    assert set(_draws(logits, (2.0, 1.0, 1.0))) == {1, 3}  # [top_k, top_p, temperature]


def test_host_sampling_keeps_the_smallest_nucleus_whose_mass_reaches_top_p():
    import torch

    # Probabilities 0.5, 0.3, 0.15, 0.05: 0.5 < 0.7 <= 0.8, so the nucleus is the two most likely
    # (nucleus sampling as vLLM applies top_p: the smallest set of most likely tokens reaching it).
    logits = torch.log(torch.tensor([0.15, 0.5, 0.05, 0.3]))
    assert set(_draws(logits, (0.0, 0.7, 1.0))) == {1, 3}


def test_host_sampling_reaches_past_its_first_candidates_when_the_nucleus_is_wider():
    import torch

    from runtime.engines.neuron.spmd import NUCLEUS_CANDIDATES

    # A flat row over 4 x NUCLEUS_CANDIDATES tokens: the most likely NUCLEUS_CANDIDATES hold about a
    # quarter of the mass, so top_p 0.9 must draw well beyond them.
    logits = torch.linspace(0.0, 0.01, 4 * NUCLEUS_CANDIDATES).flip(0)  # token t has rank t
    picks = _draws(logits, (0.0, 0.9, 1.0))
    assert max(picks) >= NUCLEUS_CANDIDATES and sum(p >= NUCLEUS_CANDIDATES for p in picks) > len(picks) / 2
    assert max(picks) < 0.95 * len(logits)  # and never past the nucleus (~90% of a near-flat row)


def test_host_sampling_takes_the_arg_max_for_greedy_rows_beside_sampled_ones():
    import torch

    from runtime.engines.neuron.spmd import sample_on_host

    logits = torch.tensor([[0.0, 1.0, 5.0, 4.9], [0.0, 1.0, 5.0, 4.9]])
    params = torch.tensor([[1.0, 1.0, 1.0], [2.0, 1.0, 1.0]])  # top_k 1 (greedy), then top_k 2
    g = torch.Generator().manual_seed(0)
    seen = {tuple(sample_on_host(logits, params, g).tolist()) for _ in range(200)}
    assert {row[0] for row in seen} == {2} and {row[1] for row in seen} == {2, 3}


def test_a_followers_loop_tells_its_node_it_hears_the_leader_at_most_every_tenth_of_a_second():
    from runtime.engines.neuron import loop_wire, spmd  # noqa: PLC0415 - spmd imports torch

    clock = [100.0]
    lines = io.StringIO()
    heard = spmd._following(lines, clock=lambda: clock[0])
    for at in (100.0, 100.05, 100.09, 100.15, 100.2, 100.3):
        clock[0] = at
        heard()
    # The first at once, then one per FOLLOWING_EVERY_S, each with every broadcast heard so far.
    assert [loop_wire.read_from_loop(line) for line in lines.getvalue().splitlines()] == [
        loop_wire.Following(1),
        loop_wire.Following(4),
        loop_wire.Following(6),
    ]


def test_an_idle_leader_keeps_its_followers_hearing_it_inside_the_nodes_peer_deadline():
    # serve_lines waits KEEPALIVE_S for work and sends a keep-alive each time none came; a follower's
    # loop reports each (Following, at most every FOLLOWING_EVERY_S), and that is what keeps a follower's
    # node from counting a slow leader's node dead on an idle unit (docs/node.md, "Slow is not dead").
    import queue  # noqa: PLC0415

    from runtime.engines.neuron import loop_wire, spmd  # noqa: PLC0415 - spmd imports torch
    from runtime.node.settings import NodeSettings  # noqa: PLC0415

    class Inbox:  # no work twice, then the stop
        def __init__(self) -> None:
            self.waits: list[tuple[bool, float | None]] = []

        def get(self, block: bool, timeout: float | None) -> str | None:
            self.waits.append((block, timeout))
            if len(self.waits) <= 2:
                raise queue.Empty
            return None

        def get_nowait(self) -> str:
            raise queue.Empty

    class Leader:
        keepalives, stopped = 0, False

        def keepalive(self) -> None:
            self.keepalives += 1

        def stop(self) -> None:
            self.stopped = True

    inbox, leader = Inbox(), Leader()
    spmd.serve_lines(leader, spmd.Scheduler(batch_size=1, seq_len=8), inbox, lambda event: None)
    assert inbox.waits == [(True, spmd.KEEPALIVE_S)] * 3
    assert leader.keepalives == 2 and leader.stopped
    peer_deadline = NodeSettings.model_fields["peer_dead_after_s"].default
    assert spmd.KEEPALIVE_S + loop_wire.FOLLOWING_EVERY_S < peer_deadline
