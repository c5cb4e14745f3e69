"""`python -m runtime <subcommand>`: one entry point for the container (node, router) and tools
(plan). Each subcommand lives in its own module and registers itself here."""

from __future__ import annotations

import argparse
import importlib
import sys
from types import ModuleType

# Subcommand -> the module whose add_parser adds it. A process imports only its own subcommand's
# module: a node does not load the router's modules, nor a router the node's (50-80 ms of every
# start, paid by each of a fleet's nodes and routers). Help and unknown names load them all.
# tests/node/test_node_entrypoint.py checks each module adds the subcommand it is listed under.
SUBCOMMANDS = {
    "plan": "runtime.engines.cli",
    "node": "runtime.node.cli",
    "router": "runtime.router.cli",
    "artifacts": "runtime.artifacts.cli",
}


def modules(argv: list[str]) -> list[ModuleType]:
    """The subcommand modules `argv` needs: the one it names first, or every one."""
    names = [SUBCOMMANDS[argv[0]]] if argv and argv[0] in SUBCOMMANDS else list(SUBCOMMANDS.values())
    return [importlib.import_module(name) for name in names]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m runtime", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for module in modules(argv):
        module.add_parser(sub)
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
