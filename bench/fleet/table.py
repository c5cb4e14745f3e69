"""Print bench/results/fleet.json and bench/results/policy_sim.json as the tables of docs/benchmarks.md
(Fleet): `python -m bench.fleet.table` (--tiny: the tiny runs' files in .cache/bench-tiny/)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
from bench.measure import results_file, tiny_mode  # noqa: E402


def fleet_table(path: Path) -> None:
    print(
        "| run | units / members | router CPU, idle fleet | router CPU, busy fleet | RSS (MiB) | "
        "dead / hung / unready: last new request after (s) | leaving the fleet: last request after (s) | "
        "requests to decoys / followers | req/s through the router | errors (of which in flight at a death) | "
        "load avg before / after |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for run in json.loads(path.read_text()):
        for r in run["results"]:
            by_mode = {f["mode"]: f for f in r["failover"]}
            deaths = " / ".join(f"{by_mode[m]['last_request_after_s']:.3f}" for m in ("exit", "hang", "unready"))
            errors = sum(v for k, v in r["statuses"].items() if k != "200")
            in_failover = sum(v for k, v in r["failover_statuses"].items() if k != "200")
            print(
                f"| {run['label']} | {r['units']} / {r['members']:,} | {r['idle_cpu_pct']:.1f} % | "
                f"{r['busy_fleet_cpu_pct']:.1f} % | {r['rss_mib_end']:.0f} | {deaths} | "
                f"{by_mode['leave']['last_request_after_s']:.3f} | {r['decoy_requests']} / {r['follower_requests']} | "
                f"{r['rps']:,.0f} | {errors} ({in_failover}) | "
                f"{run['loadavg_before'][0]:.1f} / {run['loadavg_after'][0]:.1f} |"
            )


def policy_table(path: Path) -> None:
    print(
        "| model | load reported within | load | policy | p50 wait (ms) | p99 wait (ms) | p99.9 wait (ms) | "
        "requests that waited | p99 vs ideal |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for entry in json.loads(path.read_text()):
        for run in entry["runs"]:
            p = run["params"]
            ideal = run["results"]["central"]["p99_s"]
            for name, r in run["results"].items():
                ratio = "1.0×" if r["p99_s"] <= ideal else (f"{r['p99_s'] / ideal:.1f}×" if ideal else "∞ (ideal 0)")
                print(
                    f"| {entry['label']} | {p['report_s'] * 1000:.0f} ms | {p['load']:.0%} | "
                    f"{'**' + name + '**' if name == 'p4c' else name} | {1000 * r['p50_s']:.0f} | "
                    f"{1000 * r['p99_s']:.0f} | {1000 * r['p999_s']:.0f} | {100 * r['waited']:.2f} % | {ratio} |"
                )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    tiny = tiny_mode(ap, argv)
    ap.parse_args(argv)
    if results_file("fleet.json", tiny).exists():
        fleet_table(results_file("fleet.json", tiny))
        print()
    if results_file("policy_sim.json", tiny).exists():
        policy_table(results_file("policy_sim.json", tiny))
    return 0


if __name__ == "__main__":
    sys.exit(main())
