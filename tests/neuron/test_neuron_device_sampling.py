"""Multi-node units that sample on the device: NxD Inference's on-device sampler gets each row's own
top_k / top_p / temperature (`dynamic`), and the leader's rows meet its rules.

The stand-in samples by NxD Inference's rules (nxdi_standin.py `_sample`, from
NXDI modules/generation/sampling.py at the pin): top_k 0 or -1 masks every candidate, so the draw is
uniform; a top_k above global_topk is refused; top-p drops every token whose inclusive cumulative
probability passes top_p, except the first. The loop's "no top-k" (0) must therefore reach the device
as global_topk: the naive wiring (the loop's rows as they are) fails these tests.
"""

from __future__ import annotations

import json

import pytest
import torch
from nxdi_standin import SHAPE
from spmd_harness import one_process_model, unsplit_greedy

from runtime.engines.neuron import spmd

GLOBAL_TOPK = 8  # fewer candidates than the stand-in's 64-token vocabulary, as 256 is on a real one
PROMPT = [9, 3, 17, 2]
MAX_TOKENS = 6
# A near-greedy request: no top-k, no top-p, a temperature so low that only the most likely token has
# any probability among real candidates (logit gaps of the seeded model are far above 1e-3).
NEAR_GREEDY = {"top_k": 0, "top_p": 1.0, "temperature": 1e-3}


@pytest.fixture
def model(tmp_path):
    with one_process_model(
        tmp_path / "compiled", {"do_sample": True, "dynamic": True, "global_topk": GLOBAL_TOPK}
    ) as m:
        yield m


def _generate(model, global_topk: int | None, **sampling) -> list[int]:
    node = spmd.Node(model, node_rank=0)
    scheduler = spmd.Scheduler(batch_size=2, seq_len=32, global_topk=global_topk)
    request = spmd.Request("r", prompt=list(PROMPT), max_tokens=MAX_TOKENS, **sampling)
    try:
        return spmd.generate(node, scheduler, [request])["r"]
    finally:
        node.close()


def test_no_top_k_reaches_the_device_as_global_topk_and_samples_like_the_model(model):
    (greedy,) = unsplit_greedy([PROMPT], MAX_TOKENS)
    assert _generate(model, GLOBAL_TOPK, **NEAR_GREEDY) == greedy


def test_the_naive_rows_send_top_k_0_which_the_device_reads_as_uniform(model):
    (greedy,) = unsplit_greedy([PROMPT], MAX_TOKENS)
    assert _generate(model, None, **NEAR_GREEDY) != greedy


def test_a_top_k_above_global_topk_is_capped_where_the_device_would_refuse_it(model):
    with pytest.raises(ValueError, match="top-k must be -1 or greater than 0 but less than or equal to"):
        _generate(model, None, top_k=GLOBAL_TOPK + 1, top_p=1.0, temperature=1.0)
    assert len(_generate(model, GLOBAL_TOPK, top_k=GLOBAL_TOPK + 1, top_p=1.0, temperature=1.0)) == MAX_TOKENS


def test_rows_keep_their_own_top_k_and_greedy_rows_stay_greedy():
    rows = torch.tensor([[0.0, 0.75, 0.5], [1.0, 1.0, 1.0], [40.0, 1.0, 1.0], [300.0, 0.5, 2.0], [-1.0, 1.0, 1.0]])
    out = spmd.device_sampling_rows(rows, 256)
    assert out.tolist() == [[256.0, 0.75, 0.5], [1.0, 1.0, 1.0], [40.0, 1.0, 1.0], [256.0, 0.5, 2.0], [256.0, 1.0, 1.0]]
    assert rows[0, 0] == 0.0  # the scheduler's own tensor is left alone


def test_device_top_p_drops_the_token_that_crosses_top_p_where_the_host_keeps_it(model):
    """The documented difference of the two modes: probabilities 0.5 / 0.3 / 0.2 with top_p 0.6. The
    device keeps tokens whose inclusive cumulative probability is at most 0.6 (token 0 only); the host
    keeps the smallest set reaching it (tokens 0 and 1), as vLLM does."""
    logits = torch.full((1, SHAPE.vocab_size), -1e4)
    logits[0, :3] = torch.log(torch.tensor([0.5, 0.3, 0.2]))
    params = torch.tensor([[float(GLOBAL_TOPK), 0.6, 1.0]])
    device = set()
    for call in range(40):
        model.calls = call  # the stand-in seeds each forward's draw by its call count
        device.add(int(model._sample(logits, params)[0]))
    gen = torch.Generator().manual_seed(0)
    host = {int(spmd.sample_on_host(logits, params, gen)[0]) for _ in range(40)}
    assert device == {0}
    assert host == {0, 1}


@pytest.mark.parametrize(
    "sampling, expected", [("cpu", None), ("device", {"do_sample": True, "dynamic": True, "global_topk": 256})]
)
def test_the_multi_node_launch_asks_nxd_inference_to_sample_only_with_device_sampling(unit_plan, sampling, expected):
    plan = unit_plan("llama-3.1-405b", nodes=4, seq_len=4096, batch_size=8, sampling=sampling)
    for rank in plan.ranks:
        flag = next(a for a in rank.command if a.startswith("--neuron-config="))
        fields = json.loads(flag.split("=", 1)[1])
        assert fields.get("on_device_sampling_config") == expected
        # The leader's loop reads the same fields: its rows go through device_sampling_rows only then.
        assert spmd.scheduler_for(fields).global_topk == (256 if expected else None)
