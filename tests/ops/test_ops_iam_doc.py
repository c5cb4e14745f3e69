"""Every AWS API the CLI calls is in the IAM list of docs/runbooks/README.md, so an operator's
policy written from that list is enough."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PREFIX = {
    "ecs": "ecs",
    "ec2": "ec2",
    "topology": "ec2",
    "autoscaling": "autoscaling",
    "servicediscovery": "servicediscovery",
    "cloudformation": "cloudformation",
    "cloudwatch": "cloudwatch",
    "ssm": "ssm",
    "logs": "logs",
    "secretsmanager": "secretsmanager",
    "s3": "s3",
    "acm": "acm",
    "ecr": "ecr",
    "servicequotas": "servicequotas",
    "sts": "sts",
    "capacity": "ec2",
    "ami": "ssm",
}


def _camel(name: str) -> str:
    return "".join(w.capitalize() for w in name.split("_"))


def api_calls() -> set[str]:
    calls = set()
    for path in (ROOT / "ops").rglob("*.py"):
        text = path.read_text()
        for client, op in re.findall(r"aws\.(\w+)\.(\w+)\(", text):
            if client in PREFIX and op != "get_paginator":
                calls.add(f"{PREFIX[client]}:{_camel(op)}")
        for client, op in re.findall(r"aws\.(\w+)\.get_paginator\(\"(\w+)\"\)", text):
            calls.add(f"{PREFIX[client]}:{_camel(op)}")
        for op in re.findall(r"topology_client\.(\w+)\(", text):
            calls.add(f"ec2:{_camel(op)}")
    return calls


def test_every_api_call_is_in_the_documented_iam_actions():
    doc = (ROOT / "docs" / "runbooks" / "README.md").read_text()
    calls = api_calls()
    assert "ec2:DescribeInstanceTopology" in calls and "ecs:UpdateService" in calls  # the scan works
    # IAM action names are not case sensitive (IAM JSON policy elements: Action); botocore's method
    # names lose the case of acronyms (GetAWSDefaultServiceQuota -> get_aws_default_service_quota).
    missing = sorted(c for c in calls if f"`{c}`".lower() not in doc.lower())
    assert not missing, f"document these IAM actions in docs/runbooks/README.md: {missing}"
