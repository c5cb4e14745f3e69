"""Weights copied onto transparent huge pages keep their values, and the kernel really backs them
with 2 MiB pages where the machine allows it (/proc/self/smaps says so, not our own bookkeeping)."""

from __future__ import annotations

import torch

from runtime.engines import hugepages
from runtime.engines.executor import ShardExecutor
from runtime.engines.layout import make_plan
from runtime.models.registry import resolve_model


def _huge_kb(address: int) -> int:
    """AnonHugePages of the mapping of /proc/self/smaps that holds address."""
    inside = False
    for line in open("/proc/self/smaps"):
        head = line.split()[0]
        if "-" in head and ":" not in head:
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= address < hi
        elif inside and head == "AnonHugePages:":
            return int(line.split()[1])
    return 0


def test_copies_keep_values_and_sit_on_huge_pages_where_available():
    torch.manual_seed(0)
    ts = [torch.randn(576, 960), torch.randn(1536, 576), torch.randn(7)]
    out = hugepages.on_huge_pages(ts)
    for a, b in zip(ts, out):
        assert torch.equal(a, b) and b.is_contiguous() and b.data_ptr() % hugepages.ALIGN_BYTES == 0
    if hugepages.available():  # a host setting (THP never/madvise/always), not something to assume
        assert all(a.data_ptr() != b.data_ptr() for a, b in zip(ts, out))
        assert out[0].data_ptr() % hugepages.HUGE == 0
        assert _huge_kb(out[0].data_ptr()) >= 2048, "the kernel did not back the advised mapping with huge pages"


def test_without_transparent_huge_pages_the_tensors_stay(tmp_path, monkeypatch):
    setting = tmp_path / "enabled"
    setting.write_text("always madvise [never]\n")
    monkeypatch.setattr(hugepages, "THP_SETTING", setting)
    ts = [torch.randn(4, 4)]
    assert hugepages.on_huge_pages(ts)[0] is ts[0]
    # ...unless a tensor starts off a 64-byte boundary: then it is copied to one (aligned)
    off = torch.empty(40)[2:18].view(4, 4)
    off.copy_(ts[0])
    moved = hugepages.on_huge_pages([off])[0]
    assert off.data_ptr() % hugepages.ALIGN_BYTES and moved.data_ptr() % hugepages.ALIGN_BYTES == 0
    assert torch.equal(moved, ts[0])


def test_an_executor_streams_its_layers_and_lm_head_from_huge_pages_and_keeps_tied_weights_one():
    src = resolve_model("smollm2")
    ex = ShardExecutor(plan=make_plan(src.shape, 1, prefill="tensor", decode="tensor"), rank=0, weights=src.weights)
    assert ex.head.embed is ex.head.lm_head  # SmolLM2 ties them: still one matrix
    first = ex.tp_layers[0]
    w = src.weights.get
    qkv = torch.cat([w(f"model.layers.0.self_attn.{n}_proj.weight") for n in "qkv"])
    # stored [in, out], with the input RMSNorm's weight folded into its input rows
    assert torch.equal(first.qkv, (qkv * w("model.layers.0.input_layernorm.weight")).t())
    if hugepages.available():
        assert _huge_kb(first.qkv.data_ptr()) > 0 and _huge_kb(ex.head.lm_head.data_ptr()) > 0
