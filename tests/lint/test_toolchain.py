"""The toolchain the Makefile runs on is checked before synth, deploy and the tests build anything
(tools/check_toolchain.sh): Python 3.11 and the Node.js major version package.json pins."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHECK = REPO / "tools" / "check_toolchain.sh"
PINNED_NODE = json.loads((REPO / "package.json").read_text())["devDependencies"]["node"].split(".")[0]


def _fake(tmp_path: Path, name: str, prints: str) -> Path:
    """A stand-in `name` on a directory of its own that prints `prints` whatever it is asked."""
    bin_dir = tmp_path / f"bin-{name}-{prints}"
    bin_dir.mkdir()
    exe = bin_dir / name
    exe.write_text(f"#!/bin/sh\necho '{prints}'\n")
    exe.chmod(0o755)
    return exe


def _check(*args: str, path: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=path) if path is not None else None
    return subprocess.run([str(CHECK), *args], capture_output=True, text=True, env=env, timeout=30)


def test_a_python_other_than_3_11_is_refused_in_one_line_naming_the_fix(tmp_path):
    python = _fake(tmp_path, "python3", "3.12")
    run = _check("python", str(python))
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr == (
        f"error: {python} is Python 3.12, not 3.11: constraints.txt is locked on 3.11; "
        "pass PYTHON=/path/to/python3.11 to make\n"
    )
    assert _check("python", str(_fake(tmp_path, "python3", "3.11"))).returncode == 0


def test_a_missing_python_is_named(tmp_path):
    run = _check("python", str(tmp_path / "python3.11"))
    assert run.returncode == 2 and run.stderr.startswith(f"error: {tmp_path / 'python3.11'} not found: ")


def test_a_venv_made_with_another_python_asks_for_a_clean_rebuild(tmp_path):
    run = _check("venv", str(_fake(tmp_path, "python", "3.10")))
    assert run.returncode == 2 and "make clean, then make synth" in run.stderr


@pytest.mark.parametrize("version, ok", [(f"v{PINNED_NODE}.1.0", True), ("v20.20.2", False), ("v24.0.0", False)])
def test_node_must_be_the_major_version_package_json_pins(tmp_path, version, ok):
    node = _fake(tmp_path, "node", version)
    run = _check("node", path=f"{node.parent}:/usr/bin:/bin")
    assert (run.returncode == 0) is ok, run.stderr
    if not ok:
        assert run.stderr == (
            f"error: node on PATH is {version}, not {PINNED_NODE}.x from package.json: run npm ci "
            "(node_modules/node/bin goes first on PATH), or make node_modules/.installed\n"
        )


@pytest.mark.parametrize("target", ["synth", "deploy", "deploy-new-units", "test"])
def test_make_checks_the_toolchain_before_it_builds_anything(target):
    # -o: the venv and node_modules count as up to date, so the dry run shows only the target's own steps.
    # CI runs the suite under `make test`: a make started from another make inherits MAKELEVEL and
    # MAKEFLAGS and prints "make[1]: Entering directory ..." (GNU make manual, "The '--print-directory'
    # Option": -w is turned on automatically for sub-makes), so the dry run starts from a clean slate.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS", "MAKEOVERRIDES")}
    dry = subprocess.run(
        ["make", "--no-print-directory", "-n", "-o", ".venv/.dev-deps", "-o", ".venv/.synth-deps"]
        + ["-o", "node_modules/.installed", target],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    lines = dry.stdout.splitlines()
    assert lines[:2] == ["tools/check_toolchain.sh venv .venv/bin/python", "tools/check_toolchain.sh node"], lines
