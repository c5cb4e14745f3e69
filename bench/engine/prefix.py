"""The reference engine's prefix cache on a production conversation trace, one rank:
`make bench-prefix` or `python -m bench.engine.prefix [--model smollm2] [--requests 300]` (prints a
table, appends JSON to bench/results/prefix.json; --tiny: the tiny model, 5 requests).

The first --requests of the Mooncake conversation trace (traces/), in arrival order, one
after the other through one engine, with the cache and without it. Scaled to a small model: each
512-token block id of the trace becomes a fixed run of 16 token ids (so requests that share a prefix
in the trace share it token for token, at 1/32 of the length), a prompt is its input_length / 32
tokens, and every answer is --max-tokens long (the prefill is what the cache saves).

Hit rate, cached tokens and the prompt tokens computed come from the engine's own counters and do
not depend on the machine. The prefill times (time to the first token, one request at a time)
do: they are provisional unless measured on a quiet machine.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench.measure import append_run, results_file, tiny_mode  # noqa: E402
from traces import open_trace, unreadable  # noqa: E402

TRACE_BLOCK, BLOCK = 512, 16  # the trace's block, and the tokens each of its ids becomes here


def scaled_prompts(trace: str, n: int, vocab: int, max_prompt: int) -> list[list[int]]:
    """Prompts whose shared prefixes follow the trace's hash ids, block for block."""
    out: list[list[int]] = []
    with open_trace(trace) as f:
        for line in f:
            if len(out) == n:
                break
            r = json.loads(line)
            ids = []
            for h in r["hash_ids"]:
                rng = random.Random(h)  # the same id gives the same tokens in every request
                ids += [rng.randrange(100, vocab) for _ in range(BLOCK)]
            length = max(1, min(-(-r["input_length"] // (TRACE_BLOCK // BLOCK)), max_prompt))
            out.append(ids[:length])
    return out


async def replay(model: str, prompts: list[list[int]], *, caching: bool, max_tokens: int, budget: int) -> dict:
    from runtime.engines.base import GenerationRequest, SamplingParams  # noqa: PLC0415
    from runtime.engines.reference import ReferenceEngine  # noqa: PLC0415
    from runtime.membership import Membership  # noqa: PLC0415

    solo = Membership(unit_id="bench", revision="1", rank=0, world_size=1, dist_host="127.0.0.1", dist_port=1)
    engine = ReferenceEngine(solo, model=model, prefix_caching=caching, kv_budget_tokens=budget)
    await engine.start()
    ttft, cached = [], []
    for i, p in enumerate(prompts):
        sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        t0 = time.perf_counter()
        events: list = []
        async for ev in engine.generate(GenerationRequest(request_id=f"r{i}", prompt_token_ids=tuple(p), sampling=sp)):
            if not events:
                ttft.append(time.perf_counter() - t0)
            events.append(ev)
        cached.append(events[-1].cached_tokens)
    load = engine.load()
    await engine.shutdown()
    return {
        "ttft_s": ttft,
        "cached": cached,
        "queries": load.prefix_cache_queries,
        "hits": load.prefix_cache_hits,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--max-tokens", type=int, default=2)
    ap.add_argument("--max-prompt", type=int, default=1024, help="cap on a scaled prompt's tokens")
    ap.add_argument("--budget", type=int, default=16384, help="the engine's kv_budget_tokens")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--trace", default="conversation", help="conversation, synthetic or a Mooncake JSONL path")
    ap.add_argument("--no-save", action="store_true")
    ap.add_argument("--out", default=str(results_file("prefix.json", tiny=False)))
    tiny_mode(ap, model="tiny", requests=5, max_prompt=64, out=str(results_file("prefix.json", tiny=True)))
    a = ap.parse_args()
    import torch  # noqa: PLC0415

    from runtime.models.registry import resolve_model  # noqa: PLC0415

    torch.set_num_threads(a.threads)
    vocab = resolve_model(a.model).shape.vocab_size
    try:
        prompts = scaled_prompts(a.trace, a.requests, vocab, a.max_prompt)
    except OSError as exc:
        ap.error(unreadable("--trace", a.trace, exc))
    with_cache = asyncio.run(replay(a.model, prompts, caching=True, max_tokens=a.max_tokens, budget=a.budget))
    without = asyncio.run(replay(a.model, prompts, caching=False, max_tokens=a.max_tokens, budget=a.budget))
    total = sum(map(len, prompts))
    row = {
        "when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "model": a.model,
        "requests": len(prompts),
        "scaling": f"{TRACE_BLOCK}-token trace block -> {BLOCK} tokens; prompt = input_length / 32 "
        f"(cap {a.max_prompt}); {a.max_tokens} output tokens; one request at a time; kv_budget {a.budget}",
        "prompt_tokens": total,
        "hit_rate": with_cache["hits"] / with_cache["queries"],
        "cached_tokens": sum(with_cache["cached"]),
        "computed_with_cache": total - sum(with_cache["cached"]),
        "ttft_p50_ms": {
            "cache": 1000 * statistics.median(with_cache["ttft_s"]),
            "no_cache": 1000 * statistics.median(without["ttft_s"]),
        },
        "ttft_mean_ms": {
            "cache": 1000 * statistics.fmean(with_cache["ttft_s"]),
            "no_cache": 1000 * statistics.fmean(without["ttft_s"]),
        },
        # The requests the cache served part of, each timed with the cache and without it.
        "ttft_p50_ms_of_hits": {
            "cache": 1000
            * statistics.median([t for t, c in zip(with_cache["ttft_s"], with_cache["cached"]) if c] or [0]),
            "no_cache": 1000
            * statistics.median([t for t, c in zip(without["ttft_s"], with_cache["cached"]) if c] or [0]),
        },
        "hits": sum(1 for c in with_cache["cached"] if c),
        "threads": a.threads,
        "loadavg": os.getloadavg(),
    }
    assert with_cache["queries"] == total and without["hits"] == 0
    print(json.dumps(row, indent=1))
    if not a.no_save:
        append_run(a.out, row)


if __name__ == "__main__":
    main()
