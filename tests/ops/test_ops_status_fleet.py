"""`flotilla status` at fleet scale: the per-cell Cloud Map services, and followers read through their
leader's ready body (contract.ATTR_MEMBERS) instead of asking every node."""

from __future__ import annotations

import json

import contract


def per_cell_layout(aws, fleet, unit, *, cell: str = "cell0") -> None:
    """Register the unit's members in its cell's own service, as the Discovery stack lays it out."""
    sd = aws.servicediscovery
    ns = next(n for n in sd.list_namespaces()["Namespaces"] if n["Name"] == f"{fleet.deployment}.internal")
    name = f"{contract.CLOUDMAP_UNITS_SERVICE_PREFIX}{cell}"
    existing = {s["Name"]: s["Id"] for s in sd.list_services()["Services"]}
    svc = existing.get(name) or sd.create_service(Name=name, NamespaceId=ns["Id"])["Service"]["Id"]
    for node in unit.nodes:
        sd.register_instance(
            ServiceId=svc,
            InstanceId=node.task_arn.rsplit("/", 1)[-1],
            Attributes={
                "AWS_INSTANCE_IPV4": "127.0.0.1",
                "AWS_INSTANCE_PORT": str(node.server.port),
                "ECS_SERVICE_NAME": unit.service_name,
            },
        )


def lead(unit, **follower_state) -> None:
    """The leader's body lists its followers as it last saw them; followers name their leader."""
    leader = unit.nodes[0].server
    members = []
    for rank, node in enumerate(unit.nodes[1:], start=1):
        report = {"rank": rank, "address": f"127.0.0.1:{node.server.port}", "state": "ready", "ready": True}
        members.append({**report, "revision": "1", **follower_state})
        node.server.set(**{contract.ATTR_LEADER: f"127.0.0.1:{leader.port}"})
    leader.set(**{contract.ATTR_MEMBERS: members})


def test_status_finds_members_in_every_cell_service_and_asks_only_the_leaders(aws, fleet, run_cli):
    units = [fleet.add_unit(cell=c, index=0, nodes=4, register=False) for c in (0, 1)]
    for c, unit in enumerate(units):
        per_cell_layout(aws, fleet, unit, cell=f"cell{c}")
        lead(unit)
    code, out = run_cli("status", "--json")
    assert code == 0, out
    doc = json.loads(out)
    assert [u["state"] for u in doc] == ["READY", "READY"]
    for u, unit in zip(doc, units):
        assert all(n["registered"] for n in u["nodes"])
        assert [n["role"] for n in u["nodes"]] == ["leader", "follower", "follower", "follower"]
        leader_address = f"127.0.0.1:{unit.nodes[0].server.port}"
        assert [n["reported_by"] for n in u["nodes"]] == [None, leader_address, leader_address, leader_address]
    # One request per leader (plus at most one follower asked first per formation), never every node.
    for unit in units:
        assert unit.nodes[0].server.hits == 1
        assert sum(n.server.hits for n in unit.nodes[1:]) <= 1


def test_a_follower_its_leader_reports_forming_makes_the_unit_not_ready(aws, fleet, run_cli):
    unit = fleet.add_unit(cell=0, index=0, nodes=3, register=False)
    per_cell_layout(aws, fleet, unit)
    lead(unit, state="forming", ready=False)
    code, out = run_cli("status")
    assert code == 3  # the only unit is not ready: below the FleetReadyUnits threshold
    assert f"node {unit.nodes[1].instance_id} (rank 1) is forming, not ready" in out


def test_when_the_leader_is_not_ready_each_follower_is_asked_for_its_own_word(aws, fleet, run_cli):
    unit = fleet.add_unit(cell=0, index=0, nodes=2, register=False)
    per_cell_layout(aws, fleet, unit)
    lead(unit)  # the leader's last word: the follower was ready ...
    unit.nodes[0].server.set(ready=False, state="forming")
    unit.nodes[0].server.status = 503
    unit.nodes[1].server.close()  # ... but it has died since
    code, out = run_cli("status", "--json", "--health-timeout", "1")
    assert code == 3  # the only unit is not ready: below the FleetReadyUnits threshold
    follower = json.loads(out)[0]["nodes"][1]
    assert (follower["reported_by"], follower["health"], follower["state"]) == (None, None, "unreachable")


def test_a_follower_its_leader_cannot_reach_is_asked_directly(aws, fleet, run_cli):
    unit = fleet.add_unit(cell=0, index=0, nodes=2, register=False)
    per_cell_layout(aws, fleet, unit)
    lead(unit, state="unreachable", ready=False, revision="")
    unit.nodes[1].server.close()
    code, out = run_cli("status", "--health-timeout", "1")
    assert code == 3  # the only unit is not ready: below the FleetReadyUnits threshold
    assert f"node {unit.nodes[1].instance_id} unreachable" in out
