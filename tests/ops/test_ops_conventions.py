"""What every `flotilla` command shares, asked of the real parser: a --version, --json on every command
that reports, a confirmation (--yes / --dry-run) on every command that changes something, and one flag
name per thing (old spellings kept hidden, with a warning, where runbooks used them)."""

from __future__ import annotations

import argparse
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from ops.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]

# Commands whose output is a report a script may read.
REPORTING = (
    ["status"],
    ["topology"],
    ["rollout", "status"],
    ["rollout", "plan", "--config", "x.yaml"],
    ["plan", "--rps", "1", "--prompt-tokens", "1", "--output-tokens", "1"],
    ["rehearse"],
    ["check-update"],
    ["smoke", "--url", "http://x"],
    ["shed", "show"],
    ["keys", "list"],
    ["keys", "create", "--name", "x"],
    ["preflight"],
    ["publish", "--source", "d", "--uri", "s3://b/p/"],
    ["node-boot", "check", "--config", "x.yaml"],
    ["node-boot", "stage", "--config", "x.yaml"],
)
# Commands that change something: each asks first, takes --yes, and --dry-run only says what it would do.
CHANGING = (
    ["drain-unit", "cell0-unit0"],
    ["drain-unit", "--all"],
    ["restore-unit", "cell0-unit0"],
    ["replace-node", "i-0123456789abcdef0"],
    ["rollback", "--all"],
    ["shed", "set", "--admit-percent", "0", "--reason", "x"],
    ["shed", "clear"],
    ["keys", "create", "--name", "x"],
    ["keys", "revoke", "0badc0de"],
    ["keys", "limit", "0badc0de", "--priority", "batch"],
    ["teardown"],
    ["shrink", "--units", "1"],
    ["smoke", "--url", "http://x", "--roll-unit", "cell0-unit0"],
    ["publish", "--source", "d", "--uri", "s3://b/p/"],
    ["node-boot", "stage", "--config", "x.yaml"],
)


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(subs[0].choices) if subs else {}


def _commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    """Every leaf command of the parser, as its words."""
    subs = _subparsers(parser)
    if not subs:
        return {prefix}
    return {c for name, p in subs.items() for c in _commands(p, (*prefix, name))}


def _leaf(argv: list[str]) -> tuple[str, ...]:
    """The command words at the start of argv."""
    parser, words = build_parser(), []
    for word in argv:
        subs = _subparsers(parser)
        if word not in subs:
            break
        parser, words = subs[word], [*words, word]
    return tuple(words)


def test_version_prints_the_release_pyproject_declares():
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    proc = subprocess.run(
        [sys.executable, "-m", "ops", "--version"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0 and proc.stdout == f"flotilla {version}\n"


def test_the_lists_below_name_every_command_the_cli_has():
    """A new command must say here whether it reports or changes something."""
    listed = {_leaf(argv) for argv in REPORTING + CHANGING}
    missing = _commands(build_parser()) - listed
    assert not missing, f"say whether these report or change something: {sorted(missing)}"


@pytest.mark.parametrize("argv", REPORTING, ids=lambda a: " ".join(a[:2]))
def test_every_command_that_reports_takes_json(argv):
    assert build_parser().parse_args([*argv, "--json"]).json is True


@pytest.mark.parametrize("argv", CHANGING, ids=lambda a: " ".join(a[:2]))
def test_every_command_that_changes_something_takes_yes_and_dry_run(argv):
    parser = build_parser()
    assert parser.parse_args([*argv, "--yes"]).yes is True
    assert parser.parse_args([*argv, "--dry-run"]).dry_run is True


@pytest.mark.parametrize(
    ("argv", "old", "new", "dest", "value"),
    [
        (["rollback", "--all"], "--wave-size", "--units-per-wave", "units_per_wave", 4),
        (
            ["plan", "--rps", "1", "--prompt-tokens", "1", "--output-tokens", "1"],
            "--batch",
            "--batch-size",
            "batch_size",
            8,
        ),
    ],
)
def test_an_old_flag_name_still_works_warns_and_is_hidden_from_help(argv, old, new, dest, value, capsys):
    parser = build_parser()
    assert getattr(parser.parse_args([*argv, new, str(value)]), dest) == value
    assert capsys.readouterr().err == ""
    assert getattr(parser.parse_args([*argv, old, str(value)]), dest) == value
    assert f"warning: {old} is deprecated: use {new}" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parser.parse_args([*argv[:1], "--help"])
    shown = capsys.readouterr().out
    assert new in shown and f"{old} " not in shown


@pytest.mark.parametrize("command", ["status", "topology", "rollout status", "rollback", "drain-unit", "restore-unit"])
def test_every_cell_flag_takes_the_cell_as_status_shows_it_or_its_number(command):
    words = command.split()
    for given in ("cell2", "2"):
        args = build_parser().parse_args([*words, "--cell", given])
        assert args.cell in ("cell2", ["cell2"])
