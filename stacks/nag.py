"""cdk-nag (3.x) acknowledgements, attached to the exact resource they excuse.

Each names the AwsSolutions rule, the finding it applies to (for granular rules such as IAM5,
the offending action or resource) and a reason a reviewer can check. Acknowledgements are
construct metadata: they take effect whenever cdk-nag's AwsSolutionsChecks runs (tests/stacks).
cdk-nag reports a finding on the CloudFormation resource (the L1), so that is what is acknowledged:
cfn_child finds it under an L2 construct.
"""

from __future__ import annotations

from typing import TypeVar

from aws_cdk import Acknowledgment, CfnResource, Validations
from constructs import IConstruct

Cfn = TypeVar("Cfn", bound=CfnResource)


def cfn_child(construct: IConstruct, kind: type[Cfn]) -> Cfn:
    """The `kind` resource an L2 construct wraps: its node.default_child, the child with the id
    "Default" or "Resource", None when there is none (constructs 10.8.1, Node.default_child). A
    construct without one, or with another kind, is a bug in the stack: raised naming the construct."""
    child = construct.node.default_child
    if not isinstance(child, kind):
        raise TypeError(
            f"{construct.node.path}: expected a {kind.__name__} as its default child, not {type(child).__name__}"
        )
    return child


def acknowledge(resource: IConstruct, rule: str, reason: str, *, applies_to: str = "") -> None:
    """Acknowledge AwsSolutions-<rule> (optionally one granular finding) on `resource` only."""
    finding = f"AwsSolutions::AwsSolutions-{rule}" + (f"[{applies_to}]" if applies_to else "")
    Validations.of(resource).acknowledge(Acknowledgment(id=finding, reason=reason))
