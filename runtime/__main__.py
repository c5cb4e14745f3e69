"""Command line of the flotilla runtime image: `python -m runtime <subcommand>`.

Each subcommand's flags and work live beside the code they drive; this module only dispatches.
"""

from __future__ import annotations

import argparse
import sys


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m runtime")
    sub = parser.add_subparsers(dest="command", required=True)

    plan = sub.add_parser("plan", help="print a unit's parallel plan for an engine")
    plan.add_argument("--engine", required=True, choices=["neuron"])
    plan.add_argument("--model", required=True, help="checkpoint directory holding config.json")
    plan.add_argument("--nodes", required=True, type=int, help="nodes in the unit")
    from runtime.engines.neuron.cli import add_neuron_plan_arguments
    add_neuron_plan_arguments(plan)

    from runtime.artifacts.cli import add_artifacts_parser
    add_artifacts_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    if args.command == "plan":
        from runtime.engines.neuron.cli import run_neuron_plan
        return run_neuron_plan(args)
    if args.command == "artifacts":
        from runtime.artifacts.cli import run_artifacts
        return run_artifacts(args)
    raise AssertionError(f"unhandled command {args.command}")


if __name__ == "__main__":
    sys.exit(main())
