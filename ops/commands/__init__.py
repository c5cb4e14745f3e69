"""One module per `flotilla` subcommand: add_parser(subparsers) and a handler(args, console)."""

from __future__ import annotations

import argparse
from typing import TypeAlias

# What ArgumentParser.add_subparsers() returns, the argument of every add_parser. A string: the
# class is generic only in typeshed, not at run time.
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
