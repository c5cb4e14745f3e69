"""`python -m runtime <subcommand>`: one entry point for the container (node, router) and tools
(plan). Each subcommand lives in its own module and registers itself here."""

from __future__ import annotations

import argparse
import sys

from runtime import cli_artifacts, cli_node, cli_plan, cli_router

SUBCOMMANDS = [cli_plan, cli_node, cli_router, cli_artifacts]   # each adds one subcommand


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runtime", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for module in SUBCOMMANDS:
        module.add_parser(sub)
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
