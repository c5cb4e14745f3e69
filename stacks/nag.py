"""cdk-nag (3.x) acknowledgements, attached to the exact resource they excuse.

Each names the AwsSolutions rule, the finding it applies to (for granular rules such as IAM5,
the offending action or resource) and a reason a reviewer can check. Acknowledgements are
construct metadata: they take effect whenever cdk-nag's AwsSolutionsChecks runs (tests/stacks).
"""

from __future__ import annotations

from aws_cdk import Acknowledgment, Validations
from constructs import IConstruct


def acknowledge(resource: IConstruct, rule: str, reason: str, *, applies_to: str = "") -> None:
    """Acknowledge AwsSolutions-<rule> (optionally one granular finding) on `resource` only."""
    finding = f"AwsSolutions::AwsSolutions-{rule}" + (f"[{applies_to}]" if applies_to else "")
    Validations.of(resource).acknowledge(Acknowledgment(id=finding, reason=reason))
