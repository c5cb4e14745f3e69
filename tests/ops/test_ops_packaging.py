"""The CLI stays light (no torch, aws-cdk-lib or runtime/) and the console script points at it."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_importing_every_command_pulls_in_neither_torch_nor_cdk_nor_the_runtime():
    code = (
        "import sys, ops.cli; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'aws_cdk', 'runtime', 'stacks')); "
        "print(','.join(bad)); sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"ops imports {proc.stdout.strip()} {proc.stderr[-500:]}"


def test_the_console_script_is_flotilla_pointing_at_ops_cli_main():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["flotilla"] == "ops.cli:main"
    from ops.cli import main

    assert callable(main)


# The operator's commands, as the README and the runbooks name them.
COMMANDS = (
    "status",
    "topology",
    "drain-unit",
    "restore-unit",
    "replace-node",
    "rollout",
    "rollback",
    "plan",
    "rehearse",
)


def test_python_dash_m_ops_runs_the_cli():
    proc = subprocess.run([sys.executable, "-m", "ops", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.startswith("usage: flotilla"), proc.stderr[-500:]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_operator_command_is_a_subcommand_of_the_cli(command, capsys):
    # Asked of the real parser: a command missing from it is argparse's "invalid choice" (exit 2),
    # where the words alone could still stand in some other command's help text.
    from ops.cli import build_parser

    with pytest.raises(SystemExit) as done:
        build_parser().parse_args([command, "--help"])
    assert done.value.code == 0, capsys.readouterr().err
    assert capsys.readouterr().out.startswith(f"usage: flotilla {command}")
