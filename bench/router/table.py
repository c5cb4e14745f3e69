"""Print the runs recorded in bench/results/router.json as the markdown table of docs/benchmarks.md."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def main() -> int:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "bench" / "results" / "router.json"
    runs = json.loads(path.read_text())
    print(
        "| run | added p50 / p99 (ms), c=1 | router req/s, c=32 | router CPU per small request | "
        "stream: added to first event p50 (ms) | paced stream: added per event p50 / p99 (ms) | "
        "router CPU per 32-event stream | load avg at end |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for run in runs:
        s = run["summary"]

        def f(key: str, fmt: str = ".3f") -> str:
            return "n/a" if s.get(key) is None else format(s[key], fmt)

        print(
            f"| {run['label']} | {f('added_p50_ms')} / {f('added_p99_ms')} | "
            f"{f('router_rps_one_core', ',.0f')} | {f('router_cpu_us_per_small_request', '.0f')} µs | "
            f"{f('stream_added_first_event_p50_ms')} | "
            f"{f('paced_event_added_p50_ms')} / {f('paced_event_added_p99_ms')} | "
            f"{f('router_cpu_us_per_stream', '.0f')} µs | {run['loadavg_at_end'][0]:.1f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
