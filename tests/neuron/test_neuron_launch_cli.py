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
        "--model", str(model_dir), "--nodes", "4", "--instance-type", "trn1.32xlarge", "--leader-host", "10.1.0.10"
    )
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["mode"] == "multi-node"
    assert plan["image"]["dockerfile"] == "runtime/Dockerfile.neuron-multinode"
    assert (plan["parallelism"]["tp_degree"], plan["parallelism"]["world_size"]) == (32, 128)
    assert [r["env"]["NEURON_RANK_ID"] for r in plan["ranks"]] == ["0", "1", "2", "3"]
    assert [r["global_core_ranks"] for r in plan["ranks"]] == [[0, 31], [32, 63], [64, 95], [96, 127]]
    assert plan["ranks"][0]["command"][:3] == ["python", "-m", "vllm.entrypoints.api_server"]
    assert all(r["command"][1].endswith("runtime/engines/neuron/worker.py") for r in plan["ranks"][1:])
    # 70B at batch 8 x 4096 tokens fits one trn1.32xlarge: the planner says to use one node, and why.
    rec = plan["recommendation"]
    assert (rec["nodes"], rec["mode"], rec["dockerfile"]) == (1, "single-node", "runtime/Dockerfile.neuron")
    assert rec["why"].startswith("fits one trn1.32xlarge:")
    assert proc.stderr.startswith("note: --nodes 4: the planner recommends --nodes 1 (single-node): fits one")
    assert proc.stderr.count("\n") == 1


def test_405b_is_recommended_on_one_trn2_and_across_trn1_nodes_with_the_fork_image(checkpoint):
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
    trn1 = _plan("--model", model_dir, "--nodes", "1", "--seq-len", "2048", "--batch-size", "1")
    rec = json.loads(trn1.stdout)["recommendation"]
    assert rec["nodes"] == 2 and rec["mode"] == "multi-node"
    assert "0.7.2-neuronx-py310-sdk2.24.1" in rec["base_image"] and "does not fit one trn1.32xlarge" in rec["why"]
    assert "settled only on hardware" in rec["why"]


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
    assert err.startswith("error: cp_degree=1 leaves 64 ranks to share prefill attention")
    assert err.count("\n") == 1


def test_plan_command_with_a_missing_checkpoint_names_the_directory(tmp_path, capsys):
    code = main(["plan", "--engine", "neuron", "--model", str(tmp_path / "nope"), "--nodes", "2"])
    assert code == 2
    assert f"--model {tmp_path / 'nope'}: not a directory" in capsys.readouterr().err
