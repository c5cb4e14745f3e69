"""The `flotilla` console script: one subcommand per question an operator asks at peak.

Exit status: 0 all good, 1 failed / refused (status: degraded), 2 bad input (argparse uses 2 as
well), 3 status: below the FleetReadyUnits threshold, 4 cannot tell (AWS refused or failed:
credentials, permissions, throttling; status: health unreadable). Destructive subcommands are dry
runs unless --yes is given or a TTY user confirms.
"""

from __future__ import annotations

import argparse
import sys

import botocore.exceptions
from rich.console import Console

from ops import __doc__ as _package_doc
from ops.commands import (
    check_update,
    drain,
    keys,
    node_boot,
    plan,
    preflight,
    publish,
    rehearse,
    replace,
    rollback,
    rollout,
    shed,
    smoke,
    status,
    teardown,
    topology,
)
from ops.commands.common import stderr_console
from ops.errors import EXIT_OK, EXIT_UNKNOWN, OpsError
from ops.fleet import UNITS_CLOUDMAP_SERVICE
from ops.version import version


def _add_account_options(p: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    g = p.add_argument_group("AWS")
    g.add_argument("--region", help="AWS region (default: the AWS_REGION / profile setting)")
    g.add_argument("--profile", help="AWS named profile")
    return g


def _add_aws_options(p: argparse.ArgumentParser) -> None:
    g = _add_account_options(p)
    g.add_argument(
        "--deployment",
        default="flotilla",
        help="deployment_name of the flotilla config (stacks are <deployment>-Cell-<n>); default: %(default)s",
    )
    g.add_argument(
        "--cloudmap-namespace",
        help="Cloud Map namespace of the units' service (needed only when several namespaces have one)",
    )
    g.add_argument(
        "--cloudmap-service",
        default=UNITS_CLOUDMAP_SERVICE,
        help="Cloud Map service(s) the unit members register in: a name or a pattern; default: %(default)s "
        "(units-cell<n>, one per cell)",
    )
    g.add_argument(
        "--health-timeout",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="per-node /health/ready timeout; default %(default)s",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flotilla", description=_package_doc.strip().splitlines()[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    plan.add_parser(sub)
    rehearse.add_parser(sub)
    check_update.add_parser(sub)
    for module in (publish, preflight, node_boot):
        for p in module.add_parser(sub):
            _add_account_options(p)
    for module in (smoke, status, topology, drain, replace, rollout, rollback, shed, keys, teardown):
        for p in module.add_parser(sub):
            _add_aws_options(p)
    return parser


def make_console() -> Console:
    # Pipes and CI logs get wide, uncoloured tables rather than 80 wrapped columns.
    return Console(width=None if sys.stdout.isatty() else 160, highlight=False)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    console = make_console()
    # A command whose stdout is data for a script (--json, a key, a digest) reports errors on stderr,
    # so that `X=$(flotilla ...)` never captures an error line as the data.
    errors = stderr_console() if getattr(args, "json", False) or getattr(args, "data_on_stdout", False) else console
    try:
        return int(args.handler(args, console) or EXIT_OK)
    except OpsError as err:
        errors.print(f"[bold red]error:[/] {err}", markup=True, highlight=False)
        return err.exit_code
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as err:
        # Credentials, permissions, throttling: the operator needs the AWS message, not a traceback,
        # and a script must tell "AWS would not answer" from "the fleet is unhealthy".
        errors.print(f"[bold red]error:[/] AWS: {err}", markup=True, highlight=False)
        return EXIT_UNKNOWN
    except KeyboardInterrupt:
        errors.print("interrupted")
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
