"""`make local` with `--scaler`: its flags, the router's file-based discovery, and the scaler that
then starts and drains whole local units (runtime/scaler/local.py) in the launcher's loop."""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from contract.scaling import ScalingPolicy
from runtime.scaler.local import LocalScaler, summary
from runtime.scaler.local_units import LocalUnits, Member

UNITS_FILE = "units.txt"  # in --state-dir: the leaders the router routes to, rewritten as units come and go
DECISIONS_FILE = "scaler.jsonl"
UNIT_EVENTS_FILE = "units.jsonl"  # units started, ready, draining, stopped, given back: one JSON line each
SUMMARY_FILE = "scaler-summary.json"
DISCOVERY_INTERVAL_S = 0.5  # the router re-reads the units file this often


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("scaler (whole units started and drained as load moves; docs/scaling.md)")
    g.add_argument("--scaler", action="store_true", help="run the scaler: --units is then its floor")
    g.add_argument("--max-units", type=int, default=None, help="the scaler's ceiling (default: 3 x --units)")
    g.add_argument(
        "--cold-start",
        type=float,
        default=None,
        help="seconds a unit takes to serve, for the scaler's rules (default: what the first units took)",
    )
    g.add_argument("--scaler-interval", type=float, default=5.0, help="seconds between the scaler's passes")


def check_arguments(p: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    if not a.scaler:
        return
    if not a.use_router:
        p.error("--scaler drains units through the router's hand-over: drop --router off")
    a.max_units = a.max_units if a.max_units is not None else 3 * a.units
    if a.max_units < a.units:
        p.error(f"--max-units={a.max_units} is below --units={a.units}: the ceiling must be at least the floor")
    if a.cold_start is not None and a.cold_start <= 0:
        p.error(f"--cold-start={a.cold_start} is out of range: give seconds above 0")
    if a.scaler_interval <= 0:
        p.error(f"--scaler-interval={a.scaler_interval} is out of range: give seconds above 0")


def router_discovery(a: argparse.Namespace, leaders: Sequence[str]) -> dict[str, Any]:
    """The router's settings for a fleet that changes: its units from a file it re-reads."""
    path = Path(a.state_dir) / UNITS_FILE
    path.write_text("".join(f"{url}\n" for url in leaders))
    return {"units_file": str(path), "discovery_interval_s": DISCOVERY_INTERVAL_S}


def start(
    a: argparse.Namespace,
    procs: list[Any],
    router_url: str,
    manifest: Path,
    plan: Callable[[str, set[int]], Sequence[Member]],
) -> LocalScaler:
    """The scaler over the units make local started (already ready), from now on."""
    now = time.monotonic()
    state = Path(a.state_dir)
    first = min((p.extra.get("started", now) for p in procs), default=now)
    taken = {a.port, *(port for p in procs for port in p.ports.values())}

    units = LocalUnits(
        plan=lambda unit_id: plan(unit_id, taken),
        units_file=state / UNITS_FILE,
        drain_timeout_s=a.drain_timeout,
        on_change=lambda: write_manifest(manifest, procs, units),
        events_path=state / UNIT_EVENTS_FILE,
    )
    for unit_id in sorted({p.unit for p in procs if p.unit}):
        units.adopt(unit_id, [p for p in procs if p.unit == unit_id], started=first)
    units.poll(now)
    cold_start = a.cold_start or max(1.0, now - first)
    policy = ScalingPolicy(floor=a.units, ceiling=a.max_units, cold_start_s=round(cold_start, 1))
    print(
        f"scaler: {a.units} to {a.max_units} unit(s), a pass every {a.scaler_interval:g} s, cold start "
        f"{policy.cold_start_s:g} s ({'stated' if a.cold_start else 'as the first units took'}), hold "
        f"{policy.hold:g} s; decisions in {state / DECISIONS_FILE}",
        flush=True,
    )
    return LocalScaler(units, policy, router_url, interval_s=a.scaler_interval, log_path=state / DECISIONS_FILE)


def write_manifest(manifest: Path, procs: list[Any], units: LocalUnits) -> None:
    """local.json lists every process, the scaler's units' too (tests stop them by it)."""
    try:
        doc = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return
    listed = [p for p in procs if not p.unit] + units.members()
    doc["processes"] = [p.describe() for p in listed]
    # Written aside and renamed over it: readers (tests, `make local`'s stop) poll this file while
    # units come and go, and a write in place lets them read it half-written. os.replace is atomic
    # on POSIX (Python docs, os.replace: "the renaming will be an atomic operation").
    part = manifest.with_name(manifest.name + ".part")
    part.write_text(json.dumps(doc, indent=2) + "\n")
    os.replace(part, manifest)


def finish(scaler: LocalScaler) -> list[Member]:
    """At make local's stop, before anything stops: write what the run paid (scaler-summary.json:
    unit-seconds, units added and removed; stopping is not the scaler's doing), and hand back every
    member the scaler holds, for make local's own stop (router first, then leaders, then followers)."""
    if scaler.log_path is not None:
        (scaler.log_path.parent / SUMMARY_FILE).write_text(json.dumps(summary(scaler)) + "\n")
    return [m for m in scaler.units.members() if m.alive()]
