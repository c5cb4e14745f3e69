"""Errors an operator can cause or meet: printed as one line, never as a traceback, and the exit
statuses every subcommand shares."""

from __future__ import annotations

import argparse
from typing import Any

from contract.bad_input import NOT_GIVEN, BadInput, bad_input_line
from contract.declare import Rule, checked

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
    """A command-line argument the command cannot use (arg_line's wording)."""
    return UsageError(arg_line(flag, value, problem, fix))


def check_arg(flag: str, value: Any, rule: Rule) -> None:
    """Refuse a parsed argument that `rule` (contract.declare) does not take, in the rule's words:
    `--clients=0 is out of range: give an integer from 1 to 64`, as the settings word it."""
    try:
        checked(flag, value, rule)
    except BadInput as err:
        raise bad_arg(flag, value, err.problem, err.fix) from None


class FlagType:
    """An argparse type= that reads a flag's text by a contract.declare rule, as a node's flags are
    read, and refuses a bad one in the rule's words naming the flag. argparse then prints the usage
    line and `<prog>: error: <the refusal>` and exits 2."""

    def __init__(self, flag: str, rule: Rule, *, none: bool = False) -> None:
        self.flag, self.rule, self.none = flag, rule, none  # none: the word `none` gives None

    def __call__(self, text: str) -> Any:
        if self.none and text == "none":
            return None
        try:
            return checked(self.flag, text, self.rule, text=True)
        except BadInput as err:
            # Raised as an ArgumentError of no argument, so that argparse shows the refusal as it is:
            # it wraps only an ArgumentTypeError in "argument <flag>: ..." (CPython 3.11
            # Lib/argparse.py:2532, _get_value), passes an ArgumentError on to parse_known_args, which
            # calls error(str(err)) (:1903), and ArgumentError(None, message) is the message alone (:773).
            raise argparse.ArgumentError(None, arg_line(self.flag, text, err.problem, err.fix)) from None


class Refused(OpsError):
    """A destructive step the CLI will not take without confirmation."""

    exit_code = EXIT_FAILED


class CannotTell(OpsError):
    """The command could not find out what it was asked (nothing found where it looked)."""

    exit_code = EXIT_UNKNOWN
