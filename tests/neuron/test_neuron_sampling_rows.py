"""Each row of NxD Inference's [batch, 3] sampling tensor must be its own request's parameters.

vllm-neuron builds that tensor from every request it holds, in insertion order, then cuts it to the batch
(vllm-project/vllm-neuron@84411ab249fd: vllm_neuron/worker/neuronx_distributed_model_runner.py,
get_nxd_sampling_params; the same code at release-0.4.1, ~1745-1767): a request prefilled alone while an
older one is live gets the older one's temperature / top_k. Run on the NxD Inference stand-in with on-device
sampling per row (`dynamic`, NxD Inference models/config.py:1029), a temperature-0 request then gets a
sampled first token; with the rows the multi-node loop builds (batch order) it gets the greedy one. Single-node
units avoid the plugin's path by sampling on the host (FLOTILLA_NEURON_SAMPLING=cpu, the default).
"""

from __future__ import annotations

import pytest
import torch
from nxdi_standin import SHAPE
from spmd_harness import one_process_model, unsplit_greedy

from runtime.engines.neuron import spmd

VOCAB = SHAPE.vocab_size


def plugin_rows(live_in_insertion_order: list[spmd.Request], batch: int, max_num_seqs: int) -> torch.Tensor:
    """get_nxd_sampling_params, transcribed: one row per held request in insertion order, padded to
    max_num_seqs with (1, 1.0, 1.0), temperature 0 turned into top_k 1, then cut to the batch."""
    top_k, top_p, temperature = [1] * max_num_seqs, [1.0] * max_num_seqs, [1.0] * max_num_seqs
    for i, r in enumerate(live_in_insertion_order):
        top_k[i] = r.top_k if 0 < r.top_k < VOCAB else VOCAB
        top_p[i], temperature[i] = r.top_p, r.temperature
        if r.temperature == 0.0:
            top_k[i], temperature[i] = 1, 1.0
    rows = torch.stack([torch.tensor(top_k), torch.tensor(top_p), torch.tensor(temperature)], dim=1).float()
    return rows[:batch]


@pytest.fixture
def model(tmp_path):
    with one_process_model(tmp_path / "compiled", {"dynamic": True}) as m:
        yield m


def _first_token(model, step: spmd.Step, rows: torch.Tensor) -> int:
    out = model.forward(
        input_ids=step.input_ids,
        seq_ids=step.seq_ids,
        attention_mask=step.attention_mask(),
        position_ids=step.position_ids,
        sampling_params=rows,
    )
    return int(out.tokens[0, -1])


def test_a_greedy_request_prefilled_beside_a_hot_one_gets_its_own_sampling_row(model):
    hot = spmd.Request("hot", prompt=[5, 6, 7], max_tokens=4, top_k=0, top_p=1.0, temperature=100.0)
    cold = spmd.Request("cold", prompt=[9, 3, 17, 2], max_tokens=4, temperature=0.0, top_k=1)
    scheduler = spmd.Scheduler(batch_size=2, seq_len=32)
    scheduler.add(hot)
    scheduler.add(cold)
    first = scheduler.next_step()  # the hot request's prefill
    model.forward(
        input_ids=first.input_ids,
        seq_ids=first.seq_ids,
        attention_mask=first.attention_mask(),
        position_ids=first.position_ids,
        sampling_params=first.sampling_params,
    )
    step = scheduler.next_step()  # the cold request, prefilled alone
    assert step.seq_ids.tolist() == [cold.slot] and step.input_ids.shape[0] == 1
    (greedy,) = unsplit_greedy([cold.prompt], 1)

    # The loop's row is the cold request's own: the greedy token.
    assert _first_token(model, step, step.sampling_params) == greedy[0]
    # The plugin's row is the hot request's (first inserted): a token drawn at temperature 100.
    plugin = plugin_rows([hot, cold], batch=1, max_num_seqs=2)
    assert plugin.tolist() == [[float(VOCAB), 1.0, 100.0]]
    assert _first_token(model, step, plugin) != greedy[0]
