"""What the benchmarks share: the CPU model every result records, starting the router pinned to a
core, reading a process's CPU time, a process's descendants, percentiles, appending a run to a
results file, and the tiny mode every benchmark command has."""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from runtime.router.settings import router_command

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
# A tiny run's figures prove only that the command runs end to end: they go here (git-ignored), never
# into bench/results/ or docs/benchmarks.md.
TINY_RESULTS = REPO / ".cache" / "bench-tiny"
TINY_HELP = (
    "tiny mode: a few requests in seconds through the same code, to prove the command still runs "
    "(`make bench-... TINY=1`; `make test` runs every bench target so); figures go to .cache/bench-tiny/"
)


def tiny_mode(ap: argparse.ArgumentParser, argv: Sequence[str] | None = None, **small: Any) -> bool:
    """Give `ap` the --tiny flag every benchmark takes; when the command line has it, `small` replaces
    the full run's defaults (flags given on the command line still win). True in tiny mode."""
    ap.add_argument("--tiny", action="store_true", help=TINY_HELP)
    tiny = "--tiny" in (sys.argv[1:] if argv is None else argv)
    if tiny:
        ap.set_defaults(**small)
    return tiny


def results_file(name: str, tiny: bool) -> Path:
    """Where a run's figures go: bench/results/<name>, or .cache/bench-tiny/<name> for a tiny run."""
    return (TINY_RESULTS if tiny else RESULTS) / name


def cpu_model() -> str:
    """The CPU's model name as /proc/cpuinfo gives it ("Intel(R) Xeon(R) Processor", "AMD EPYC"):
    every published figure names the CPU it ran on, since kernels and timings differ between them."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    return next(
        (line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), platform.processor()
    )


def process_tree(root: int) -> list[int]:
    """root and its descendants' pids (from /proc: Linux only, as the suites are). Node processes
    start their engines in sessions of their own, so a process group does not cover them."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])  # the field after the state
            parents.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(parents.get(pid, []))
    return out


def pin_self(cpus: str) -> None:
    """Keep this process (the load generator) on `cpus` ("1" or "1,2"), off the router's core."""
    os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})


def pinned(cpus: str, *argv: str) -> list[str]:
    """`argv` run on `cpus` only (taskset -c)."""
    return ["taskset", "-c", cpus, *argv]


def start_router(
    *,
    cpus: str,
    port: int,
    settings: Mapping[str, Any],
    router_args: str,
    cwd: str | Path,
    stderr: IO[bytes],
    env: dict[str, str] | None = None,
    metrics_port: int | None = None,
) -> subprocess.Popen[bytes]:
    """`python -m runtime router` on 127.0.0.1:`port`, pinned to `cpus`, with `settings` (its discovery)
    and then the run's own `router_args` (last, so they win). WARNING level and no drain grace:
    only the work of routing is measured, and stopping it is immediate. Its log goes to `stderr`, a
    file, as a container's would: writing it is part of the router's cost. `cwd` is the checkout
    whose runtime/ runs (`-m` imports from there)."""
    return subprocess.Popen(
        pinned(
            cpus,
            *router_command(
                host="127.0.0.1",
                port=port,
                metrics_port=metrics_port,  # None: the flag left out (a checkout that predates it)
                log_level="WARNING",
                drain_grace_s=0,
                **settings,
                extra=router_args.split(),
            ),
        ),
        cwd=cwd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=stderr,
    )


def cpu_seconds(pid: int) -> float:
    """user + system CPU time of a process: the router's cost, robust to a busy machine (proc(5):
    utime and stime are fields 14 and 15 of /proc/<pid>/stat, in clock ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_split(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a process, the two halves of cpu_seconds: Python work shows as
    user time, socket reads and writes in the kernel as system time."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def pct(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank, no interpolation) of `values`; NaN when there are none."""
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * q / 100))]


def append_run(out: str | Path, record: dict[str, Any]) -> None:
    """Add one run, with the CPU it ran on, to the JSON list in `out` (created with its folder if missing)."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    runs = json.loads(path.read_text()) if path.exists() else []
    runs.append({**record, "cpu": record.get("cpu", cpu_model())})
    path.write_text(json.dumps(runs, indent=1) + "\n")
