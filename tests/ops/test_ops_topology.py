"""`flotilla topology`: each unit's nodes with their DescribeInstanceTopology network nodes, and
whether the ranks follow topology order (moto lacks the API: a botocore Stubber answers it)."""

from __future__ import annotations

import json


def _topology(unit, paths: dict[str, list[str]]) -> dict:
    return {
        "Instances": [
            {
                "InstanceId": iid,
                "InstanceType": "trn1.32xlarge",
                "NetworkNodes": nodes,
                "AvailabilityZone": "us-east-1a",
                "ZoneId": "use1-az1",
            }
            for iid, nodes in paths.items()
        ]
    }


def test_ranks_in_topology_order_pass(fleet, topology_stub, run_cli):
    unit = fleet.add_unit(cell=0, index=0)
    a, b = (n.instance_id for n in unit.nodes)  # rank 0, rank 1
    topology_stub.add_response(
        "describe_instance_topology",
        _topology(unit, {a: ["nn-spine", "nn-agg", "nn-leaf-1"], b: ["nn-spine", "nn-agg", "nn-leaf-2"]}),
        {"InstanceIds": sorted([a, b])},
    )
    code, out = run_cli("topology")
    assert code == 0, out
    assert "nn-spine > nn-agg > nn-leaf-1" in out
    assert "cell0-unit0: rank order follows topology" in out


def test_ranks_out_of_topology_order_exit_one_and_show_both_orders(fleet, topology_stub, run_cli):
    unit = fleet.add_unit(cell=0, index=0)
    a, b = (n.instance_id for n in unit.nodes)
    # rank 0 (a) sits under leaf-2, rank 1 (b) under leaf-1: rendezvous would have put b first
    topology_stub.add_response(
        "describe_instance_topology",
        _topology(unit, {a: ["nn-spine", "nn-agg", "nn-leaf-2"], b: ["nn-spine", "nn-agg", "nn-leaf-1"]}),
        {"InstanceIds": sorted([a, b])},
    )
    code, out = run_cli("topology", "--unit", "cell0-unit0")
    assert code == 1
    assert f"rank order ['{a}', '{b}'] does not follow topology order ['{b}', '{a}']" in out


def _unit_under_two_spines(fleet, topology_stub):
    unit = fleet.add_unit(cell=0, index=0)
    a, b = (n.instance_id for n in unit.nodes)
    topology_stub.add_response(
        "describe_instance_topology",
        _topology(unit, {a: ["nn-spine-1", "nn-agg-1", "nn-leaf-1"], b: ["nn-spine-2", "nn-agg-2", "nn-leaf-2"]}),
        {"InstanceIds": sorted([a, b])},
    )
    return unit


def test_nodes_under_different_spines_are_reported(fleet, topology_stub, run_cli):
    _unit_under_two_spines(fleet, topology_stub)
    code, out = run_cli("topology")
    assert code == 1
    assert "2 different top-layer network nodes" in out


def test_topology_json_gives_each_units_network_nodes_and_problems(fleet, topology_stub, run_cli):
    _unit_under_two_spines(fleet, topology_stub)
    code, out = run_cli("topology", "--cell", "0", "--json")
    (doc,) = json.loads(out)
    assert code == 1 and doc["unit"] == "cell0-unit0"
    assert [n["network_nodes"] for n in doc["nodes"]] == [
        ["nn-spine-1", "nn-agg-1", "nn-leaf-1"],
        ["nn-spine-2", "nn-agg-2", "nn-leaf-2"],
    ]
    assert any("2 different top-layer network nodes" in p for p in doc["problems"])
