"""What the router and fleet benchmarks share: starting the router pinned to a core, reading a
process's CPU time, percentiles, and appending a run to a results file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import IO, Any


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
    flags: list[str],
    router_args: str,
    cwd: str | Path,
    stderr: IO[bytes],
    env: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """`python -m runtime router` on 127.0.0.1:`port`, pinned to `cpus`, with `flags` (its discovery)
    and then the run's own `router_args` (last, so they win). WARNING level and no drain grace:
    only the work of routing is measured, and stopping it is immediate. Its log goes to `stderr`, a
    file, as a container's would: writing it is part of the router's cost. `cwd` is the checkout
    whose runtime/ runs (`-m` imports from there)."""
    return subprocess.Popen(
        pinned(
            cpus,
            sys.executable,
            "-m",
            "runtime",
            "router",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "WARNING",
            "--drain-grace",
            "0",
            *flags,
            *router_args.split(),
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


def pct(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank, no interpolation) of `values`; NaN when there are none."""
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * q / 100))]


def append_run(out: str | Path, record: dict[str, Any]) -> None:
    """Add one run to the JSON list in `out` (created with its folder if missing)."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    runs = json.loads(path.read_text()) if path.exists() else []
    runs.append(record)
    path.write_text(json.dumps(runs, indent=1) + "\n")
