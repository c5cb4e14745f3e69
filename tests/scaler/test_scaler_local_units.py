"""The local actuator's promise, on real (trivial) processes: a unit starts all its members or none.
A unit with a member that exits while starting, or that is not ready in time, is given back whole
(every member stopped), reported, and never listed for the router."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from runtime import local
from runtime.scaler.local_units import GIVEN_BACK, PENDING, LocalUnits


class Process:
    """A member that runs `code` in a Python process (no HTTP: its unit never turns ready)."""

    def __init__(self, role: str, code: str, log: Path) -> None:
        self.role, self.code, self.log = role, code, log
        self.ports = {"api": 9}  # the discard port: nothing answers, so the unit never turns ready
        self.popen: subprocess.Popen | None = None

    def start(self) -> None:
        self.popen = subprocess.Popen([sys.executable, "-c", self.code])

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    @property
    def process(self) -> subprocess.Popen:
        assert self.popen is not None
        return self.popen

    def describe(self) -> dict[str, Any]:
        return {"role": self.role, "pid": self.popen.pid if self.popen else None}


SLEEPER = "import time; time.sleep(120)"


def poll_until(units: LocalUnits, unit_id: str, state: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while units.units[unit_id].state != state:
        assert time.monotonic() < deadline, f"{unit_id} still {units.units[unit_id].state}: {units.events}"
        units.poll()
        time.sleep(0.05)


def test_a_unit_whose_member_exits_while_starting_is_given_back_whole_and_reported(tmp_path):
    units = LocalUnits(
        plan=lambda unit_id: [
            Process("leader", SLEEPER, tmp_path / "l.log"),
            Process("follower", "raise SystemExit(3)", tmp_path / "f.log"),
        ],
        units_file=tmp_path / "units.txt",
    )
    unit = units.start()
    try:
        assert unit.state == PENDING
        assert units.units_file.read_text().split() == [unit.leader_url]
        poll_until(units, unit.unit_id, GIVEN_BACK)
        assert not any(m.alive() for m in unit.members), "the member that started was left running"
        assert units.units_file.read_text() == ""
        event = units.events[-1]
        assert event["event"] == "unit_given_back" and "exited with 3" in event["why"]
        assert units.given_back_since(0) == 1
    finally:
        local.stop_all(units.members(), 5)


def test_a_unit_not_ready_within_its_start_timeout_is_given_back(tmp_path):
    units = LocalUnits(
        plan=lambda unit_id: [Process("leader", SLEEPER, tmp_path / "l.log")],
        units_file=tmp_path / "units.txt",
        start_timeout_s=0.5,
    )
    unit = units.start()
    try:
        poll_until(units, unit.unit_id, GIVEN_BACK)
        assert "not ready" in unit.why and not unit.members[0].alive()
    finally:
        local.stop_all(units.members(), 5)


def test_each_unit_event_is_written_to_the_events_file_as_it_happens(tmp_path):
    events = tmp_path / "units.jsonl"
    units = LocalUnits(
        plan=lambda unit_id: [Process("leader", "raise SystemExit(3)", tmp_path / "l.log")],
        units_file=tmp_path / "units.txt",
        events_path=events,
    )
    unit = units.start()
    try:
        assert [json.loads(line)["event"] for line in events.read_text().splitlines()] == ["unit_started"]
        poll_until(units, unit.unit_id, GIVEN_BACK)
        written = [json.loads(line) for line in events.read_text().splitlines()]
        assert written == units.events  # the file says what the run did, even if the launcher dies after
    finally:
        local.stop_all(units.members(), 5)
