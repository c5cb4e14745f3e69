"""`flotilla rehearse`: roll the synthesized fleet to a new revision on this machine, under load, as
ECS and CloudFormation would, and report requests served and failed, units in rotation and time.

Needs a checkout with the runtime's requirements (it starts `python -m runtime node` and `router`
processes) and a synthesized cloud assembly (`make synth`); no AWS access.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from contract.declare import Integer, Number
from ops.commands import Subparsers
from ops.errors import OpsError, UsageError, check_arg


def add_parser(sub: Subparsers) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "rehearse",
        help="rehearse a unit rollout locally under ECS's rules (no AWS)",
        description="Create the units of a synthesized cloud assembly as local node processes "
        "behind the router, put them under load, then roll them to a new revision as the ECS "
        "service scheduler and CloudFormation would (health checks, grace period, minimum healthy / "
        "maximum percent, circuit breaker, stop timeout, DependsOn and stack order, all read from "
        "the templates). Exit status 0 when no request failed and the units in rotation never went "
        "below the floor; with --never-ready, when the circuit breaker also rolled the unit back.",
    )
    p.add_argument("--cdk-out", default="cdk.out", metavar="DIR", help="the cloud assembly; default %(default)s")
    p.add_argument(
        "--time-scale",
        type=float,
        default=0.01,
        metavar="S",
        help="real seconds per emulated second: 0.01 runs a 30 s health-check interval in 0.3 s; default %(default)s",
    )
    p.add_argument(
        "--load-seconds",
        type=float,
        default=1.0,
        metavar="S",
        help="real seconds each unit takes to load (the echo engine's stand-in for the model); default %(default)s",
    )
    p.add_argument(
        "--never-ready",
        action="store_true",
        help="the new revision never becomes ready: rehearse the circuit breaker and its rollback",
    )
    p.add_argument(
        "--answer-tokens",
        type=int,
        metavar="N",
        help="every client streams answers of N tokens (the echo engine takes FLOTILLA_ECHO_STEP_S, 0.01 s, "
        "per token), so drains have long answers in flight; default: 8-token answers, half streamed",
    )
    p.add_argument(
        "--no-handover",
        action="store_true",
        help="the router moves no stream (--max-moves 0): a draining leader waits for its answers, up to "
        "its drain timeout, instead of handing them over",
    )
    p.add_argument("--clients", type=int, default=4, help="concurrent clients through the router; default %(default)s")
    p.add_argument(
        "--concurrency",
        type=int,
        metavar="N",
        help="cdk deploy --concurrency (stacks at once); default: as many as the stack order allows",
    )
    p.add_argument("--revision", metavar="LABEL", help="the revision rolled to; default <template revision>-next")
    p.add_argument("--keep-logs", metavar="DIR", help="keep every process's log here (default: a temporary dir)")
    p.add_argument(
        "--waves",
        action="store_true",
        help="only print the rollout waves the templates define and the cdk deploy command that runs them",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(handler=run)
    return p


def _check(args: argparse.Namespace) -> None:
    check_arg("--time-scale", args.time_scale, Number(0, 1, "e.g. 0.01", above=True))
    check_arg("--load-seconds", args.load_seconds, Number(0, 600))
    check_arg("--clients", args.clients, Integer(1, 64))
    if args.answer_tokens is not None:
        # The echo engine's context is 2048 tokens, the prompt (about 25) included.
        check_arg("--answer-tokens", args.answer_tokens, Integer(1, 2000))
    if args.concurrency is not None:
        check_arg("--concurrency", args.concurrency, Integer(1))


def _describe(fleet: Any, scale: float, console: Console) -> None:
    t = Table(title=f"Read from {fleet.source} (emulated at time scale {scale:g}: real = emulated x {scale:g})")
    for col in (
        "unit",
        "tasks",
        "min/max %",
        "health check (interval/timeout/retries/start)",
        "grace",
        "stop timeout",
        "breaker",
        "after",
    ):
        t.add_column(col)
    for s in fleet.services:
        h = s.health
        t.add_row(
            s.unit_id,
            str(s.desired_count),
            f"{s.min_healthy_percent}/{s.max_percent}",
            f"GET {h.path}: {h.interval_s:g}/{h.timeout_s:g}/{h.retries}/{h.start_period_s:g} s "
            f"-> {h.interval_s * scale:.2f}/{max(h.timeout_s * scale, 0.2):.2f}/{h.retries}/"
            f"{h.start_period_s * scale:.2f} s",
            f"{s.grace_s:g} s -> {s.grace_s * scale:.2f} s",
            f"{s.stop_timeout_s:g} s -> {s.stop_timeout_s * scale:.2f} s",
            ("on" if s.circuit_breaker else "off") + (", rollback" if s.rollback else ""),
            ", ".join(d for d in s.depends_on) or "-",
        )
    console.print(t)


def print_waves(fleet: Any, console: Console) -> int:
    """The waves as CloudFormation and `cdk deploy` will run them, from the synthesized templates."""
    from ops.rehearsal.cloudformation import stacks_at_once, static_waves  # noqa: PLC0415 - see run()

    lanes = stacks_at_once(fleet)
    waves = static_waves(fleet, lanes)
    serial = static_waves(fleet, 1)
    console.print(
        f"{len(fleet.services)} units in {len(fleet.stacks)} cell stack(s): {len(waves)} sequential waves, "
        f"at most {max(len(w) for w in waves)} units at once, {lanes} cell stack(s) at once."
    )
    for i, wave in enumerate(waves):
        console.print(f"  wave {i + 1}: {', '.join(wave)}", markup=False)
    # One more than the cell lanes: the Front -> Observability -> Router chain may deploy alongside.
    console.print(
        f"deploy with: node_modules/.bin/cdk deploy --all --concurrency {lanes + 1}"
        + (f"   (with --concurrency 1: {len(serial)} sequential waves)" if len(serial) != len(waves) else ""),
        markup=False,
    )
    return 0


def render(report: Any, console: Console) -> None:
    console.print(
        f"waves (cdk deploy --concurrency {report.concurrency}): " + " | ".join(", ".join(w) for w in report.waves)
    )
    t = Table(title="Rehearsal", show_header=False)
    t.add_row(
        "rollout",
        f"{report.old_revision} -> {report.new_revision}: {'completed' if report.rolled_out else 'rolled back'}",
    )
    t.add_row("requests", f"{report.served} served, {len(report.failures)} failed")
    t.add_row("served by revision", ", ".join(f"{k}: {v}" for k, v in sorted(report.revisions_served.items())))
    t.add_row(
        "units in rotation",
        f"min {report.min_in_rotation} (floor {report.floor} of {report.units}); "
        f"{report.below_floor_s:.0f} emulated s below the floor",
    )
    t.add_row("over time", "  ".join(f"{at:.0f}s:{n}" for at, n in report.rotation))
    t.add_row(
        "time",
        f"rollout {report.rollout_s:.0f} emulated s ({report.rollout_s * report.scale:.1f} s real); "
        f"rehearsal {report.wall_s:.1f} s wall",
    )
    t.add_row(
        "answers",
        (f"{report.answer_tokens} tokens, all streamed" if report.answer_tokens else "8 tokens, half streamed")
        + "; drains "
        + ("hand streams over to the router" if report.handover else "wait for their answers (no hand-over)"),
    )
    if report.drains:
        t.add_row(
            "leader drains",
            f"SIGTERM to exit: median {report.drain_s(statistics.median):.1f}, max {report.drain_s(max):.1f} "
            f"emulated s (drain timeout {report.drain_timeout_s:g} s)",
        )
    for d in report.drains:
        t.add_row(
            f"  {d.unit}",
            f"{d.emulated_s:.1f} emulated s ({d.real_s:.2f} s real): {_count(d.in_flight)} in flight, "
            f"{d.handed_over} handed over, "
            + (f"{d.unfinished} unfinished at the drain timeout" if d.unfinished is not None else "killed first"),
        )
    t.add_row("circuit breaker trips", ", ".join(f"{u}: {n}" for u, n in report.breaker_trips.items()))
    t.add_row("revisions at the end", ", ".join(f"{u}: {r}" for u, r in report.final_revisions.items()))
    console.print(t)
    for f in report.failures[:10]:
        console.print(f"  failed at {f.at:.0f} s: {f.what}", markup=False)
    if report.log_dir:
        console.print(f"logs: {report.log_dir}")


def _count(n: int | None) -> str:
    return "?" if n is None else str(n)  # None: the node's log says nothing of it


def report_dict(report: Any) -> dict[str, Any]:
    out: dict[str, Any] = asdict(report)
    out["events"] = [f"{e.at:.1f}s {e.who}: {e.text}" for e in report.events]
    out["log_dir"] = str(report.log_dir) if report.log_dir else None
    out["ok"] = report.ok
    out["drain_median_s"] = report.drain_s(statistics.median)
    out["drain_max_s"] = report.drain_s(max)
    return out


def run(args: argparse.Namespace, console: Console) -> int:
    _check(args)
    # The rehearsal needs aiohttp and starts runtime processes: imported only for this command.
    from ops.rehearsal.run import Options, RehearsalError, rehearse  # noqa: PLC0415 - keeps other commands light
    from ops.rehearsal.template import TemplateError, read_fleet  # noqa: PLC0415 - same

    try:
        fleet = read_fleet(Path(args.cdk_out))
    except TemplateError as err:
        raise UsageError(str(err)) from None
    if args.waves:
        return print_waves(fleet, console)
    if not args.json:
        _describe(fleet, args.time_scale, console)
    options = Options(
        scale=args.time_scale,
        load_s=args.load_seconds,
        clients=args.clients,
        concurrency=args.concurrency,
        new_revision=args.revision,
        never_ready=args.never_ready,
        answer_tokens=args.answer_tokens,
        handover=not args.no_handover,
        work_dir=Path(args.keep_logs) if args.keep_logs else None,
    )

    def progress(e: Any) -> None:
        if not args.json:
            console.print(f"{e.at:8.1f}s  {e.who}: {e.text}", markup=False, highlight=False)

    try:
        report = asyncio.run(rehearse(fleet, options, log=progress))
    except RehearsalError as err:
        raise OpsError(str(err)) from None
    if args.json:
        console.print_json(json.dumps(report_dict(report), default=str))
    else:
        render(report, console)
    if args.never_ready:
        good = report.ok and not report.rolled_out and any(report.breaker_trips.values())
    else:
        good = report.ok and report.rolled_out
    return 0 if good else 1
