"""`flotilla status`: one row per node with rank, role, revision, readiness and load; exit status 1
when any unit is not ready."""

from __future__ import annotations

import json


def test_status_of_a_healthy_fleet_lists_every_node_and_exits_zero(fleet, run_cli):
    a = fleet.add_unit(cell=0, index=0)
    fleet.add_unit(cell=0, index=1)
    fleet.add_unit(cell=1, index=0, nodes=3)
    code, out = run_cli("status")
    assert code == 0, out
    assert "3/3 units ready" in out
    for unit in fleet.units:
        assert unit.unit_id in out
        for node in unit.nodes:
            assert node.instance_id in out
    assert "leader" in out and "follower" in out
    assert a.nodes[0].instance_id in out


def test_status_json_reports_rank_role_revision_and_load(fleet, run_cli):
    unit = fleet.add_unit(cell=0, index=0)
    unit.nodes[0].server.set(load={"queue_depth": 3, "running": 7, "max_running": 16, "kv_cache_used": 0.5})
    code, out = run_cli("status", "--json")
    assert code == 0
    doc = json.loads(out)
    assert [u["unit"] for u in doc] == ["cell0-unit0"]
    nodes = doc[0]["nodes"]
    assert [(n["rank"], n["role"], n["instance_id"]) for n in nodes] == [
        (0, "leader", unit.nodes[0].instance_id),
        (1, "follower", unit.nodes[1].instance_id),
    ]
    assert nodes[0]["health"]["load"]["queue_depth"] == 3
    assert all(n["registered"] for n in nodes)
    assert doc[0]["state"] == "READY"


def test_a_follower_that_is_not_ready_makes_status_exit_one_and_names_it(fleet, run_cli):
    fleet.add_unit(cell=0, index=0)
    sick = fleet.add_unit(cell=0, index=1)
    sick.nodes[1].server.set(ready=False, state="forming")
    sick.nodes[1].server.status = 503
    code, out = run_cli("status")
    assert code == 1
    assert "1/2 units ready" in out
    assert "cell0: 1/2 units ready" in out
    assert f"node {sick.nodes[1].instance_id} (rank 1) is forming, not ready" in out


def test_an_unreachable_node_makes_status_exit_one(fleet, run_cli):
    unit = fleet.add_unit(cell=0, index=0)
    unit.nodes[0].server.close()
    code, out = run_cli("status", "--health-timeout", "1")
    assert code == 1
    assert f"node {unit.nodes[0].instance_id} unreachable" in out


def test_members_reporting_two_revisions_are_flagged(fleet, run_cli):
    unit = fleet.add_unit(cell=0, index=0)
    unit.nodes[1].server.set(revision="2")
    code, out = run_cli("status", "--unit", "cell0-unit0")
    assert code == 1
    assert "different revisions 1, 2" in out


def test_a_unit_missing_from_cloud_map_is_not_ready_because_the_router_cannot_see_it(fleet, run_cli):
    fleet.add_unit(cell=0, index=0, register=False)
    code, out = run_cli("status", "--health-timeout", "0.2")
    assert code == 1
    # Without Cloud Map the CLI falls back to the instance's private IP, which answers nothing here.
    assert "unreachable" in out


def test_status_without_any_unit_exits_one_and_says_where_it_looked(aws, run_cli):
    code, out = run_cli("status", "--deployment", "prod")
    assert code == 1
    assert "no units found" in out and "flotilla:deployment=prod" in out


def test_status_filters_by_cell(fleet, run_cli):
    fleet.add_unit(cell=0, index=0)
    fleet.add_unit(cell=1, index=0)
    code, out = run_cli("status", "--cell", "cell1")
    assert code == 0
    assert "cell1-unit0" in out and "cell0-unit0" not in out


def test_the_deployments_own_cloud_map_namespace_wins_when_several_have_a_units_service(aws, fleet, run_cli):
    fleet.add_unit(cell=0, index=0)
    sd = aws.servicediscovery
    sd.create_http_namespace(Name="staging.internal")
    other = next(n for n in sd.list_namespaces()["Namespaces"] if n["Name"] == "staging.internal")
    sd.create_service(Name="units", NamespaceId=other["Id"])
    code, out = run_cli("status")
    assert code == 0, out
    code, out = run_cli("status", "--cloudmap-namespace", "staging.internal", "--health-timeout", "0.2")
    assert code == 1  # nothing registered there: the leader is not in Cloud Map, private IPs answer nothing


def test_an_aws_error_is_one_line_naming_the_call_not_a_traceback(aws, run_cli):
    from botocore.stub import Stubber

    with Stubber(aws.ecs) as stub:
        stub.add_client_error(
            "list_clusters",
            service_error_code="AccessDeniedException",
            service_message="User is not authorized to perform: ecs:ListClusters",
        )
        code, out = run_cli("status")
    assert code == 1
    assert "error: AWS:" in out and "ecs:ListClusters" in out


def test_no_health_judges_by_ecs_and_cloud_map_only(fleet, run_cli):
    """From outside the VPC the nodes' port is closed: --no-health still answers from ECS/Cloud Map."""
    unit = fleet.add_unit(cell=0, index=0)
    for n in unit.nodes:
        n.server.close()
    code, out = run_cli("status", "--no-health")
    assert code == 0, out
    assert "1/1 units ready" in out
    fleet.add_unit(cell=0, index=1, register=False)
    code, out = run_cli("status", "--no-health")
    assert code == 1
    assert "cell0-unit1: not registered in Cloud Map" in out


def test_cells_are_found_by_their_tags_whatever_the_cluster_is_called(aws, fleet, run_cli):
    fleet.add_unit(cell=0, index=0)
    # another deployment's cell, and an untagged cluster that only looks like one: both ignored
    aws.ecs.create_cluster(
        clusterName="staging-cell0",
        tags=[{"key": "flotilla:deployment", "value": "staging"}, {"key": "flotilla:cell", "value": "cell0"}],
    )
    aws.ecs.create_cluster(clusterName="flotilla-cells-archive")
    renamed = aws.ecs.create_cluster(
        clusterName="legacy-name",
        tags=[{"key": "flotilla:deployment", "value": "flotilla"}, {"key": "flotilla:cell", "value": "cell7"}],
    )
    assert renamed["cluster"]["clusterName"] == "legacy-name"
    from ops.aws import make_clients
    from ops.fleet import _cell_clusters

    names = sorted(c["clusterName"] for c in _cell_clusters(make_clients(), "flotilla"))
    assert names == ["flotilla-cell0", "legacy-name"]
    code, out = run_cli("status")
    assert code == 0 and "1/1 units ready" in out


def test_discovery_limited_to_some_clusters_finds_their_units_exactly_as_a_full_discovery_does(aws, fleet):
    """The --wait loops of replace-node and rollback discover only the cells they watch."""
    from ops.fleet import discover

    fleet.add_unit(cell=0, index=0)
    watched = fleet.add_unit(cell=1, index=0, nodes=3)
    fleet.add_unit(cell=1, index=1)
    fleet.add_unit(cell=2, index=0)
    full = discover(aws, deployment="flotilla")
    part = discover(aws, deployment="flotilla", clusters={watched.cluster_arn})
    assert [u.unit_id for u in part.units] == ["cell1-unit0", "cell1-unit1"]
    assert part.unit(watched.unit_id) == full.unit(watched.unit_id)
    assert part.units == [u for u in full.units if u.cluster_arn == watched.cluster_arn]
    assert all(n.ready and n.registered for n in part.unit(watched.unit_id).nodes)
