"""The parallel plan: cost-balanced contiguous stages, head/MLP tensor slices, explicit fallback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from runtime.engines.layout import make_plan
from runtime.models.registry import TINY_SHAPE
from runtime.models.smollm2 import smollm2_shape

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("world_size", [1, 2, 3, 5])
def test_stages_are_contiguous_and_cover_every_layer(world_size):
    plan = make_plan(smollm2_shape(), world_size)
    layers = [n for st in plan.stages for n in st.layers]
    assert layers == list(range(30))
    assert all(len(st.layers) >= 1 for st in plan.stages)


def test_stage_zero_takes_fewer_layers_because_it_holds_embedding_and_lm_head():
    plan = make_plan(smollm2_shape(), 2)
    assert len(plan.stage(0).layers) < len(plan.stage(1).layers)
    costs = [st.cost for st in plan.stages]
    # no single layer moved between the stages would balance them better
    assert max(costs) - min(costs) <= smollm2_shape().layer_params


def test_smollm2_heads_do_not_divide_by_two_so_attention_is_replicated_and_said_so():
    plan = make_plan(smollm2_shape(), 2)
    assert plan.attention_replicated
    assert [t.q_heads for t in plan.tensor_slices] == [(0, 9), (0, 9)]
    assert [t.mlp for t in plan.tensor_slices] == [(0, 768), (768, 1536)]
    assert "REPLICATED" in plan.describe()


def test_smollm2_splits_heads_when_the_degree_divides_them():
    plan = make_plan(smollm2_shape(), 3)
    assert not plan.attention_replicated
    assert [t.kv_heads for t in plan.tensor_slices] == [(0, 1), (1, 2), (2, 3)]
    assert [t.q_heads for t in plan.tensor_slices] == [(0, 3), (3, 6), (6, 9)]


def test_tiny_splits_query_heads_with_their_kv_group():
    plan = make_plan(TINY_SHAPE, 2)
    assert [t.kv_heads for t in plan.tensor_slices] == [(0, 1), (1, 2)]
    assert [t.q_heads for t in plan.tensor_slices] == [(0, 2), (2, 4)]


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"world_size": 0}, "at least 1"),
        ({"world_size": 31}, "fewer nodes"),
        ({"world_size": 2, "prefill": "sideways"}, "pipeline, tensor"),
        ({"world_size": 2, "boundaries": (40,)}, "increasing layer"),
    ],
)
def test_bad_plan_inputs_are_rejected_with_the_fix(kwargs, words):
    with pytest.raises(ValueError, match=words):
        make_plan(smollm2_shape(), **kwargs)


def test_plan_command_prints_the_smollm2_plan_without_converting_weights(tmp_path):
    env = {"FLOTILLA_CACHE_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-m", "runtime", "plan", "--model", "smollm2", "--nodes", "2"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "rank 0: layers 0-10" in out.stdout and "rank 1: layers 11-29" in out.stdout
    assert "REPLICATED" in out.stdout
    assert not list(tmp_path.iterdir())  # nothing converted just to print a plan


def test_over_shared_memory_smollm2_splits_attention_unevenly_and_balances_the_mlp():
    plan = make_plan(smollm2_shape(), 2, split_uneven_heads=True)
    assert not plan.attention_replicated
    # the extra KV group goes to rank 1: rank 0 also embeds and samples
    assert [t.kv_heads for t in plan.tensor_slices] == [(0, 1), (1, 3)]
    assert [t.q_heads for t in plan.tensor_slices] == [(0, 3), (3, 9)]
    assert [t.mlp for t in plan.tensor_slices] == [(0, 853), (853, 1536)]
    s = smollm2_shape()
    per_layer = [
        s.hidden_size * s.head_dim * (2 * (t.q_heads[1] - t.q_heads[0]) + 2 * (t.kv_heads[1] - t.kv_heads[0]))
        + 3 * s.hidden_size * (t.mlp[1] - t.mlp[0])
        for t in plan.tensor_slices
    ]
    assert abs(per_layer[0] - per_layer[1]) <= 3 * s.hidden_size  # within one MLP column
    assert "split UNEVENLY" in plan.describe()


def test_uneven_split_falls_back_to_replication_with_fewer_kv_heads_than_ranks():
    plan = make_plan(smollm2_shape(), 4, split_uneven_heads=True)
    assert plan.attention_replicated


def test_plan_calibrate_forms_the_unit_here_and_prints_the_timed_pairs_and_the_choice(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "runtime", "plan", "--model", "tiny", "--nodes", "2", "--calibrate"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "(chosen by calibration; collectives over shm)" in out.stdout
    rows = [line.split()[0] for line in out.stdout.splitlines() if line.startswith(("  pipeline/", "  tensor/"))]
    assert sorted(rows) == ["pipeline/pipeline", "pipeline/tensor", "tensor/pipeline", "tensor/tensor"]
    assert sum("<- chosen" in line for line in out.stdout.splitlines()) == 1
