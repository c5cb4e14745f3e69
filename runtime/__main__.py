"""`python -m runtime <subcommand>`: one entry point for the container (node, router) and tools
(plan). Each subcommand lives in its own module and registers itself here."""

from __future__ import annotations

import argparse
import sys

from runtime.artifacts import cli as artifacts_cli
from runtime.engines import cli as plan_cli
from runtime.node import cli as node_cli
from runtime.router import cli as router_cli

SUBCOMMANDS = [plan_cli, node_cli, router_cli, artifacts_cli]  # each adds one subcommand


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runtime", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for module in SUBCOMMANDS:
        module.add_parser(sub)
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
