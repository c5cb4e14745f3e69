"""`flotilla preflight`: before a deploy, check a deployment config against the real account, read-only:
one line per check with PASS, WARN or FAIL and the fix (the checks: ops/preflight.py). Exit status 1
when any check fails, so `make deploy` stops before CloudFormation starts.
"""

from __future__ import annotations

import argparse
import json

from rich.console import Console
from rich.markup import escape

from ops.aws import clients_for
from ops.commands import Subparsers
from ops.commands.common import add_json_option
from ops.deploy_config import read_config
from ops.errors import EXIT_FAILED, EXIT_OK, bad_arg
from ops.preflight import FAIL, PASS, WARN, Finding, Target, run_checks

STYLE = {PASS: "green", WARN: "yellow", FAIL: "red"}


def add_parser(sub: Subparsers) -> list[argparse.ArgumentParser]:
    p = sub.add_parser(
        "preflight",
        help="before a deploy: check a config against the account (quota, AZs, capacity, AMI, model, keys, ...)",
        description="Read-only checks of a deployment config against the account and region it is about to be "
        "deployed to: the instance type's vCPU quota, the type offered in each AZ, the named capacity "
        "reservation or Capacity Block, the pinned AMI, the model's manifest at model.s3_uri, the certificate, "
        "the API-key secret, the image, the CDK bootstrap stack. One line each with PASS, WARN or FAIL and the "
        "fix. Exit status 1 when any check fails. `make deploy` runs it first.",
    )
    p.add_argument(
        "--config",
        metavar="PATH",
        help="the deployment config YAML, read over ./cdk.json's `flotilla` context as `cdk synth -c config=PATH` "
        "reads it (default: cdk.json alone)",
    )
    add_json_option(p, "the findings")
    p.set_defaults(handler=run)
    return [p]


def render(findings: list[Finding], console: Console, *, config: str, target: Target) -> None:
    """One line per finding, and its fix under it: never wrapped, so a fix command copies whole."""
    console.print(f"preflight of {config} for account {target.account}, {target.region}:", highlight=False)
    width = max(len(f.check) for f in findings)
    for f in findings:
        console.print(
            f"[{STYLE[f.status]}]{f.status}[/] {f.check:<{width}}  {escape(f.saw)}", soft_wrap=True, highlight=False
        )
        if f.fix:
            console.print(f"     {'':<{width}}  fix: {escape(f.fix)}", soft_wrap=True, highlight=False)


def run(args: argparse.Namespace, console: Console) -> int:
    cfg = read_config(args.config)
    if cfg.region and args.region and args.region != cfg.region:
        raise bad_arg("--region", args.region, f"differs from the config's region {cfg.region}", "drop --region")
    args.region = args.region or cfg.region
    aws = clients_for(args)
    identity = aws.sts.get_caller_identity()
    target = Target(account=str(identity["Account"]), region=str(aws.sts.meta.region_name))
    findings = run_checks(cfg, aws, target)
    failed = [f.check for f in findings if f.status == FAIL]
    shown = args.config or "cdk.json"
    if args.json:
        doc = {
            "config": shown,
            "account": target.account,
            "region": target.region,
            "failed": failed,
            "checks": [f.as_dict() for f in findings],
        }
        console.print_json(json.dumps(doc))
    else:
        render(findings, console, config=shown, target=target)
        warned = sum(f.status == WARN for f in findings)
        if failed:
            console.print(f"[red]FAIL[/]: {', '.join(failed)}: fix these before deploying", highlight=False)
        else:
            console.print(f"PASS: every check ({warned} warning(s))", highlight=False)
    return EXIT_FAILED if failed else EXIT_OK
