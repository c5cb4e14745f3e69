"""Each rank reads only the tensors (and tensor slices) its plan gives it."""

from __future__ import annotations

from runtime.engines.executor import ShardExecutor
from runtime.engines.layout import make_plan
from runtime.models import resolve_model


class RecordingWeights:
    def __init__(self, inner) -> None:
        self.inner, self.reads = inner, []

    def keys(self):
        return self.inner.keys()

    def get(self, name, *, dim=None, start=0, stop=None):
        self.reads.append((name, dim, start, stop))
        return self.inner.get(name, dim=dim, start=start, stop=stop)


def _reads(rank: int, prefill: str, decode: str):
    src = resolve_model("tiny")
    weights = RecordingWeights(src.weights)
    plan = make_plan(src.shape, 2, prefill=prefill, decode=decode)
    ShardExecutor(plan=plan, rank=rank, weights=weights)
    return plan, weights.reads


def test_a_pipeline_follower_reads_only_its_own_layers():
    plan, reads = _reads(1, "pipeline", "pipeline")
    layers = {int(name.split(".")[2]) for name, *_ in reads}
    assert layers == set(plan.stage(1).layers)
    assert all(dim is None for _, dim, _, _ in reads)
    assert not any("embed" in name or "lm_head" in name for name, *_ in reads)


def test_a_tensor_parallel_follower_reads_only_its_slice_of_every_layer():
    plan, reads = _reads(1, "tensor", "tensor")
    t = plan.tensor_slice(1)
    d = plan.shape.head_dim
    q = [(n, dim, a, b) for n, dim, a, b in reads if n.endswith("q_proj.weight")]
    assert len(q) == plan.shape.num_hidden_layers
    assert all((dim, a, b) == (0, t.q_heads[0] * d, t.q_heads[1] * d) for _, dim, a, b in q)
    down = [(dim, a, b) for n, dim, a, b in reads if n.endswith("down_proj.weight")]
    assert set(down) == {(1, t.mlp[0], t.mlp[1])}


def test_a_tensor_parallel_follower_reads_only_its_rows_of_the_lm_head():
    plan, reads = _reads(1, "pipeline", "tensor")
    head = [(dim, a, b) for n, dim, a, b in reads if n == "lm_head.weight"]
    assert head == [(0, *plan.tensor_slice(1).vocab)]
    assert not any(n == "model.embed_tokens.weight" for n, *_ in reads)


def test_the_leader_holds_embedding_and_lm_head():
    _, reads = _reads(0, "pipeline", "tensor")
    names = {name for name, *_ in reads}
    assert {"model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"} <= names


def test_a_stage_that_also_runs_tensor_parallel_reads_each_of_its_layers_once():
    plan, reads = _reads(1, "pipeline", "tensor")
    names = [name for name, *_ in reads]
    assert len(names) == len(set(names))
    own = [r for r in reads if r[0].startswith("model.layers.") and int(r[0].split(".")[2]) in plan.stage(1).layers]
    assert own and all(dim is None for _, dim, _, _ in own)
