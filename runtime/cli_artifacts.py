"""`python -m runtime artifacts {publish,fetch,manifest}`: model artifacts on S3 (runtime.artifacts)."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    from runtime.artifacts.cli import add_artifacts_parser, run_artifacts
    parser = add_artifacts_parser(sub)
    parser.set_defaults(func=run_artifacts)
