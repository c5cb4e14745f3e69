"""`flotilla status` reads /health/ready with the same parser as the router (contract/ready.py):
the body a node writes (runtime/node/handshake.py ReadyBody) is read in full, a body of an older
revision (no role, no members, no loading) still reads, and one whose fields cannot be used is an
error naming the field instead of a status built on garbage."""

from __future__ import annotations

import pytest
from ops_fakes import HealthServer

import contract.ready
import runtime.node.handshake as handshake
from ops.fleet import Node, fetch_health
from runtime.membership import Role


@pytest.fixture
def served():
    servers: list[HealthServer] = []

    def serve(body: dict, status: int = 200) -> str:
        servers.append(HealthServer(body, status))
        return f"127.0.0.1:{servers[-1].port}"

    yield serve
    for s in servers:
        s.close()


def _node(doc: dict) -> Node:
    return Node(
        task_arn="arn:aws:ecs:us-east-1:1:task/c/t", last_status="RUNNING", task_definition_arn="td", health=doc
    )


def test_the_router_and_ops_read_ready_bodies_with_one_parser():
    assert handshake.read_ready is contract.ready.read_ready
    assert handshake.Loading is contract.ready.Loading  # the node writes the model readers read


def test_ops_reads_every_field_of_the_body_a_leader_writes(served):
    body = handshake.ReadyBody(
        ready=True,
        state=handshake.UnitState.READY,
        unit="cell0-unit3",
        revision="7",
        rank=0,
        world_size=2,
        role=Role.LEADER,
        cell="cell0",
        load=handshake.Load(queue_depth=2, running=5, max_running=16, in_flight=6, wait_s=0.5),
        members=[handshake.MemberReport(rank=1, address="10.0.0.2:8000", state="ready", ready=True, revision="7")],
        loading=handshake.Loading(phase="warmup", phase_s=3.0),
    )
    doc, err = fetch_health(served(body.to_dict()), timeout_s=2.0)
    assert err is None and doc is not None
    report = _node(doc).report
    assert report is not None
    assert (report.ready, report.state, report.unit, report.revision, report.cell) == (
        True,
        "ready",
        "cell0-unit3",
        "7",
        "cell0",
    )
    assert report.role == "leader" and report.leads
    assert (report.rank, report.world_size) == (0, 2)  # what a unit's formation is judged by
    assert (report.load.running, report.load.in_flight, report.load.wait_s) == (5, 6, 0.5)
    assert report.members == [m.to_dict() for m in body.members]
    assert report.loading == handshake.Loading(phase="warmup", phase_s=3.0)


def test_ops_reads_a_body_of_an_older_revision_without_the_newer_keys(served):
    old = {"ready": False, "state": "forming", "unit": "cell0-unit0", "revision": "1", "rank": 0, "load": {}}
    doc, err = fetch_health(served(old, status=503), timeout_s=2.0)  # a 503 still carries the body
    assert err is None and doc == old
    report = _node(doc).report
    assert report is not None
    assert report.role is None and report.leads  # before roles, rank 0 leads
    assert report.members is None and report.loading is None
    assert report.load.in_flight == -1  # "does not say", not 0
    assert report.world_size == -1  # not said: no unit's nodes_per_unit, so its formation is flagged


def test_a_body_whose_load_cannot_be_read_is_an_error_naming_the_field(served):
    bad = {"ready": True, "state": "ready", "unit": "cell0-unit0", "rank": 0, "load": {"running": "many"}}
    address = served(bad)
    doc, err = fetch_health(address, timeout_s=2.0)
    assert doc is None
    assert err is not None and err.startswith(f"http://{address}") and "'load.running'" in err


def test_a_body_that_is_not_an_object_is_an_error(served):
    doc, err = fetch_health(served([1, 2]), timeout_s=2.0)  # type: ignore[arg-type]
    assert doc is None and err is not None and "JSON object" in err
