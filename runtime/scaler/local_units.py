"""Whole local units of node processes, started and drained the way ECS does it for a unit's
service: every member starts together and the unit serves once its leader is ready; a unit whose
members do not all come up is given back whole (all members stopped) and reported; a unit leaving
gets SIGTERM on every member at once (ECS stops every task of a service set to 0), so its leader
hands its streams over to other units through the router before it exits (docs/node.md, "the stream
moves"), and only then leaves the router's units file.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import contract
from runtime.scaler.signals import UnitLoad

PENDING, ACTIVE, DRAINING, STOPPED, GIVEN_BACK = "pending", "active", "draining", "stopped", "given back"


class Member(Protocol):
    """One process of a unit (runtime/local.py Proc)."""

    role: str
    ports: dict[str, int]
    log: Path

    def start(self) -> None: ...
    def alive(self) -> bool: ...
    def describe(self) -> dict[str, Any]: ...

    @property
    def process(self) -> subprocess.Popen: ...


def ready_body(url: str, timeout: float = 2.0) -> tuple[int, dict[str, Any]]:
    """(status, body) of GET url; (0, {}) when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - http://127.0.0.1 URLs we build
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        try:
            return e.code, json.loads(e.read() or b"{}")
        except ValueError:
            return e.code, {}
    except (OSError, ValueError):
        return 0, {}


@dataclass
class LocalUnit:
    unit_id: str
    members: list[Member]
    started: float
    state: str = PENDING
    ready_at: float | None = None
    ended: float | None = None  # when its last member exited (or it was given back)
    why: str = ""
    signalled: float | None = None  # when its drain began

    @property
    def leader_url(self) -> str:
        return f"http://127.0.0.1:{self.members[0].ports['api']}"


@dataclass
class LocalUnits:
    plan: Callable[[str], Sequence[Member]]  # unit id -> its members, not started
    units_file: Path  # the router's static discovery file: one leader URL a line
    start_timeout_s: float = 300.0
    drain_timeout_s: float = 30.0
    on_change: Callable[[], None] | None = None  # called once members started or stopped
    events_path: Path | None = None  # each event also appended here as a JSON line, as it happens
    units: dict[str, LocalUnit] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    _next: int = 0

    # --- changes ---------------------------------------------------------------------------------
    def adopt(self, unit_id: str, members: Sequence[Member], started: float) -> LocalUnit:
        """A unit started elsewhere (make local's first units): tracked from now on."""
        unit = LocalUnit(unit_id, list(members), started)
        self.units[unit_id] = unit
        self._next = max(self._next, len(self.units))
        self.write_units_file()
        return unit

    def start(self, now: float | None = None) -> LocalUnit:
        unit_id = f"local-unit{self._next}"
        self._next += 1
        members = list(self.plan(unit_id))
        unit = LocalUnit(unit_id, members, time.monotonic() if now is None else now)
        self.units[unit_id] = unit
        for m in members:
            m.start()
        self.write_units_file()
        self._event("unit_started", unit)
        return unit

    def drain(self, unit_id: str, now: float | None = None) -> None:
        unit = self.units[unit_id]
        if unit.state not in (ACTIVE, PENDING):
            return
        unit.state = DRAINING
        unit.signalled = time.monotonic() if now is None else now
        for m in unit.members:
            if m.alive():
                m.process.send_signal(signal.SIGTERM)
        self._event("unit_draining", unit)

    def poll(self, now: float | None = None) -> None:
        """Move units along: pending -> active once the leader is ready; pending -> given back if a
        member exits or the start takes too long; draining -> stopped once every member exited."""
        now = time.monotonic() if now is None else now
        for unit in list(self.units.values()):
            if unit.state == PENDING:
                self._poll_pending(unit, now)
            elif unit.state == DRAINING:
                self._poll_draining(unit, now)

    def _poll_pending(self, unit: LocalUnit, now: float) -> None:
        dead = [m for m in unit.members if not m.alive()]
        if dead:
            self._give_back(unit, now, f"{dead[0].role} exited with {dead[0].process.returncode} while starting")
        elif ready_body(unit.leader_url + contract.NODE_READY_PATH)[0] == 200:
            unit.state, unit.ready_at = ACTIVE, now
            self._event("unit_ready", unit, start_s=round(now - unit.started, 1))
        elif now - unit.started > self.start_timeout_s:
            self._give_back(unit, now, f"not ready {self.start_timeout_s:.0f} s after it started")

    def _poll_draining(self, unit: LocalUnit, now: float) -> None:
        if any(m.alive() for m in unit.members):
            if unit.signalled is not None and now - unit.signalled > self.drain_timeout_s + 15:
                for m in unit.members:
                    if m.alive():
                        m.process.kill()
                self._event("unit_killed", unit, after_s=round(now - unit.signalled, 1))
            return
        unit.state, unit.ended = STOPPED, now
        self.write_units_file()
        self._event("unit_stopped", unit, drain_s=round(now - (unit.signalled or now), 1))

    def _give_back(self, unit: LocalUnit, now: float, why: str) -> None:
        """A unit starts all its members or none: stop the rest, report it, never leave it half up."""
        for m in unit.members:
            if m.alive():
                m.process.kill()
                m.process.wait(timeout=10)
        unit.state, unit.ended, unit.why = GIVEN_BACK, now, why
        self.write_units_file()
        self._event("unit_given_back", unit, why=why)

    # --- views -----------------------------------------------------------------------------------
    def in_state(self, state: str) -> list[LocalUnit]:
        return [u for u in self.units.values() if u.state == state]

    def given_back_since(self, since: float) -> int:
        return sum(1 for u in self.units.values() if u.state == GIVEN_BACK and (u.ended or 0) >= since)

    def loads(self) -> tuple[UnitLoad, ...]:
        """Each active unit's load as its leader reports it (a unit that does not answer is skipped:
        the router does not route to it either)."""
        out = []
        for unit in self.in_state(ACTIVE):
            status, body = ready_body(unit.leader_url + contract.NODE_READY_PATH)
            if status == 200:
                out.append(UnitLoad.from_report(unit.unit_id, body.get("load") or {}))
        return tuple(out)

    def members(self) -> list[Member]:
        return [m for u in self.units.values() for m in u.members]

    def unit_seconds(self, now: float | None = None) -> float:
        """Seconds paid for units: each from its start until its last member exited (or now)."""
        now = time.monotonic() if now is None else now
        return sum((u.ended if u.ended is not None else now) - u.started for u in self.units.values())

    def write_units_file(self) -> None:
        """Every unit that has processes: the router finds new leaders here and keeps watching a
        draining one until it exits (its watch says draining, so nothing new goes there)."""
        live = [u.leader_url for u in self.units.values() if u.state in (PENDING, ACTIVE, DRAINING)]
        tmp = self.units_file.with_suffix(".tmp")
        tmp.write_text("".join(f"{url}\n" for url in live))
        tmp.replace(self.units_file)  # the router never reads half a file

    def _event(self, event: str, unit: LocalUnit, **fields: Any) -> None:
        record = {"ts": round(time.time(), 3), "event": event, "unit": unit.unit_id, **fields}
        self.events.append(record)
        if self.events_path is not None:
            with self.events_path.open("a") as f:
                f.write(json.dumps(record) + "\n")
        if self.on_change is not None and event in ("unit_started", "unit_stopped", "unit_given_back"):
            self.on_change()
