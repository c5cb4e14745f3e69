"""Synth benchmark: wall time and peak memory of `make synth` for the default deployment and the
20,480-chip fleet, resources per stack, growth with the number of units, and what Node 22 and
CDK's built-in template validation cost. Run with `make bench-synth` (`python -m bench.synth.run`);
prints Markdown tables (for docs/benchmarks.md) and writes bench/results/synth.json. Its tiny mode
(--tiny: one `make synth` of the default deployment) is part of `make test`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from bench.measure import cpu_model, results_file, tiny_mode  # noqa: E402

FLEET = "examples/fleet-20k-chips.yaml"
MODEL_405B = "{name: llama-3.1-405b-instruct, s3_uri: 's3://flotilla-models-example/llama-3.1-405b-instruct/'}"
REPEATS = int(os.environ.get("BENCH_REPEATS", "3"))
TIMEOUT_S = 600


def timed(cmd: list[str], env: dict | None = None) -> tuple[float, float, int]:
    """(wall s, CPU s = user + sys of the whole process tree, peak RSS MB of the largest process)
    via GNU time -v. CPU time is what to compare when other work shares the machine."""
    proc = subprocess.run(
        ["/usr/bin/time", "-v", *cmd], cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S, env=env
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    wall = _time_field(r"Elapsed \(wall clock\) time.*: (?:(\d+):)?(\d+):([\d.]+)", proc.stderr)
    hours, minutes, seconds = (float(g) if g else 0.0 for g in wall.groups())
    rss_kb = int(_time_field(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr).group(1))
    cpu = sum(
        float(_time_field(rf"{kind} time \(seconds\): ([\d.]+)", proc.stderr).group(1)) for kind in ("User", "System")
    )
    return hours * 3600 + minutes * 60 + seconds, cpu, rss_kb // 1024


def _time_field(pattern: str, report: str) -> re.Match[str]:
    m = re.search(pattern, report)
    if m is None:
        raise RuntimeError(f"GNU time -v printed no line matching {pattern!r}: is /usr/bin/time GNU time?")
    return m


def median_run(cmd: list[str], env: dict | None = None) -> dict:
    runs = [timed(cmd, env) for _ in range(REPEATS)]
    return {
        "wall_s": round(statistics.median(r[0] for r in runs), 2),
        "wall_min_s": round(min(r[0] for r in runs), 2),
        "wall_runs_s": [round(r[0], 2) for r in runs],
        "cpu_s": round(statistics.median(r[1] for r in runs), 2),
        "peak_rss_mb": max(r[2] for r in runs),
    }


def make_synth(config: str | None = None) -> dict:
    # `-o deps`: this target's own prerequisite already brought them up to date; the synth is what is timed.
    # Said here, not inherited: make never passes -o to a sub-make (GNU make manual, "Communicating Options to a
    # Sub-make": "The options '-C', '-f', '-o', and '-W' are not put into MAKEFLAGS").
    cmd = ["make", "-s", "-o", "deps", "synth"] + ([f"CONFIG={config}"] if config else [])
    return median_run(cmd)


def resources_per_stack() -> dict[str, int]:
    manifest = json.loads((REPO / "cdk.out" / "manifest.json").read_text())
    out = {}
    for name, art in manifest["artifacts"].items():
        if art["type"] == "aws:cloudformation:stack":
            template = json.loads((REPO / "cdk.out" / art["properties"]["templateFile"]).read_text())
            out[name] = len(template["Resources"])
    return out


def env_with_system_node() -> dict:
    """The Makefile's environment, but with the system node instead of node_modules' Node 22."""
    env = dict(os.environ)
    node22 = str(REPO / "node_modules" / "node" / "bin")
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if p != node22)
    return env


def node_version(env: dict) -> str:
    return subprocess.run(["node", "--version"], capture_output=True, text=True, env=env, timeout=30).stdout.strip()


IN_PROCESS = """
import json, sys, time
t0 = time.perf_counter()
import aws_cdk as cdk
from stacks.config import load_config
from stacks.deployment import build_deployment
ctx = json.load(open('cdk.json'))['context']
app = cdk.App(builtin_cloud_formation_validation=(sys.argv[1] == 'on'), context=ctx,
              outdir=sys.argv[2])
build_deployment(app, load_config(ctx['flotilla'], None))
app.synth()
print(round(time.perf_counter() - t0, 2))
"""


def builtin_validation_cost() -> dict:
    out = {}
    for mode in ("off", "on"):
        with tempfile.TemporaryDirectory() as outdir:
            out[mode] = median_run([sys.executable, "-c", IN_PROCESS, mode, outdir])
    return out


def units_scaling() -> dict[int, dict]:
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for units in (1, 20, 160):
            path = Path(tmp) / f"units-{units}.yaml"
            # Units of 4 nodes serving Llama-3.1-405B: a model whose heads split over that many (synth
            # refuses a unit size the model cannot be split over, docs/model-layout.md).
            path.write_text(f"units: {units}\nnodes_per_unit: 4\nmodel: {MODEL_405B}\n")
            out[units] = make_synth(str(path))
            out[units]["stacks"] = len(resources_per_stack())
    return out


def main(argv: list[str] | None = None) -> None:
    global REPEATS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    tiny = tiny_mode(ap, argv)
    ap.parse_args(argv)
    if tiny:
        REPEATS = 1
    load = os.getloadavg()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    results: dict = {
        "started": started,
        "nproc": os.cpu_count(),
        "cpu": cpu_model(),
        "loadavg_at_start": load,
        "repeats": REPEATS,
        "node": node_version(dict(os.environ)),
        "system_node": node_version(env_with_system_node()),
    }
    results["default"] = make_synth()
    results["default"]["resources"] = resources_per_stack()
    if not tiny:
        measure_the_rest(results)
    results["loadavg_at_end"] = os.getloadavg()
    out = results_file("synth.json", tiny)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print_markdown(results)


def measure_the_rest(results: dict) -> None:
    """The 20,480-chip fleet, the growth with units, the two Nodes and the built-in validation."""
    results["fleet"] = make_synth(FLEET)
    results["fleet"]["resources"] = resources_per_stack()
    results["units"] = units_scaling()
    # The same fleet synth through the CLI on the system node (Node 20 here).
    cdk = [str(REPO / "node_modules" / ".bin" / "cdk"), "synth", "--quiet", "-c", f"config={FLEET}"]
    results["fleet_system_node"] = median_run(cdk, env_with_system_node())
    results["fleet_node22"] = median_run(cdk)
    results["builtin_validation"] = builtin_validation_cost()


def print_markdown(r: dict) -> None:
    print(
        f"Measured {r['started']}, {r['nproc']} cores, load average {r['loadavg_at_start'][0]:.1f}"
        f" at start / {r['loadavg_at_end'][0]:.1f} at end, median of {r['repeats']} runs.\n"
    )
    print("| what | wall median (s) | wall min (s) | CPU user+sys (s) | peak RSS (MB) |\n|---|---|---|---|---|")
    if "fleet" not in r:  # --tiny: the default deployment only
        d = r["default"]
        print(f"| `make synth` default | {d['wall_s']} | {d['wall_min_s']} | {d['cpu_s']} | {d['peak_rss_mb']} |")
        print(f"\nresources per stack: {d['resources']}")
        return
    rows = [
        ("`make synth` default (1 unit x 1 trn1.32xlarge)", r["default"]),
        ("`make synth` 20,480-chip fleet (320 units x 4)", r["fleet"]),
        *[(f"`make synth` {u} units x 4 nodes ({v['stacks']} stacks)", v) for u, v in r["units"].items()],
        (f"fleet, cdk CLI on system node {r['system_node']}", r["fleet_system_node"]),
        (f"fleet, cdk CLI on node {r['node']} (node_modules)", r["fleet_node22"]),
        ("in-process default synth, built-in CFN validation off", r["builtin_validation"]["off"]),
        ("in-process default synth, built-in CFN validation on", r["builtin_validation"]["on"]),
    ]
    for name, v in rows:
        print(f"| {name} | {v['wall_s']} | {v['wall_min_s']} | {v['cpu_s']} | {v['peak_rss_mb']} |")
    print("\n| stack | resources (default) | resources (fleet) |\n|---|---|---|")
    for stack in sorted(set(r["default"]["resources"]) | set(r["fleet"]["resources"]), key=lambda s: (len(s), s)):
        print(f"| {stack} | {r['default']['resources'].get(stack, '-')} | {r['fleet']['resources'].get(stack, '-')} |")


if __name__ == "__main__":
    main()
