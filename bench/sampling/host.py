"""What sampling on the host costs the multi-node leader per decode step (node.neuron_sampling=cpu).

With host sampling NxD Inference returns a logits row per sequence and the leader's loop picks each
token (runtime/engines/neuron/spmd.py, sample_on_host) before the next step can be broadcast: the
time here is added to every decode step of the unit. Rows are Llama 3.1's 128,256-token vocabulary
(tests/neuron/models/llama-3.1-405b/config.json) in float32, at batch sizes 1..64, for three kinds
of request: greedy (arg max only), top-k 50 / top-p 0.9 / temperature 0.7, and top-p 0.9 alone (no
top-k) on flat and on peaked rows (KINDS). Wall-clock figures: they depend on the CPU and its load, and each
run records both. Results are appended to bench/results/host_sampling.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from bench.measure import append_run, cpu_model, results_file, tiny_mode  # noqa: E402
from runtime.engines.neuron.spmd import sample_on_host  # noqa: E402

VOCAB = 128_256  # Llama 3.1 vocab_size
KINDS = {
    # [top_k, top_p, temperature] per row, as NxD Inference stacks them (spmd.Step.sampling_params),
    # and the spread of the logits: standard normal rows are nearly flat at 128k tokens (top-p's worst
    # case: the nucleus holds most of the vocabulary); "peaked" rows (standard deviation 3, an
    # assumption, not a measured model) put the nucleus among the most likely few hundred tokens.
    "greedy": ((1.0, 1.0, 1.0), 1.0),
    "top_k50_top_p0.9_t0.7": ((50.0, 0.9, 0.7), 1.0),
    "top_p0.9_t0.7": ((0.0, 0.9, 0.7), 1.0),
    "top_p0.9_t0.7_peaked": ((0.0, 0.9, 0.7), 3.0),
}


def time_step(
    batch: int, params: tuple[float, float, float], spread: float, repeats: int, generator: torch.Generator
) -> float:
    """Median seconds of one sample_on_host call over `batch` rows."""
    logits = torch.randn(batch, VOCAB, generator=generator) * spread
    rows = torch.tensor([params] * batch, dtype=torch.float32)
    sample_on_host(logits, rows, generator)  # warm-up: allocator and kernels
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        sample_on_host(logits, rows, generator)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", default="1,2,4,8,16,32,64", help="comma-separated batch sizes")
    p.add_argument("--repeats", type=int, default=9, help="timed calls per point (median reported)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (the leader's loop thread)")
    p.add_argument("--out", default=str(results_file("host_sampling.json", tiny=False)))
    tiny_mode(p, argv, batches="1,2", repeats=1, out=str(results_file("host_sampling.json", tiny=True)))
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    batches = [int(b) for b in args.batches.split(",")]
    results: dict[str, dict[int, float]] = {}
    print(f"{'batch':>5} " + " ".join(f"{k:>24}" for k in KINDS) + "   (ms per decode step)")
    for b in batches:
        row = []
        for kind, (params, spread) in KINDS.items():
            s = time_step(b, params, spread, args.repeats, generator)
            results.setdefault(kind, {})[b] = round(s * 1e3, 3)
            row.append(f"{s * 1e3:24.2f}")
        print(f"{b:>5} " + " ".join(row), flush=True)
    load = Path("/proc/loadavg").read_text().split()[:3]
    record = {
        "bench": "host_sampling",
        "vocab": VOCAB,
        "threads": args.threads,
        "repeats": args.repeats,
        "ms_per_step": results,
        "loadavg": " ".join(load),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
    }
    append_run(args.out, record)
    print(f"cpu {cpu_model()}; load average {' '.join(load)}; appended to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
