"""Reference-engine benchmarks on SmolLM2: `make bench-engine` (or
`python bench/engine/bench.py --threads 1 --repeats 3`). Prints a markdown table; JSON to --out.

1. tokens/s at 1, 4, 16 concurrent requests vs plain transformers `generate` one at a time;
2. decode time per token at batch 1 vs the memory-bandwidth floor measured here;
3. TTFT and time per output token (one request at a time) and tokens/s at 16 concurrent for the
   four prefill/decode combinations on 2 ranks.
Every contender gets the same torch thread count. Figures are medians of --repeats runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from runtime.engines.base import GenerationRequest, SamplingParams  # noqa: E402
from runtime.engines.reference import ReferenceEngine, run_worker  # noqa: E402
from runtime.membership import Membership  # noqa: E402
from runtime.models.smollm2 import ensure_smollm2, smollm2_shape  # noqa: E402
from runtime.ports import free_port  # noqa: E402

QUESTIONS = [
    "What is the capital of France?",
    "Name three primary colors.",
    "Why is the sky blue?",
    "Write a haiku about autumn.",
    "What is 12 times 7?",
    "Give me a tip for learning Python.",
    "Who wrote Hamlet?",
    "Describe a cat in one line.",
]
MAX_TOKENS = 32
LONG_PROMPT = 512


def prompts(tokenizer, n: int) -> list[list[int]]:
    return [
        tokenizer.apply_chat_template([{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}]) for i in range(n)
    ]


async def _stream(engine, rid, prompt, max_tokens):
    """(ttft, [token times]) of one request."""
    t0 = time.perf_counter()
    times = []
    req = GenerationRequest(
        request_id=rid, prompt_token_ids=tuple(prompt), sampling=SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    )
    async for _ in engine.generate(req):
        times.append(time.perf_counter() - t0)
    return times


async def _concurrent_rate(engine, tag: str, n: int) -> float:
    """tokens/s of n requests streamed at once (the prompts are tokenized before the clock starts)."""
    ps = prompts(engine.tokenizer, n)
    t0 = time.perf_counter()
    res = await asyncio.gather(*[_stream(engine, f"{tag}-{i}", p, MAX_TOKENS) for i, p in enumerate(ps)])
    return sum(len(x) for x in res) / (time.perf_counter() - t0)


async def engine_throughput(threads: int, repeats: int) -> dict:
    solo = Membership(unit_id="b", revision="1", rank=0, world_size=1, dist_host="127.0.0.1", dist_port=1)
    engine = ReferenceEngine(solo, model="smollm2", threads=threads, max_running=16)
    await engine.start()
    out = {}
    for conc in (1, 4, 16):
        rates = [await _concurrent_rate(engine, f"c{conc}-{r}", conc) for r in range(repeats)]
        out[conc] = statistics.median(rates)
    # batch-1 decode time per token: gaps between streamed tokens of a lone request
    gaps = []
    for r in range(repeats):
        times = await _stream(engine, f"tpot-{r}", prompts(engine.tokenizer, 1)[0], 64)
        gaps += [b - a for a, b in zip(times[1:], times[2:])]
    await engine.shutdown()
    return {"tokens_per_s": out, "decode_s_per_token_batch1": statistics.median(gaps)}


def transformers_baseline(threads: int, repeats: int, n_requests: int = 4) -> float:
    # transformers takes seconds to import and only this contender uses it (not the rank processes).
    from transformers import AutoTokenizer, LlamaForCausalLM  # noqa: PLC0415

    torch.set_num_threads(threads)
    d = ensure_smollm2()
    tok = AutoTokenizer.from_pretrained(str(d))
    model = LlamaForCausalLM.from_pretrained(str(d), dtype=torch.float32).eval()
    rates = []
    ps = prompts(_Wrap(tok), n_requests)
    for _ in range(repeats):
        t0, n = time.perf_counter(), 0
        for p in ps:  # one at a time, as a naive server would
            with torch.no_grad():
                out = model.generate(
                    torch.tensor([p]), max_new_tokens=MAX_TOKENS, min_new_tokens=MAX_TOKENS, do_sample=False
                )
            n += out.shape[1] - len(p)
        rates.append(n / (time.perf_counter() - t0))
    return statistics.median(rates)


class _Wrap:
    def __init__(self, tok):
        self.tok = tok

    def apply_chat_template(self, messages):
        out = self.tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(out["input_ids"] if hasattr(out, "keys") else out)


def memory_bandwidth_gbs(threads: int, repeats: int) -> float:
    """Streaming read bandwidth: sum() over a 512 MiB fp32 tensor (reads it once, writes nothing)."""
    torch.set_num_threads(threads)
    x = torch.ones(128 * 2**20)
    x.sum()
    best = []
    for _ in range(max(repeats, 3)):
        t0 = time.perf_counter()
        x.sum()
        best.append(x.numel() * 4 / (time.perf_counter() - t0) / 1e9)
    return statistics.median(best)


def weight_bytes() -> int:
    s = smollm2_shape()
    # every decode step reads each layer and the LM head (= the tied embedding) once
    return 4 * (s.num_layers * s.layer_params + s.vocab_size * s.hidden_size + s.hidden_size)


def two_rank_combos(threads: int, repeats: int) -> dict:
    port = free_port(span=len(COMBOS))  # combination n rendezvouses on port + n
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS=str(threads))
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--rank",
                str(r),
                "--port",
                str(port),
                "--threads",
                str(threads),
                "--repeats",
                str(repeats),
            ],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    out, _ = procs[0].communicate(timeout=1200)
    procs[1].wait(timeout=60)
    return json.loads(out.strip().splitlines()[-1])


COMBOS = [("pipeline", "tensor"), ("pipeline", "pipeline"), ("tensor", "tensor"), ("tensor", "pipeline")]


def rank_main(rank: int, port: int, threads: int, repeats: int) -> None:
    torch.set_num_threads(threads)
    found = {}
    for n, (prefill, decode) in enumerate(COMBOS):
        m = Membership(unit_id="b", revision="1", rank=rank, world_size=2, dist_host="127.0.0.1", dist_port=port + n)
        if rank:
            run_worker(m, model="smollm2", prefill=prefill, decode=decode)
            continue

        async def go():
            engine = ReferenceEngine(m, model="smollm2", prefill=prefill, decode=decode)
            await engine.start()
            ttfts, tpots = [], []
            for r in range(repeats):
                for i, p in enumerate(prompts(engine.tokenizer, 4)):
                    times = await _stream(engine, f"{r}-{i}", p, MAX_TOKENS)
                    ttfts.append(times[0])
                    tpots.append((times[-1] - times[0]) / (len(times) - 1))
            long_prompt = engine.tokenizer.encode(" ".join(QUESTIONS) * 20)[:LONG_PROMPT]
            long_ttfts = [(await _stream(engine, f"long{r}", long_prompt, 2))[0] for r in range(repeats)]
            rates = [await _concurrent_rate(engine, f"x{r}", 16) for r in range(repeats)]
            await engine.shutdown()
            return (
                statistics.median(ttfts),
                statistics.median(tpots),
                statistics.median(rates),
                statistics.median(long_ttfts),
            )

        found[f"{prefill}/{decode}"] = asyncio.run(go())
    if rank == 0:
        print(json.dumps(found), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "engine.json"))
    ap.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank is not None:
        rank_main(args.rank, args.port, args.threads, args.repeats)
        return
    torch.set_num_threads(args.threads)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load = os.getloadavg()
    eng = asyncio.run(engine_throughput(args.threads, args.repeats))
    base = transformers_baseline(args.threads, args.repeats)
    bw = memory_bandwidth_gbs(args.threads, args.repeats)
    floor = weight_bytes() / (bw * 1e9)
    combos = two_rank_combos(args.threads, args.repeats)
    result = {
        "started": started,
        "loadavg_at_start": load,
        "threads": args.threads,
        "repeats": args.repeats,
        "max_tokens": MAX_TOKENS,
        "engine": eng,
        "transformers_one_at_a_time_tokens_per_s": base,
        "bandwidth_gb_s": bw,
        "weight_bytes": weight_bytes(),
        "floor_s_per_token": floor,
        "two_ranks": combos,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    tps = eng["tokens_per_s"]
    print(
        f"SmolLM2-135M fp32, {args.threads} torch thread(s) per process, medians of {args.repeats}, "
        f"{MAX_TOKENS} new tokens per request; started {started}, load average {load[0]:.1f}\n"
    )
    print("| contender | concurrent | tokens/s | vs transformers |\n|---|---|---|---|")
    print(f"| transformers generate, one at a time | 1..16 | {base:.1f} | 1.0x |")
    for c in (1, 4, 16):
        print(f"| reference engine (1 rank) | {c} | {tps[c]:.1f} | {tps[c] / base:.1f}x |")
    d = eng["decode_s_per_token_batch1"]
    print(
        f"\n| decode, batch 1 | ms/token |\n|---|---|\n| reference engine | {d * 1e3:.1f} |\n"
        f"| floor: {weight_bytes() / 1e6:.0f} MB weights / {bw:.1f} GB/s | {floor * 1e3:.1f} |\n"
        f"| ratio | {d / floor:.2f}x |"
    )
    print(
        f"\n| 2 ranks, prefill/decode | TTFT ms (chat prompt) | TTFT ms ({LONG_PROMPT}-token "
        "prompt) | TPOT ms (1 request) | tokens/s (16 concurrent) |\n|---|---|---|---|---|"
    )
    for k, (ttft, tpot, rate, long_ttft) in combos.items():
        print(f"| {k} | {ttft * 1e3:.1f} | {long_ttft * 1e3:.1f} | {tpot * 1e3:.1f} | {rate:.1f} |")


if __name__ == "__main__":
    main()
