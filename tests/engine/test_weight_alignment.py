"""Why a pipeline split can be bit-identical to the unsplit model on any x86-64 CPU: the same ops on
the same shapes with one thread, and every weight a product reads starting on a 64-byte boundary in
every layout (MKL may order a product's sums by where its operands start: hugepages.ALIGN_BYTES).
A checkpoint can hand out tensors anywhere (safetensors views into the mapped file), so these
tests feed the engine weights placed 8 bytes past a boundary, as SmolLM2's embedding is."""

from __future__ import annotations

import pytest
import torch

from runtime.engines import hugepages
from runtime.engines.executor import ShardExecutor
from runtime.engines.layout import make_plan
from runtime.engines.llama import HeadWeights, UnsplitLlama
from runtime.models import resolve_model

OFF = 8  # bytes past a 64-byte boundary: where safetensors left SmolLM2's embedding


class Misplaced:
    """A WeightSource whose every tensor is a view `off` bytes past a 64-byte boundary."""

    def __init__(self, inner, off: int = OFF) -> None:
        self.inner, self.off = inner, off

    def keys(self) -> set[str]:
        return self.inner.keys()

    def get(self, name: str, **kw) -> torch.Tensor:
        t = self.inner.get(name, **kw)
        buf = torch.empty(t.numel() + 32)
        start = ((-buf.data_ptr()) % 64 + self.off) // 4
        view = buf[start : start + t.numel()].view(t.shape)
        view.copy_(t)
        assert view.data_ptr() % 64 == self.off
        return view


def _product_operands(layers: dict, head: HeadWeights | None, extra: list) -> list[torch.Tensor]:
    out = [w for p in layers.values() for w in (p.qkv, p.o, p.gate_up, p.down)]
    if head is not None:
        out += [head.lm_head, head.embed]
    return out + [t for t in extra if t is not None]


@pytest.fixture(params=["huge pages", "no huge pages"])
def thp(request, tmp_path, monkeypatch):
    if request.param == "no huge pages":
        setting = tmp_path / "enabled"
        setting.write_text("always madvise [never]\n")
        monkeypatch.setattr(hugepages, "THP_SETTING", setting)
    elif not hugepages.available():
        pytest.skip("this machine has transparent huge pages off: the other case covers it")
    return request.param


def test_every_matrix_a_product_reads_starts_on_64_bytes_in_every_layout(thp):
    src = resolve_model("tiny")
    weights = Misplaced(src.weights)
    unsplit = UnsplitLlama(src.shape, weights)
    seen = _product_operands(unsplit.layers, unsplit.head, [])
    for rank in (0, 1):
        plan = make_plan(src.shape, 2, prefill="pipeline", decode="tensor", boundaries=(1,))
        ex = ShardExecutor(plan=plan, rank=rank, weights=weights)
        seen += _product_operands(ex.pp_layers, ex.head, [ex.lm_head_slice])
        seen += _product_operands(ex.tp_layers, None, [])
    assert len(seen) > 40
    misplaced = [t.shape for t in seen if t.data_ptr() % hugepages.ALIGN_BYTES]
    assert not misplaced, f"weights not on a {hugepages.ALIGN_BYTES}-byte boundary: {misplaced}"


def test_logits_do_not_depend_on_where_the_checkpoint_put_the_lm_head():
    # SmolLM2's 49152 x 576 LM head: an MKL one-row product over it summed in another order when
    # it started 8 bytes past a boundary (AMD EPYC); the logits must be the same bits either way.
    src = resolve_model("smollm2")
    torch.manual_seed(0)
    hidden = torch.randn(1, src.shape.hidden_size)
    here = HeadWeights.load(Misplaced(src.weights, 0), src.shape).logits(src.shape, hidden)
    there = HeadWeights.load(Misplaced(src.weights, OFF), src.shape).logits(src.shape, hidden)
    assert torch.equal(here, there), f"max difference {float((here - there).abs().max())}"
