"""Per-line cost of reading a leader's load-only watch line: the router's hand parse (orjson, then
contract.ready.load_figures on the dict) against the typed ready-body parser (runtime.node.handshake.read_ready).

In-process and CPU-bound: figures move with the machine's load; print them with the load average.
Run: .venv/bin/python -m bench.router.ready_parse [--lines N]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import timeit
from collections.abc import Callable
from functools import partial
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
# Imported after the path to this checkout is known:
from contract.ready import load_figures  # noqa: E402
from contract.watch import watch_json  # noqa: E402
from runtime.node.handshake import Load, ReadyReport, read_ready  # noqa: E402
from runtime.router.discovery import MemberEndpoint  # noqa: E402
from runtime.router.fleet import Member  # noqa: E402

# What a busy leader sends for a load change: its whole load and the routing keys it admitted.
LINE = json.dumps(
    {
        "load": Load(in_flight=5, queue_depth=1, running=4, max_running=8, kv_cache_used=0.31).to_dict(),
        "keys": [1234567],
    }
).encode()


def hand(unit: Member, line: bytes = LINE) -> None:
    body = watch_json(line)
    if not isinstance(body, dict):
        raise ValueError("not an object")
    for _k in body.get("keys") or ():
        pass
    if "state" not in body:
        unit.take_load(load_figures(body["load"]))


def typed(unit: Member, line: bytes = LINE) -> None:
    report = read_ready(watch_json(line))
    for _k in report.keys:
        pass
    if report.state is None:
        load = report.load
        unit.in_flight, unit.queue_depth, unit.running = load.in_flight, load.queue_depth, load.running
        unit.max_running, unit.kv_cache_used, unit.wait_s = load.max_running, load.kv_cache_used, load.wait_s
        unit.queue_timeout_s, unit.prefill_tokens = load.queue_timeout_s, load.prefill_tokens


def typed_json(unit: Member, line: bytes = LINE) -> None:  # noqa: ARG001 (the same call as the others)
    ReadyReport.model_validate_json(line)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=20000, help="lines per timing run (best of 5 runs)")
    n = ap.parse_args().lines
    unit = Member(MemberEndpoint(url="http://127.0.0.1:1"))
    results = {}
    parsers: dict[str, Callable[[Member], None]] = {"hand": hand, "typed": typed, "typed_json": typed_json}
    for name, fn in parsers.items():
        best = min(timeit.repeat(partial(fn, unit), number=n, repeat=5))
        results[name] = best / n * 1e6
    base = results["hand"]
    print(f"load-only watch line, {len(LINE)} bytes, best of 5 x {n} lines; {platform.python_version()}")
    for name, us in results.items():
        print(f"  {name:<11} {us:6.2f} us/line  ({us / base - 1:+.0%} vs hand)")
    print(f"load average: {Path('/proc/loadavg').read_text().strip()}")


if __name__ == "__main__":
    main()
