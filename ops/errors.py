"""Errors an operator can cause or meet: printed as one line, never as a traceback, and the exit
statuses every subcommand shares."""

from __future__ import annotations

from typing import Any

from contract.bad_input import NOT_GIVEN, bad_input_line

# Exit statuses. `status` uses all of them, by severity; the other subcommands 0, 1, 2 and 4.
EXIT_OK = 0  # all good (status: every unit ready, drained ones excepted)
EXIT_FAILED = 1  # refused / failed (status: degraded, ready units still at or above the threshold)
EXIT_USAGE = 2  # bad input (argparse exits 2 as well)
EXIT_CRITICAL = 3  # status: fewer ready units than the FleetReadyUnits alarm's threshold
EXIT_UNKNOWN = 4  # cannot tell: AWS refused or failed (credentials, permissions, throttling), or
#                   status could not read the units' health


class OpsError(Exception):
    """A failure the CLI reports and exits on; exit_code 2 = bad input, 1 = refused/failed."""

    exit_code = EXIT_FAILED


class UsageError(OpsError):
    exit_code = EXIT_USAGE


def arg_line(flag: str, value: Any, problem: str, fix: str) -> str:
    """A command-line argument's error in the one wording every flotilla input error uses
    (contract.bad_input): `--flag=value problem: fix`, a number shown as typed (2, not 2.0)."""
    shown = value if value is NOT_GIVEN or isinstance(value, str) else f"{value:g}"
    return bad_input_line(flag, shown, problem, fix, text=True)


def bad_arg(flag: str, value: Any, problem: str, fix: str) -> UsageError:
    """A command-line argument out of its range (arg_line's wording)."""
    return UsageError(arg_line(flag, value, problem, fix))


class Refused(OpsError):
    """A destructive step the CLI will not take without confirmation."""

    exit_code = EXIT_FAILED


class CannotTell(OpsError):
    """The command could not find out what it was asked (nothing found where it looked)."""

    exit_code = EXIT_UNKNOWN
