"""The parallel plan: cost-balanced contiguous stages, head/MLP tensor slices, explicit fallback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from contract.llama import SMOLLM2
from runtime.engines.layout import make_plan
from runtime.engines.llama import _sdpa, query_pad
from runtime.models.registry import TINY_SHAPE

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("world_size", [1, 2, 3, 5])
def test_stages_are_contiguous_and_cover_every_layer(world_size):
    plan = make_plan(SMOLLM2, world_size)
    layers = [n for st in plan.stages for n in st.layers]
    assert layers == list(range(30))
    assert all(len(st.layers) >= 1 for st in plan.stages)


def test_stage_zero_takes_fewer_layers_because_it_holds_embedding_and_lm_head():
    plan = make_plan(SMOLLM2, 2)
    assert len(plan.stage(0).layers) < len(plan.stage(1).layers)
    costs = [st.cost for st in plan.stages]
    # no single layer moved between the stages would balance them better
    assert max(costs) - min(costs) <= SMOLLM2.layer_params


def test_smollm2_heads_do_not_divide_by_two_so_attention_is_replicated_and_said_so():
    plan = make_plan(SMOLLM2, 2)
    assert plan.attention_replicated
    assert [t.q_heads for t in plan.tensor_slices] == [(0, 9), (0, 9)]
    assert [t.mlp for t in plan.tensor_slices] == [(0, 768), (768, 1536)]
    assert "REPLICATED" in plan.describe()


def test_smollm2_splits_heads_when_the_degree_divides_them():
    plan = make_plan(SMOLLM2, 3)
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
        make_plan(SMOLLM2, **kwargs)


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


def test_over_shared_memory_smollm2_splits_the_query_heads_and_shares_the_straddled_kv_head():
    plan = make_plan(SMOLLM2, 2, split_uneven_heads=True)
    assert not plan.attention_replicated
    # 9 query heads: 4 and 5, the extra one away from rank 0 (it also embeds and samples). Query
    # heads 3-5 read KV head 1, so both ranks hold it.
    assert [t.q_heads for t in plan.tensor_slices] == [(0, 4), (4, 9)]
    assert [t.kv_heads for t in plan.tensor_slices] == [(0, 2), (1, 3)]
    assert [t.mlp for t in plan.tensor_slices] == [(0, 768), (768, 1536)]
    s = SMOLLM2
    # Ranks wait for each other at each of the two all-reduces of a layer, so each block must be
    # near-even by itself (whole KV groups were 3 and 6 query heads: one rank idle in every
    # attention block, whatever the MLP split did for the layer's total).
    attention = [
        s.hidden_size * s.head_dim * (2 * (t.q_heads[1] - t.q_heads[0]) + 2 * (t.kv_heads[1] - t.kv_heads[0]))
        for t in plan.tensor_slices
    ]
    assert max(attention) / min(attention) < 1.2
    assert "split UNEVENLY" in plan.describe()
    assert [query_pad(t.q_heads, t.kv_heads, s) for t in plan.tensor_slices] == [(0, 2), (1, 0)]


def test_attention_of_query_heads_that_cut_through_a_kv_group():
    # Held query heads 4-8 of 9 (groups of 3) read held KV heads 1-2: head 4 and 5 read KV head 1.
    shape = SMOLLM2
    pad = query_pad((4, 9), (1, 3), shape)
    torch.manual_seed(0)
    B, L, d = 3, 7, shape.head_dim
    q, K, V = torch.randn(B, 5, 1, d), torch.randn(B, 2, L, d), torch.randn(B, 2, L, d)
    lens = torch.tensor([7, 4, 1])
    mask = (torch.arange(L) < lens[:, None]).view(B, 1, 1, L)
    got = _sdpa(q, K, V, pad, mask)
    for b in range(B):
        for h in range(5):
            kv = (4 + h) // 3 - 1  # the global head's KV group, as held
            n = int(lens[b])
            w = torch.softmax(q[b, h, 0] @ K[b, kv, :n].T / d**0.5, dim=-1)
            torch.testing.assert_close(got[b, h, 0], w @ V[b, kv, :n], rtol=1e-5, atol=1e-5)


def test_uneven_split_falls_back_to_replication_with_fewer_kv_heads_than_ranks():
    plan = make_plan(SMOLLM2, 4, split_uneven_heads=True)
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
