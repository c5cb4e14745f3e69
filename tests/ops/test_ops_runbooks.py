"""The runbooks' commands exist: every `flotilla ...` line in docs/runbooks parses with the CLI's
own argparse, and every subcommand they use is run by a test against moto and real health servers."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from ops.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
RUNBOOKS = ROOT / "docs" / "runbooks"
MINE = [
    "scale-for-peak.md",
    "unit-not-ready.md",
    "node-replacement.md",
    "model-update.md",
    "rollback-units.md",
    "certificate-rotation.md",
    "incident-triage.md",
]
SHELL_BREAKS = {">", ">>", "<", "|", "&&", "||", ";", "2>&1"}


def flotilla_lines(path: Path) -> list[str]:
    """Command lines starting with `flotilla` inside the runbook's fenced code blocks."""
    lines, fenced = [], False
    for line in path.read_text().splitlines():
        if line.strip().startswith("```"):
            fenced = not fenced
            continue
        if fenced and line.strip().startswith("flotilla "):
            lines.append(line.strip())
    return lines


def argv_of(line: str) -> list[str]:
    words = shlex.split(line)
    for i, w in enumerate(words):
        if w in SHELL_BREAKS or w.startswith(">"):
            words = words[:i]
            break
    return words[1:]


def all_commands() -> list[tuple[str, str]]:
    return [(p.name, line) for p in sorted(RUNBOOKS.glob("*.md")) for line in flotilla_lines(p)]


def test_every_runbook_of_the_ops_issue_exists_and_uses_the_cli():
    for name in MINE:
        path = RUNBOOKS / name
        assert path.is_file(), f"missing runbook {name}"
    used = {name for name, _ in all_commands()}
    # certificate rotation touches only the front door, but still checks the fleet before and after
    assert set(MINE) <= used


@pytest.mark.parametrize("runbook, line", all_commands())
def test_runbook_command_parses_with_the_cli(runbook, line):
    parser = build_parser()
    try:
        args = parser.parse_args(argv_of(line))
    except SystemExit as exc:  # argparse reports the problem on stderr and exits 2
        pytest.fail(f"{runbook}: `{line}` does not parse (exit {exc.code})")
    assert callable(args.handler)


def test_every_subcommand_the_runbooks_use_is_run_by_a_cli_test():
    tests = "\n".join(
        p.read_text() for p in Path(__file__).parent.glob("test_ops_*.py") if p.name != Path(__file__).name
    )
    used = {
        tuple(argv_of(line)[:2]) if argv_of(line)[0] == "rollout" else (argv_of(line)[0],) for _, line in all_commands()
    }
    for cmd in sorted(used):
        call = "run_cli(" + ", ".join(f'"{w}"' for w in cmd)
        assert re.search(re.escape(call) + r"[,)]", tests), f"no test runs `flotilla {' '.join(cmd)}`"
