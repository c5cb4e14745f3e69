"""`flotilla node-boot stage | check`: what a unit's nodes need from the account to boot without the
internet. `stage` puts the artifacts their user data installs into the model bucket (downloaded from
AWS, or taken from --from, and refused unless their SHA-256 is the pinned one); `check` says whether
those artifacts and the AMI the nodes boot are in place in the region. Run both before the first
deploy and after a change of the pins (docs/runbooks/node-boot-artifacts.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ops.aws import Aws, clients_for
from ops.commands import Subparsers
from ops.commands.common import add_confirm_options, add_json_option, confirmed, prose_console
from ops.deploy_config import read_config
from ops.errors import EXIT_FAILED, EXIT_OK, bad_arg
from ops.node_boot import BootCheck, ami_checks, artifact_checks, needed_artifacts, stage_artifacts


def add_parser(sub: Subparsers) -> list[argparse.ArgumentParser]:
    p = sub.add_parser(
        "node-boot",
        help="the artifacts and AMI unit nodes boot from: `node-boot stage`, `node-boot check`",
        description="Unit nodes install their boot artifacts from the model bucket through the VPC's S3 "
        "gateway endpoint, never from the internet, and refuse any whose SHA-256 is not the pinned one.",
    )
    psub = p.add_subparsers(dest="node_boot_command", required=True, metavar="SUBCOMMAND")
    stage = psub.add_parser(
        "stage",
        help="upload the boot artifacts a config's nodes need to its model bucket, with their SHA-256",
        description="For each artifact not already in s3://<model bucket>/flotilla-node-artifacts/ with its "
        "pinned SHA-256: download it from AWS (or take it from --from), check the SHA-256, upload it with "
        "the checksum (S3 refuses other bytes). Uploads nothing that does not match.",
    )
    stage.add_argument(
        "--from",
        dest="source_dir",
        metavar="DIR",
        help="a directory holding the artifacts under their upstream names (for a machine without internet)",
    )
    stage.set_defaults(handler=run_stage)
    check = psub.add_parser(
        "check",
        help="are the boot artifacts staged and does the nodes' AMI resolve in the region?",
        description="Exit status 0 when every artifact is staged with its pinned SHA-256 in a bucket of the "
        "region and the AMI resolves to the pinned release; 1 otherwise, each problem with its fix.",
    )
    check.set_defaults(handler=run_check)
    for q in (stage, check):
        q.add_argument("--config", required=True, metavar="PATH", help="the flotilla config YAML the deploy uses")
        add_json_option(q, "one finding per artifact")
    add_confirm_options(stage)
    return [stage, check]  # ops/cli.py adds --region and --profile


def _clients(args: argparse.Namespace, config_region: str | None) -> tuple[Aws, str]:
    args.region = args.region or config_region
    aws = clients_for(args)
    region = str(aws.s3.meta.region_name)
    if config_region and region != config_region:
        raise bad_arg("--region", region, f"differs from the config's region {config_region}", "drop --region")
    return aws, region


def _report(args: argparse.Namespace, console: Console, title: str, checks: list[BootCheck]) -> int:
    status = EXIT_OK if all(c.ok for c in checks) else EXIT_FAILED
    if args.json:
        console.print_json(
            json.dumps({"title": title, "ok": status == EXIT_OK, "checks": [dataclasses.asdict(c) for c in checks]})
        )
        return status
    table = Table(title=title, show_lines=False)
    table.add_column("needed for boot", overflow="fold")  # whole S3 keys and parameter names, to copy
    table.add_column("")
    table.add_column("found / fix", overflow="fold")
    for c in checks:
        table.add_row(
            c.name, "[green]ok[/]" if c.ok else "[red]FAIL[/]", c.detail + (f"; fix: {c.fix}" if c.fix else "")
        )
    console.print(table)
    return status


def run_stage(args: argparse.Namespace, console: Console) -> int:
    config = read_config(args.config)
    prose = prose_console(args, console)
    if not needed_artifacts(config):
        prose.print(f"{config.instance_type} has no EFA interfaces: its nodes install nothing at boot.")
        return EXIT_OK
    source_dir = Path(args.source_dir) if args.source_dir else None
    if source_dir is not None and not source_dir.is_dir():
        raise bad_arg("--from", args.source_dir, "is not a directory", "give the directory holding the artifacts")
    aws, region = _clients(args, config.region)
    names = ", ".join(a.key for a in needed_artifacts(config))
    if not confirmed(args, prose, f"upload {names} to s3://{config.model.bucket} in {region} where missing"):
        return _report(
            args,
            console,
            f"boot artifacts of {args.config} in {region} (dry run)",
            artifact_checks(config, s3=aws.s3, region=region, config_path=args.config),
        )
    checks = list(stage_artifacts(config, s3=aws.s3, region=region, source_dir=source_dir, config_path=args.config))
    return _report(args, console, f"boot artifacts of {args.config} in {region}", checks)


def run_check(args: argparse.Namespace, console: Console) -> int:
    config = read_config(args.config)
    aws, region = _clients(args, config.region)
    checks = artifact_checks(config, s3=aws.s3, region=region, config_path=args.config)
    checks += ami_checks(config, ssm=aws.ssm, ec2=aws.ec2, region=region)
    return _report(args, console, f"what {args.config}'s nodes boot from, in {region}", checks)
