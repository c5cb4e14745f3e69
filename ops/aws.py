"""The AWS clients the CLI uses, made once per command from --region/--profile.

DescribeInstanceTopology, DescribeCapacityReservations and the pinned AMI's public SSM parameter
get their own clients so that tests can stub those calls (moto does not implement the first two and
does not hold that parameter) while every other call still goes to moto.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import boto3
import botocore.exceptions

from ops.errors import OpsError

T = TypeVar("T")


# boto3 builds its clients at run time: their types exist only in boto3-stubs, not a dependency.
@dataclass
class Aws:
    ecs: Any
    ec2: Any
    autoscaling: Any
    servicediscovery: Any
    topology: Any  # EC2 client used only for describe_instance_topology
    cloudformation: Any = None  # teardown / shrink only
    cloudwatch: Any = None  # the FleetReadyUnits alarm's threshold (status)
    ssm: Any = None  # the router's admission parameter (shed)
    logs: Any = None  # the routers' unit states (status --health-via router-logs)
    secretsmanager: Any = None  # the API keys' secret (keys, teardown, preflight)
    s3: Any = None  # the model artifacts (publish, preflight)
    acm: Any = None  # the front door's certificate (preflight)
    ecr: Any = None  # the configured image (preflight)
    servicequotas: Any = None  # the Trainium vCPU quota (preflight; moto has no EC2 quotas: tests stub it)
    capacity: Any = None  # EC2 client used only for describe_capacity_reservations (moto lacks it: tests stub it)
    ami: Any = None  # SSM client used only for the pinned AMI's public parameter (tests stub its answers)
    sts: Any = None  # which account the credentials are for (preflight)


def make_clients(*, region: str | None = None, profile: str | None = None) -> Aws:
    # boto3 reads AWS_DEFAULT_REGION; AWS_REGION is what most tools (and ECS tasks) set.
    region = region or os.environ.get("AWS_REGION") or None
    try:
        session = boto3.Session(region_name=region, profile_name=profile)
    except botocore.exceptions.ProfileNotFound as err:
        raise OpsError(f"--profile {profile!r}: {err}") from None
    if session.region_name is None:
        raise OpsError("no AWS region: pass --region or set AWS_REGION")
    return Aws(
        ecs=session.client("ecs"),
        ec2=session.client("ec2"),
        autoscaling=session.client("autoscaling"),
        servicediscovery=session.client("servicediscovery"),
        topology=session.client("ec2"),
        cloudformation=session.client("cloudformation"),
        cloudwatch=session.client("cloudwatch"),
        ssm=session.client("ssm"),
        logs=session.client("logs"),
        secretsmanager=session.client("secretsmanager"),
        s3=session.client("s3"),
        acm=session.client("acm"),
        ecr=session.client("ecr"),
        servicequotas=session.client("service-quotas"),
        capacity=session.client("ec2"),
        ami=session.client("ssm"),
        sts=session.client("sts"),
    )


def clients_for(args: argparse.Namespace) -> Aws:
    """The clients a subcommand uses (tests replace `make_clients`)."""
    return make_clients(region=getattr(args, "region", None), profile=getattr(args, "profile", None))


def chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]
