"""cdk-nag acknowledgements: one finding, one construct, one reason a reviewer can check."""

from __future__ import annotations

import aws_cdk as cdk
from constructs import IConstruct


def acknowledge(construct: IConstruct, finding: str, reason: str) -> None:
    """Acknowledge `finding` (e.g. "AwsSolutions-IAM5") on `construct` and its children."""
    cdk.Validations.of(construct).acknowledge(cdk.Acknowledgment(id=finding, reason=reason))
