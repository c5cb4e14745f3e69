"""What a step that prefills a prompt chunk and decodes the running batch costs, in one pass through the
layers or in two (the prefill's, then the decode's): executor only, SmolLM2 on one rank with one thread
(a `make local` unit's engine). `python -m bench.engine.mixed` prints one JSON line per case and appends
them to bench/results/mixed_step.json; wall-clock, so run it on a quiet machine.

Each case: a running batch of `decode` sequences (64-token prompts), then steps that each prefill a
`chunk`-token piece of a fresh prompt (from position 64, a conversation's cached preamble) and decode
one token of every running sequence; the median of --steps such steps after --warm, timed with
both ways alternating step by step so drift in the machine's speed falls on both.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def case(ex, chunk: int, decode: int, warm: int, steps: int) -> dict:
    from runtime.engines.executor import StepCommand  # noqa: PLC0415

    running = list(range(decode))
    prompt = list(range(1, 65))
    capacity = 64 + 2 * (warm + steps) + 2
    ex.run(StepCommand(prefill=[(s, 64, capacity) for s in running], prefill_tokens=[prompt] * decode))
    fuses = ex._fuses
    times: dict[str, list[float]] = {"one pass": [], "two passes": []}
    seq = 1000
    for i in range(2 * (warm + steps)):
        way = "one pass" if i % 2 == 0 else "two passes"
        ex._fuses = fuses if way == "one pass" else (lambda: False)
        ids = [(7 * j + i) % 4000 + 1 for j in range(64 + chunk)]
        ex.run(StepCommand(prefill=[(seq, 64, 64 + chunk + 1)], prefill_tokens=[ids[:64]]))  # the "cached" preamble
        cmd = StepCommand(
            prefill=[(seq, 64 + chunk, 64 + chunk + 1)],
            prefill_tokens=[ids],
            cached=[64],
            decode=running,
            decode_tokens=[5] * decode,
        )
        t0 = time.perf_counter()
        ex.run(cmd)
        dt = time.perf_counter() - t0
        ex.run(StepCommand(free=[seq]))
        seq += 1
        if i >= 2 * warm:
            times[way].append(dt)
    ex._fuses = fuses
    ex.run(StepCommand(free=running))
    one, two = (statistics.median(times[w]) * 1000 for w in ("one pass", "two passes"))
    return {
        "chunk": chunk,
        "decode": decode,
        "one_pass_ms": round(one, 1),
        "two_passes_ms": round(two, 1),
        "saved_pct": round(100 * (1 - one / two), 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunks", default="32,128,256,512", help="prompt tokens per step, comma-separated")
    ap.add_argument("--decodes", default="4,16", help="running sequences decoded per step, comma-separated")
    ap.add_argument("--warm", type=int, default=2)
    ap.add_argument("--steps", type=int, default=9)
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "mixed_step.json"))
    a = ap.parse_args(argv)
    try:
        chunks = [int(c) for c in a.chunks.split(",")]
        decodes = [int(d) for d in a.decodes.split(",")]
    except ValueError:
        ap.error("--chunks and --decodes: whole numbers, comma-separated, e.g. 128,512")
    if min(chunks + decodes) < 1 or a.steps < 1 or a.warm < 0:
        ap.error("--chunks, --decodes and --steps must be at least 1, --warm at least 0")
    import torch  # noqa: PLC0415

    from runtime.engines.executor import ShardExecutor  # noqa: PLC0415
    from runtime.engines.layout import make_plan  # noqa: PLC0415
    from runtime.models.registry import resolve_model  # noqa: PLC0415

    torch.set_num_threads(1)
    src = resolve_model("smollm2")
    ex = ShardExecutor(plan=make_plan(src.shape, 1, prefill="tensor", decode="tensor"), rank=0, weights=src.weights)
    load = os.getloadavg()
    rows = []
    for c in chunks:
        for d in decodes:
            r = case(ex, c, d, a.warm, a.steps)
            rows.append(r)
            print(json.dumps(r), flush=True)
    record = {
        "at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cpu": cpu_name(),
        "load_before": [round(x, 2) for x in load],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "model": "smollm2",
        "threads": 1,
        "rows": rows,
    }
    print(json.dumps({k: v for k, v in record.items() if k != "rows"}))
    out = Path(a.out)
    history = json.loads(out.read_text()) if out.exists() else []
    out.write_text(json.dumps([*history, record], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
