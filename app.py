#!/usr/bin/env python3
"""CDK entry point: read the flotilla configuration once, build the stacks. Nothing else.

Configuration: cdk.json context `flotilla`, overridden by `cdk synth -c config=path/to/file.yaml`.
"""

import sys

import aws_cdk as cdk

from stacks.config import ConfigError, load_config
from stacks.deployment import build_deployment


def main() -> int:
    # CloudFormation validation is covered by cfn-lint in `make test`; the built-in validator
    # costs ~4 s of CPU and ~470 MB on every synth (docs/benchmarks.md, Synth).
    app = cdk.App(builtin_cloud_formation_validation=False)
    try:
        config = load_config(app.node.try_get_context("flotilla"), app.node.try_get_context("config"))
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    build_deployment(app, config)
    app.synth()
    return 0


if __name__ == "__main__":
    sys.exit(main())
