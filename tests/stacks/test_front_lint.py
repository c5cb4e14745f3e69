"""Layer 3: cfn-lint finds nothing in the front-door templates (errors or warnings).

No warning is waived: CDK's blue/green listener rules raise W3005 (redundant DependsOn) only when
the rules and the service share a stack; here the service lives in the Router stack.
"""

from __future__ import annotations

import json

import pytest
from cfnlint.api import ManualArgs, lint

from front_app import template

CASES = [
    ("Discovery", {}), ("Front", {}), ("Observability", {}), ("Router", {}),
    ("Discovery", {"certificate_arn": None}), ("Front", {"certificate_arn": None}),
]


@pytest.mark.parametrize("stack, variant", CASES,
                         ids=[f"{s}-{'http' if v else 'https'}" for s, v in CASES])
def test_cfn_lint_reports_nothing(stack, variant):
    matches = lint(json.dumps(template(stack, **variant)), config=ManualArgs(regions=["us-east-1"]))
    assert [f"{m.rule.id} {m.message} at {m.path}" for m in matches] == []
