"""cdk-nag acknowledgements: one finding, one construct, one reason a reviewer can check."""

from __future__ import annotations

import aws_cdk as cdk
from constructs import IConstruct


def acknowledge(construct: IConstruct, finding: str, reason: str) -> None:
    """Acknowledge `finding` on `construct` and its children.

    `finding` is the rule id as cdk-nag reports it, with the granular part when it has one:
    "AwsSolutions-EC23", "AwsSolutions-IAM5[Resource::*]".
    """
    cdk.Validations.of(construct).acknowledge(
        cdk.Acknowledgment(id=f"AwsSolutions::{finding}", reason=reason))
