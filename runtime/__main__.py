"""`python -m runtime <command>`: the container's entry point; the command picks the role."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runtime")
    sub = parser.add_subparsers(dest="command", required=True)
    from runtime import cli_router

    cli_router.add_parser(sub)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
