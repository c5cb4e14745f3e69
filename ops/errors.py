"""Errors an operator can cause or meet: printed as one line, never as a traceback."""

from __future__ import annotations


class OpsError(Exception):
    """A failure the CLI reports and exits on; exit_code 2 = bad input, 1 = refused/failed."""

    exit_code = 1


class UsageError(OpsError):
    exit_code = 2


class Refused(OpsError):
    """A destructive step the CLI will not take without confirmation."""

    exit_code = 1
