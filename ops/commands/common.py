"""What several subcommands share: discovering the fleet from their arguments, and asking for
confirmation before a destructive step."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Collection
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from ops.aws import Aws, clients_for
from ops.errors import OpsError, Refused
from ops.fleet import Fleet, Unit, discover


def fleet_from_args(
    args: argparse.Namespace, aws: Aws | None = None, *, health: bool = True, clusters: Collection[str] | None = None
) -> Fleet:
    return discover(
        aws or clients_for(args),
        deployment=args.deployment,
        cloudmap_namespace=args.cloudmap_namespace,
        cloudmap_service=args.cloudmap_service,
        health=health,
        health_timeout_s=args.health_timeout,
        clusters=clusters,
    )


def select(fleet: Fleet, *, cell: str | None, unit: str | None = None) -> list[Unit]:
    """The fleet's units, only `unit` (OpsError when the fleet has no such unit) and only those in `cell`."""
    units = fleet.units
    if unit:
        units = [fleet.unit(unit)]
    if cell:
        units = [u for u in units if u.cell_id == cell]
    return units


def cell_id(text: str) -> str:
    """An argparse type for a cell: `cell3` as status shows it, or just `3`; always `cell3`."""
    value = text.strip()
    if value.isdigit():
        return f"cell{int(value)}"
    if value.startswith("cell") and value[4:].isdigit():
        return f"cell{int(value[4:])}"
    raise argparse.ArgumentTypeError(f"{text!r} is not a cell: give it as status shows it (cell0) or its number (0)")


class _DeprecatedAlias(argparse.Action):
    """An old spelling of an option, kept for scripts and runbooks that use it: hidden from --help, it
    sets the new option's value and says on stderr which name to use."""

    def __init__(self, option_strings: list[str], dest: str, *, new: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.new = new

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        print(f"warning: {option_string} is deprecated: use {self.new}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_deprecated_alias(
    p: argparse.ArgumentParser | argparse._ArgumentGroup, old: str, new: str, *, dest: str, **kwargs: Any
) -> None:
    p.add_argument(old, dest=dest, action=_DeprecatedAlias, new=new, help=argparse.SUPPRESS, **kwargs)


def add_json_option(p: argparse.ArgumentParser, what: str = "the report") -> None:
    p.add_argument("--json", action="store_true", help=f"print {what} as JSON on stdout (everything else on stderr)")


def stderr_console() -> Console:
    """A console on stderr, sized like the CLI's own: for what a script reading stdout must not get."""
    return Console(stderr=True, width=None if sys.stderr.isatty() else 160, highlight=False)


def prose_console(args: argparse.Namespace, console: Console) -> Console:
    """Where a command's prose goes: stderr under --json (stdout carries one JSON document), else stdout."""
    return stderr_console() if getattr(args, "json", False) else console


def add_confirm_options(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--dry-run",
        action="store_true",
        help="only say what would happen (the default without --yes when nobody is at a terminal to confirm)",
    )
    g.add_argument("--yes", "-y", action="store_true", help="do it without asking")


def confirmed(args: argparse.Namespace, console: Console, question: str) -> bool:
    """True to go ahead; False for --dry-run. --yes goes ahead; at a terminal the user is asked; without a
    terminal (CI, a pipe) the step is refused (Refused, exit status 1)."""
    if args.dry_run:
        console.print("dry run: nothing changed (drop --dry-run and confirm, or pass --yes, to do it)")
        return False
    if args.yes:
        return True
    if not sys.stdin.isatty():
        raise Refused(
            f"refusing to {question} without confirmation: stdin is not a terminal; "
            "review the dry run above and re-run with --yes"
        )
    answer = console.input(f"{question}? [y/N] ").strip().lower()
    if answer not in ("y", "yes"):
        raise Refused("not confirmed: nothing changed")
    return True


# The pause between a wait's checks. Tests that play ECS by hand replace this name to poll without
# sleeping: replacing time.sleep instead would take sleep away from every other thread of the process,
# whose waiting loops then spin against the one under test.
pause = time.sleep


def wait_until(
    check: Callable[[], tuple[bool, str]], *, timeout_s: float, description: str, console: Console, poll_s: float = 5.0
) -> str:
    """Call check() -> (done, status) until done, with a progress bar over the time budget.
    Returns the last status; raises OpsError when the budget runs out."""
    start = time.monotonic()
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        task = progress.add_task(description, total=timeout_s, status="")
        while True:
            done, status = check()
            elapsed = time.monotonic() - start
            progress.update(task, completed=min(elapsed, timeout_s), status=status)
            if done:
                progress.update(task, completed=timeout_s)
                return status
            if elapsed >= timeout_s:
                raise OpsError(f"{description}: not done after {timeout_s:.0f}s ({status})")
            pause(min(poll_s, max(0.0, timeout_s - elapsed)))
