"""`python -m runtime plan --engine neuron ...` prints the whole unit's plan or one clear error."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from runtime.__main__ import main

REPO = Path(__file__).resolve().parents[2]


def _plan(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "runtime", "plan", "--engine", "neuron", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_plan_command_prints_every_ranks_env_and_command_and_the_recommended_unit(checkpoint):
    model_dir = checkpoint("llama-3.1-70b")
    proc = _plan(
        "--model", str(model_dir), "--nodes", "2", "--instance-type", "trn1.32xlarge", "--leader-host", "10.1.0.10"
    )
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["mode"] == "multi-node"
    assert plan["image"]["dockerfile"] == "runtime/Dockerfile.neuron-multinode"
    assert (plan["parallelism"]["tp_degree"], plan["parallelism"]["world_size"]) == (64, 64)
    assert [r["global_core_ranks"] for r in plan["ranks"]] == [[0, 31], [32, 63]]
    assert all(r["command"][1].endswith("runtime/engines/neuron/spmd.py") for r in plan["ranks"])
    # 70B at batch 8 x 4096 tokens fits one trn1.32xlarge: the planner says to use one node, and why.
    rec = plan["recommendation"]
    assert (rec["nodes"], rec["mode"], rec["dockerfile"]) == (1, "single-node", "runtime/Dockerfile.neuron")
    assert rec["why"].startswith("fits one trn1.32xlarge:")
    assert proc.stderr.startswith("note: --nodes 2: the planner recommends --nodes 1 (single-node): fits one")
    assert proc.stderr.count("\n") == 1


LLAMA_405B = REPO / "tests" / "neuron" / "models" / "llama-3.1-405b"  # Meta's config.json (README beside it)


def test_405b_on_four_trn1_nodes_prints_each_nodes_nxd_inference_launch():
    # NxD Inference's multi-node example (examples/multi_node.md:106-145 at SDK 2.28): --tp-degree = every
    # node's NeuronCores, --start_rank_id 0 / 32, --local_ranks 32, NEURON_RT_ROOT_COMM_ID=<rank-0 host>:63423.
    proc = _plan(
        "--model", str(LLAMA_405B), "--nodes", "4", "--instance-type", "trn1.32xlarge", "--leader-host", "10.1.0.10"
    )
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    nodes = [
        (r["nxdi_config"]["tp_degree"], r["start_rank_id"], r["nxdi_config"]["local_ranks_size"]) for r in plan["ranks"]
    ]
    assert nodes == [(128, 0, 32), (128, 32, 32), (128, 64, 32), (128, 96, 32)]
    assert {r["env"]["NEURON_RT_ROOT_COMM_ID"] for r in plan["ranks"]} == {"10.1.0.10:63423"}
    for r in plan["ranks"]:
        flag = next(a for a in r["command"] if a.startswith("--neuron-config="))
        assert json.loads(flag.split("=", 1)[1]) == r["nxdi_config"]  # the command carries what the plan prints
    assert plan["parallelism"]["prefill"]["q_heads_per_rank"] == 1  # 128 query heads over 128 NeuronCores
    assert proc.stderr == ""  # 4 nodes is what the planner recommends for 405B on trn1 at batch 8 x 4096


def test_405b_on_three_trn1_nodes_is_refused_naming_the_head_count():
    proc = _plan("--model", str(LLAMA_405B), "--nodes", "3", "--instance-type", "trn1.32xlarge")
    assert proc.returncode == 2 and proc.stdout == ""
    # 2 nodes split the heads too, but hold 14.64 GiB per NeuronCore at batch 8 x 4096 (> 14.40 usable).
    assert proc.stderr == (
        f"error: --nodes=3 cannot serve {LLAMA_405B} on trn1.32xlarge: tp_degree=96 (3 x 32 NeuronCores) does not "
        "split num_attention_heads=128 (num_key_value_heads=8, intermediate_size=53248) evenly: use --nodes 4\n"
    )


def test_405b_is_recommended_on_one_trn2_and_across_trn1_nodes_split_by_nxd_inference(checkpoint):
    model_dir = str(checkpoint("llama-3.1-405b"))
    # AWS serves Llama 3.1 405B on one trn2.48xlarge with vLLM, TP 64, max_model_len 2048, one sequence
    # (aws-neuron-sdk libraries/nxd-inference/tutorials/trn2-llama3.1-405b-tutorial.rst:6-13, 161-205).
    trn2 = _plan(
        "--model",
        model_dir,
        "--nodes",
        "1",
        "--instance-type",
        "trn2.48xlarge",
        "--seq-len",
        "2048",
        "--batch-size",
        "1",
    )
    assert trn2.returncode == 0, trn2.stderr
    plan = json.loads(trn2.stdout)
    assert plan["recommendation"]["nodes"] == 1 and plan["mode"] == "single-node" and trn2.stderr == ""
    assert plan["ranks"][0]["command"][plan["ranks"][0]["command"].index("--tensor-parallel-size") + 1] == "64"
    trn1 = _plan("--model", model_dir, "--nodes", "2", "--seq-len", "2048", "--batch-size", "1")
    rec = json.loads(trn1.stdout)["recommendation"]
    assert rec["nodes"] == 2 and rec["mode"] == "multi-node"
    assert "sdk2.28.0" in rec["base_image"] and "does not fit one trn1.32xlarge" in rec["why"]
    assert "NxD Inference tp_degree=64" in rec["why"]


def test_the_recommendation_skips_node_counts_whose_tp_degree_does_not_split_the_heads():
    # 405B at batch 8 x 4096 needs more than 2 trn1 nodes; 3 would fit the memory but 96 does not divide 128.
    proc = _plan("--model", str(LLAMA_405B), "--nodes", "4")
    rec = json.loads(proc.stdout)["recommendation"]
    assert rec["nodes"] == 4 and "not 3 node(s): tp_degree would not split num_attention_heads=128" in rec["why"]


def test_plan_command_with_an_impossible_layout_exits_2_with_one_error_line(checkpoint, capsys):
    model_dir = checkpoint("llama-3-8b")
    code = main(
        [
            "plan",
            "--engine",
            "neuron",
            "--model",
            str(model_dir),
            "--nodes",
            "1",
            "--instance-type",
            "trn2.48xlarge",
            "--cp-degree",
            "1",
            "--attention-dp-degree",
            "2",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.startswith("error: --cp-degree=1 leaves 64 ranks to share prefill attention")
    assert err.count("\n") == 1


def test_plan_command_with_a_missing_checkpoint_names_the_directory(tmp_path, capsys):
    code = main(["plan", "--engine", "neuron", "--model", str(tmp_path / "nope"), "--nodes", "2"])
    assert code == 2
    assert f"{tmp_path / 'nope'}: no such directory or file" in capsys.readouterr().err


def test_plan_command_refuses_a_unit_whose_neuroncores_cannot_hold_the_model():
    # trn1.32xlarge: 32 NeuronCores of 16 GiB (contract/trainium.py); 405B's bfloat16 weights are ~780 GB,
    # more than the node's 512 GB of device memory, so no batch fits one node.
    proc = _plan("--model", str(LLAMA_405B), "--nodes", "1", "--batch-size", "1", "--seq-len", "128")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith(f"error: --nodes=1 cannot hold {LLAMA_405B} on trn1.32xlarge: ")
    assert proc.stderr.endswith(": use --nodes 2 or 4, or lower --batch-size or --seq-len\n")
    assert proc.stderr.count("\n") == 1
