"""Where a batch-1 decode step's time goes, executor only (no server, no scheduler): part of
`make bench-engine`, or on its own `python -m bench.engine.steps` (cores 0-1, prints one JSON line).

Four ways on the same two cores, the same 30-token prompt, the same fed-back token, medians over
--steps steps after --warm ones:
- one rank with one thread, and one rank with two threads (the alternatives on these cores);
- two ranks, tensor-parallel over shared memory, with rank 0's time inside all_reduce measured;
- two ranks again with every all_reduce replaced by the identity, so no rank ever waits for the
  other: the outputs are wrong, but the time is what the ranks' own work costs, the bound that a
  faster all-reduce could approach and not pass.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

PROMPT = list(range(1, 31))
TOKEN = 5


def _executor(model: str, ranks: int, rank: int, comm=None):
    from runtime.engines.executor import ShardExecutor  # noqa: PLC0415
    from runtime.engines.layout import make_plan  # noqa: PLC0415
    from runtime.models.registry import resolve_model  # noqa: PLC0415

    src = resolve_model(model)
    uneven = comm is not None and comm.transport == "shm"
    plan = make_plan(src.shape, ranks, prefill="tensor", decode="tensor", split_uneven_heads=uneven)
    return ShardExecutor(plan=plan, rank=rank, weights=src.weights, comm=comm)


def _decode_loop(step, warm: int, steps: int, on_timed=None) -> list[float]:
    from runtime.engines.executor import StepCommand  # noqa: PLC0415

    step(StepCommand(prefill=[(1, len(PROMPT), len(PROMPT) + warm + steps + 1)], prefill_tokens=[PROMPT]))
    times = []
    for i in range(warm + steps):
        if i == warm and on_timed is not None:
            on_timed()
        t0 = time.perf_counter()
        step(StepCommand(decode=[1], decode_tokens=[TOKEN]))
        times.append(time.perf_counter() - t0)
    step(StepCommand(free=[1]))
    return times[warm:]


def one_rank(model: str, threads: int, warm: int, steps: int) -> dict:
    import torch  # noqa: PLC0415

    torch.set_num_threads(threads)
    ex = _executor(model, 1, 0)
    times = _decode_loop(ex.run, warm, steps)
    return {"step_ms": 1e3 * statistics.median(times)}


def _rank(rank: int, model: str, port: int, skip: bool, warm: int, steps: int, out: str) -> None:
    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415

    from runtime.engines.collectives import connect  # noqa: PLC0415
    from runtime.engines.executor import OP_SHUTDOWN  # noqa: PLC0415

    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[rank]})
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=120)
    )
    comm = connect(rank, 2, timeout_s=120, transport="shm")
    ex = _executor(model, 2, rank, comm)
    spent = [0.0]
    if skip:
        ex._all_reduce = lambda t: t
    else:
        real = ex._all_reduce

        def timed(t):
            t0 = time.perf_counter()
            real(t)
            spent[0] += time.perf_counter() - t0
            return t

        ex._all_reduce = timed
    if rank != 0:
        ex.follower_loop()
    else:
        times = _decode_loop(ex.leader_step, warm, steps, on_timed=lambda: spent.__setitem__(0, 0.0))
        ex.leader_signal(OP_SHUTDOWN)
        found = {"step_ms": 1e3 * statistics.median(times)}
        if not skip:
            found["rank0_all_reduce_ms_per_step"] = 1e3 * spent[0] / steps
        Path(out).write_text(json.dumps(found))
    comm.close()
    dist.destroy_process_group()


def two_ranks(model: str, skip: bool, warm: int, steps: int) -> dict:
    import tempfile  # noqa: PLC0415

    import torch.multiprocessing as mp  # noqa: PLC0415

    from runtime.ports import free_port  # noqa: PLC0415

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rank0.json")
        mp.spawn(_rank, args=(model, free_port(), skip, warm, steps, out), nprocs=2)
        return json.loads(Path(out).read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warm", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3, help="each way this many times, interleaved; medians")
    ap.add_argument("--model", default="smollm2", help="smollm2, tiny or a checkpoint directory")
    args = ap.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("needs two cores (run under taskset -c 0-1)")
    ways = {
        "1 rank, 1 thread": lambda: _in_child(one_rank, args.model, 1, args.warm, args.steps),
        "1 rank, 2 threads": lambda: _in_child(one_rank, args.model, 2, args.warm, args.steps),
        "2 ranks, shared memory": lambda: two_ranks(args.model, False, args.warm, args.steps),
        "2 ranks, all-reduce skipped": lambda: two_ranks(args.model, True, args.warm, args.steps),
    }
    runs: dict[str, list[dict]] = {name: [] for name in ways}
    for _ in range(args.repeats):  # interleaved, so a slow spell of the machine hits every way
        for name, way in ways.items():
            runs[name].append(way())
    found = {
        name: {key: statistics.median(r[key] for r in rs) for key in rs[0]} | {"runs": rs} for name, rs in runs.items()
    }
    print(json.dumps({"steps": args.steps, "repeats": args.repeats, "ways": found}), flush=True)


def _in_child(fn, *args) -> dict:
    """A one-rank way in a fresh process, as the two-rank ways get theirs."""
    import multiprocessing  # noqa: PLC0415

    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(fn, args)


if __name__ == "__main__":
    main()
