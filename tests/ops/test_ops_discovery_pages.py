"""Finding a deployment's services across pages, as ECS answers for a cell of 20 units: ListServices
returns at most 10 ARNs a page unless asked for more ("maxResults ... default 10", ListServices API
reference), and DescribeServices takes at most 10 ("You may specify up to 10 services to describe
in a single operation", DescribeServices API reference). botocore's Stubber here checks every request
the real client would send; test_ops_status_fleet.py runs a cell of 12 units on the ECS model."""

from __future__ import annotations

from types import SimpleNamespace

import boto3
import pytest
from botocore.exceptions import ClientError
from botocore.stub import Stubber
from ecs_api import EcsModel

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


def test_the_ecs_model_pages_list_calls_and_refuses_more_than_ten_services_to_describe():
    """The model answers as ECS does (ops/rehearsal/ecs_rules.py): 10 services a page by default,
    maxResults within 1-100, a nextToken until the last page, DescribeServices of at most 10."""
    model = EcsModel()
    model.create_cluster(clusterName="flotilla-cell0")
    td = model.register_task_definition(family="f", containerDefinitions=[{"name": "node", "image": "i"}])
    arn = td["taskDefinition"]["taskDefinitionArn"]
    for i in range(23):
        model.create_service(cluster="flotilla-cell0", serviceName=f"s{i}", taskDefinition=arn, desiredCount=0)
    first = model.list_services(cluster="flotilla-cell0")
    assert len(first["serviceArns"]) == 10 and "nextToken" in first
    pages = list(model.get_paginator("list_services").paginate(cluster="flotilla-cell0"))
    assert [len(p["serviceArns"]) for p in pages] == [10, 10, 3]
    assert "nextToken" not in pages[-1]
    assert len({a for p in pages for a in p["serviceArns"]}) == 23
    assert len(model.list_services(cluster="flotilla-cell0", maxResults=100)["serviceArns"]) == 23
    with pytest.raises(ClientError, match="maxResults"):
        model.list_services(cluster="flotilla-cell0", maxResults=101)
    with pytest.raises(ClientError, match="more than 10"):
        model.describe_services(cluster="flotilla-cell0", services=[f"s{i}" for i in range(11)])


def test_status_finds_every_unit_of_a_cell_of_twelve_across_pages(world, run_cli):
    for i in range(12):
        world.add_unit(cell=0, index=i, nodes=1)
    before = len(world.model.calls)
    code, out = run_cli("status")
    assert code == 0, out
    assert "12/12 units ready" in out
    for i in range(12):
        assert f"cell0-unit{i}" in out
    calls = world.model.calls[before:]
    listed = [kw for op, kw in calls if op == "ListServices"]
    assert any("nextToken" in kw for kw in listed), listed  # the second page was asked for
    described = [kw["services"] for op, kw in calls if op == "DescribeServices"]
    assert described and all(len(batch) <= 10 for batch in described)
