"""`python -m runtime plan --engine neuron ...` prints the whole unit's plan or one clear error."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from runtime.__main__ import main

REPO = Path(__file__).resolve().parents[2]


def test_plan_command_prints_every_ranks_env_and_command(checkpoint):
    model_dir = checkpoint("llama-3.1-70b")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "runtime",
            "plan",
            "--engine",
            "neuron",
            "--model",
            str(model_dir),
            "--nodes",
            "4",
            "--instance-type",
            "trn1.32xlarge",
            "--leader-host",
            "10.1.0.10",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["parallelism"]["tp_degree"] == 128
    assert (plan["parallelism"]["cp_degree"], plan["parallelism"]["attention_dp_degree"]) == (2, 2)
    assert [r["env"]["NEURON_RANK_ID"] for r in plan["ranks"]] == ["0", "1", "2", "3"]
    assert [r["global_core_ranks"] for r in plan["ranks"]] == [[0, 31], [32, 63], [64, 95], [96, 127]]
    leader_command = plan["ranks"][0]["command"]
    assert leader_command[:3] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    assert all(r["command"][:3] == ["python3", "-m", "runtime.engines.neuron.worker"] for r in plan["ranks"][1:])


def test_plan_command_with_an_impossible_layout_exits_2_with_one_error_line(checkpoint, capsys):
    model_dir = checkpoint("llama-3.1-70b")
    code = main(
        [
            "plan",
            "--engine",
            "neuron",
            "--model",
            str(model_dir),
            "--nodes",
            "4",
            "--cp-degree",
            "1",
            "--attention-dp-degree",
            "2",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.startswith("error: cp_degree=1 leaves 128 ranks to share prefill attention")
    assert err.count("\n") == 1


def test_plan_command_with_a_missing_checkpoint_names_the_directory(tmp_path, capsys):
    code = main(["plan", "--engine", "neuron", "--model", str(tmp_path / "nope"), "--nodes", "2"])
    assert code == 2
    assert f"--model {tmp_path / 'nope'}: not a directory" in capsys.readouterr().err
