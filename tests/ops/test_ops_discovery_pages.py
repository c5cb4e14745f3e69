"""Finding a deployment's services across pages, as ECS answers for a cell of 20 units: ListServices
returns at most 10 ARNs a page unless asked for more ("maxResults ... default 10", ListServices API
reference), and DescribeServices takes at most 10 ("You may specify up to 10 services to describe
in a single operation", DescribeServices API reference). The ECS model the other ops tests use
answers in one page; botocore's Stubber here checks every request the real client would send."""

from __future__ import annotations

from types import SimpleNamespace

import boto3
from botocore.stub import Stubber

from ops.fleet import _active_services

CLUSTER = "arn:aws:ecs:us-east-1:123456789012:cluster/flotilla-cell0"


def _arn(i: int) -> str:
    return f"arn:aws:ecs:us-east-1:123456789012:service/flotilla-cell0/flotilla-cell0-unit{i}"


def _described(i: int, status: str) -> dict:
    return {"serviceArn": _arn(i), "serviceName": f"flotilla-cell0-unit{i}", "status": status}


def test_every_page_of_list_services_is_read_and_services_are_described_ten_at_a_time():
    ecs = boto3.client("ecs", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    arns = [_arn(i) for i in range(23)]
    gone = {7, 21}  # services being deleted (DRAINING) or deleted (INACTIVE) are not the fleet's
    with Stubber(ecs) as stub:
        stub.add_response("list_services", {"serviceArns": arns[:10], "nextToken": "p2"}, {"cluster": CLUSTER})
        stub.add_response(
            "list_services", {"serviceArns": arns[10:20], "nextToken": "p3"}, {"cluster": CLUSTER, "nextToken": "p2"}
        )
        stub.add_response("list_services", {"serviceArns": arns[20:]}, {"cluster": CLUSTER, "nextToken": "p3"})
        for lo in (0, 10, 20):
            batch = arns[lo : lo + 10]
            services = [
                _described(i, "DRAINING" if i == 7 else "INACTIVE" if i == 21 else "ACTIVE")
                for i in range(lo, lo + len(batch))
            ]
            stub.add_response(
                "describe_services",
                {"services": services, "failures": []},
                {"cluster": CLUSTER, "services": batch, "include": ["TAGS"]},
            )
        found = _active_services(SimpleNamespace(ecs=ecs), CLUSTER, tags=True)  # type: ignore[arg-type]
        stub.assert_no_pending_responses()
    assert [s["serviceArn"] for s in found] == [a for i, a in enumerate(arns) if i not in gone]
