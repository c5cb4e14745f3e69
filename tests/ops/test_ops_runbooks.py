"""The runbooks an operator needs exist, are listed in the index and use the CLI. That every command
line in them (and in README.md and the rest of docs/) exists with the flags it gives is
tests/docs/test_docs_commands.py; what each subcommand does is tested in its own file
(test_ops_status.py, test_ops_rollback.py, ...), against moto and real health servers."""

from __future__ import annotations

from pathlib import Path

import doccheck

ROOT = Path(__file__).resolve().parents[2]
RUNBOOKS = ROOT / "docs" / "runbooks"
FLEET_RUNBOOKS = [
    "scale-for-peak.md",
    "unit-not-ready.md",
    "node-replacement.md",
    "model-update.md",
    "rollback-units.md",
    "certificate-rotation.md",
    "incident-triage.md",
]


def runbook_commands(tool: str) -> list[tuple[str, tuple[str, ...]]]:
    """(runbook, argv) of each `tool` line in the runbooks' code blocks."""
    return [
        (c.span.path.name, c.argv)
        for c in doccheck.all_commands()
        if c.tool == tool and c.span.fenced and c.span.path.parent == RUNBOOKS
    ]


def test_every_fleet_operation_runbook_exists_and_uses_the_cli():
    for name in FLEET_RUNBOOKS:
        path = RUNBOOKS / name
        assert path.is_file(), f"missing runbook {name}"
    used = {name for name, _ in runbook_commands("flotilla")}
    # certificate rotation touches only the front door, but still checks the fleet before and after
    assert set(FLEET_RUNBOOKS) <= used


INCIDENT_RUNBOOKS = [
    "capacity-shortage.md",
    "stuck-ecs-deployment.md",
    "stuck-cell-stack.md",
    "update-rollback-failed.md",
    "emergency-stop.md",
    "teardown.md",
]


def test_every_runbook_is_in_the_index_and_the_incident_runbooks_exist():
    index = (RUNBOOKS / "README.md").read_text()
    for name in INCIDENT_RUNBOOKS:
        assert (RUNBOOKS / name).is_file(), f"missing runbook {name}"
    for path in sorted(RUNBOOKS.glob("*.md")):
        if path.name != "README.md":
            assert f"]({path.name})" in index, f"docs/runbooks/README.md does not list {path.name}"


def test_the_update_rollback_failed_runbook_skips_resources_and_checks_afterwards():
    lines = [list(argv) for name, argv in runbook_commands("aws") if name == "update-rollback-failed.md"]
    commands = [tuple(a[:2]) for a in lines]
    skip = next(
        a for a in lines if a[:2] == ["cloudformation", "continue-update-rollback"] and "--resources-to-skip" in a
    )
    after = commands[lines.index(skip) + 1 :]
    assert ("cloudformation", "detect-stack-drift") in after and (
        "cloudformation",
        "describe-stack-resource-drifts",
    ) in after
