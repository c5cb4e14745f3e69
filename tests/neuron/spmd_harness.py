"""One process per "node" for the multi-node loop tests: the loop (runtime/engines/neuron/spmd.py) over the
NxD Inference stand-in (nxdi_standin.py), on 127.0.0.1, one torch thread each.

`run_unit(spec)` starts the nodes, waits a bounded time and returns what each node reported.
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist
from nxdi_standin import SEED, SHAPE
from testnet import free_port

UNIT_TIMEOUT_S = 120.0


def node_main(node_rank: int, spec: dict, out) -> None:
    torch.set_num_threads(1)
    import nxdi_standin as nxdi  # noqa: PLC0415 - the child's import, after the thread setting

    from runtime.engines.neuron import spmd  # noqa: PLC0415

    try:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{spec['port']}",
            rank=node_rank,
            world_size=spec["nodes"],
            timeout=datetime.timedelta(seconds=spec.get("collective_timeout_s", 30)),
        )
        nxdi.DEVICE_BYTES_PER_NODE = spec.get("device_bytes_per_node")
        local = spec["local_ranks_size"]
        config = nxdi.NeuronConfig(
            tp_degree=spec["tp_degree"],
            start_rank_id=node_rank * local,
            local_ranks_size=local,
            batch_size=spec["batch_size"],
            seq_len=spec["seq_len"],
            is_continuous_batching=True,
            on_device_sampling_config=spec.get("on_device_sampling_config"),
        )
        model = nxdi.NeuronLlamaForCausalLM("tiny", nxdi.LlamaInferenceConfig(config, load_config=(SHAPE, SEED)))
        compiled = os.path.join(spec["compiled_dir"], f"node-{node_rank}")
        model.compile(compiled)
        model.load(compiled)
        node = spmd.Node(model, node_rank=node_rank)
        if node_rank == 0:
            scheduler = spmd.Scheduler(batch_size=spec["batch_size"], seq_len=spec["seq_len"])
            requests = [spmd.Request(**r) for r in spec["requests"]]
            outputs = spmd.generate(node, scheduler, requests)
            node.stop()
            out.put((node_rank, "ok", {"outputs": outputs, "steps": node.steps, "bytes": model.loaded_bytes}))
        else:
            if spec.get("fault") == "perturb" and node_rank == spec["nodes"] - 1:
                real = model.forward

                def perturbed(**kw):
                    if model.calls == spec.get("fault_at", 2):
                        kw["input_ids"] = kw["input_ids"] + 1
                    return real(**kw)

                model.forward = perturbed
            heard: list[int] = []
            steps = node.follow(lambda: heard.append(1))
            out.put((node_rank, "ok", {"steps": steps, "heard": len(heard), "bytes": model.loaded_bytes}))
    except Exception as e:  # noqa: BLE001 - reported to the test, which asserts on it
        out.put((node_rank, "error", f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}"))
    finally:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001, S110 - a peer may already be gone
                pass


def run_unit(spec: dict) -> dict[int, tuple[str, object]]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=node_main, args=(r, spec, out), daemon=True) for r in range(spec["nodes"])]
    for p in procs:
        p.start()
    results: dict[int, tuple[str, object]] = {}
    try:
        for _ in procs:
            rank, status, value = out.get(timeout=UNIT_TIMEOUT_S)
            results[rank] = (status, value)
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
    return results


def unsplit_greedy(prompts: list[list[int]], max_tokens: int, shape=SHAPE) -> list[list[int]]:
    """The unsplit reference model's greedy tokens for each prompt, one at a time."""
    from runtime.engines.llama import UnsplitLlama  # noqa: PLC0415
    from runtime.models.registry import SeededWeights  # noqa: PLC0415

    model = UnsplitLlama(shape, SeededWeights(shape, SEED))
    outs = []
    for prompt in prompts:
        kv = model.new_kv(len(prompt) + max_tokens)
        logits = model.forward(prompt, kv)
        toks = [int(torch.argmax(logits))]
        while len(toks) < max_tokens:
            logits = model.forward([toks[-1]], kv)
            toks.append(int(torch.argmax(logits)))
        outs.append(toks)
    return outs


@contextmanager
def one_process_model(compiled_dir: Path, on_device_sampling_config: dict | None) -> Iterator:
    """The stand-in in this process as a one-node unit (tp_degree 2, batch 2, seq_len 32) inside a
    one-rank gloo group, compiled and loaded; the group is torn down on exit."""
    import nxdi_standin as nxdi  # noqa: PLC0415

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
        timeout=datetime.timedelta(seconds=30),
    )  # fmt: skip
    try:
        config = nxdi.NeuronConfig(
            tp_degree=2,
            batch_size=2,
            seq_len=32,
            is_continuous_batching=True,
            on_device_sampling_config=on_device_sampling_config,
        )
        model = nxdi.NeuronLlamaForCausalLM("tiny", nxdi.LlamaInferenceConfig(config, load_config=(SHAPE, SEED)))
        model.compile(str(compiled_dir))
        model.load(str(compiled_dir))
        yield model
    finally:
        dist.destroy_process_group()
