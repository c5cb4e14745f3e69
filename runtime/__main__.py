"""`python -m runtime <command>`: the image's entry point. Commands: node (a unit member)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    commands = {"node": "runtime.cli_node"}
    if not args or args[0] not in commands:
        print(f"usage: python -m runtime {{{','.join(commands)}}} [options]", file=sys.stderr)
        return 2
    import importlib
    return importlib.import_module(commands[args[0]]).main(args[1:])


if __name__ == "__main__":
    sys.exit(main())
