"""`flotilla status`: one row per node with rank, role, revision, readiness and load; an exit status
by severity (0 ready, 1 degraded, 3 below the FleetReadyUnits threshold, 4 cannot tell); UNKNOWN,
never READY, when health cannot be read; what ECS and Auto Scaling said about each unit not ready."""

from __future__ import annotations

import json

from ops_fakes import bare_unit
from rich.console import Console

from ops.commands import status
from ops.fleet import Node


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


def test_status_shows_a_full_leaders_expected_wait_against_its_queue_timeout_and_it_stays_ready(fleet, run_cli):
    unit = fleet.add_unit(cell=0, index=0)
    full = {"queue_depth": 9, "running": 16, "max_running": 16, "kv_cache_used": 0.9}
    unit.nodes[0].server.set(load={**full, "wait_s": 31.5, "queue_timeout_s": 25.0})
    code, out = run_cli("status")
    assert code == 0, out  # at capacity is not broken: the unit is READY
    assert "31.5/25" in out and "16/16" in out


def test_a_follower_that_is_not_ready_makes_the_fleet_degraded_and_is_named(fleet, run_cli):
    fleet.add_unit(cell=0, index=0)
    sick = fleet.add_unit(cell=0, index=1)
    sick.nodes[1].server.set(ready=False, state="forming")
    sick.nodes[1].server.status = 503
    code, out = run_cli("status")
    assert code == 1
    assert "1/2 units ready" in out
    assert "cell0: 1/2 units ready" in out
    assert f"node {sick.nodes[1].instance_id} (rank 1) is forming, not ready" in out


def test_a_member_still_loading_is_named_with_its_phase_bytes_and_time_in_phase(fleet, run_cli):
    unit = fleet.add_unit(cell=0, index=0)
    # The ready body's `loading`, as docs/node.md documents it: 412 of 810 GB fetched, 95 s into the fetch.
    loading = {"phase": "fetch_model", "done_bytes": 412_000_000_000, "total_bytes": 810_000_000_000, "phase_s": 95.2}
    unit.nodes[1].server.set(ready=False, state="forming", loading=loading)
    unit.nodes[1].server.status = 503
    code, out = run_cli("status")
    assert code != 0
    flat = " ".join(out.split())
    assert "(rank 1) is forming, not ready (loading fetch_model 412.0/810.0 GB, 95 s in phase)" in flat, out


def test_an_unreachable_node_of_the_only_unit_makes_the_fleet_critical(fleet, run_cli):
    unit = fleet.add_unit(cell=0, index=0)
    unit.nodes[0].server.close()
    code, out = run_cli("status", "--health-timeout", "1")
    assert code == 3  # 0 ready units < the FleetReadyUnits default threshold of 1
    assert f"node {unit.nodes[0].instance_id} unreachable" in out
    assert "CRITICAL" in out


def test_members_reporting_two_revisions_are_flagged(fleet, run_cli):
    unit = fleet.add_unit(cell=0, index=0)
    unit.nodes[1].server.set(revision="2")
    code, out = run_cli("status", "--unit", "cell0-unit0")
    assert code == 3  # the only unit
    assert "different revisions 1, 2" in out


def test_a_unit_missing_from_cloud_map_is_not_ready_because_the_router_cannot_see_it(fleet, run_cli):
    fleet.add_unit(cell=0, index=0, register=False)
    code, out = run_cli("status", "--health-timeout", "0.2")
    assert code == 3
    # Without Cloud Map the CLI falls back to the instance's private IP, which answers nothing here;
    # with no node answering at all, ECS and Cloud Map judge, and Cloud Map has no member.
    assert "not registered in Cloud Map" in out


def test_status_without_any_unit_cannot_tell_and_says_where_it_looked(aws, run_cli):
    code, out = run_cli("status", "--deployment", "prod")
    assert code == 4
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
    assert code == 3  # nothing registered there: the leader is not in Cloud Map, private IPs answer nothing
    assert "not registered in Cloud Map" in out


def test_an_aws_error_is_one_line_naming_the_call_not_a_traceback(aws, run_cli):
    from botocore.stub import Stubber

    with Stubber(aws.ecs) as stub:
        stub.add_client_error(
            "list_clusters",
            service_error_code="AccessDeniedException",
            service_message="User is not authorized to perform: ecs:ListClusters",
        )
        code, out = run_cli("status")
    assert code == 4  # cannot tell: not "the fleet is unhealthy"
    assert "error: AWS:" in out and "ecs:ListClusters" in out


def test_no_health_says_unknown_never_ready_and_still_names_what_ecs_sees(fleet, run_cli):
    """From outside the VPC the nodes' port is closed: --no-health answers from ECS and Cloud Map,
    which cannot see a unit that is forming or broken, so a unit without an ECS fault is UNKNOWN."""
    unit = fleet.add_unit(cell=0, index=0)
    unit.nodes[0].server.set(ready=False, state="forming")
    for n in unit.nodes:
        n.server.close()
    code, out = run_cli("status", "--no-health")
    assert code == 4, out
    assert "0/1 units ready, 1 UNKNOWN" in out and "READY" not in out.replace("NOT READY", "")
    fleet.add_unit(cell=0, index=1, register=False)
    code, out = run_cli("status", "--no-health")
    assert code == 4
    assert "cell0-unit1: not registered in Cloud Map" in out
    code, out = run_cli("status", "--no-health", "--json")
    assert [u["state"] for u in json.loads(out)] == ["UNKNOWN", "NOT READY"]


def test_status_that_reaches_no_node_says_unknown_and_where_to_run_it(fleet, run_cli):
    """Outside the VPC without --no-health: no node answers, which says nothing about the units."""
    for i in range(3):
        unit = fleet.add_unit(cell=0, index=i)
        for n in unit.nodes:
            n.server.close()
    code, out = run_cli("status", "--health-timeout", "0.2")
    assert code == 4, out
    assert "0/3 units ready, 3 UNKNOWN" in out
    assert "no node answered /health/ready" in out and "--health-via router-logs" in " ".join(out.split())


def test_exit_status_by_severity(fleet, run_cli):
    units = [fleet.add_unit(cell=0, index=i) for i in range(4)]
    assert run_cli("status")[0] == 0
    units[0].nodes[1].server.set(ready=False, state="forming")
    code, out = run_cli("status")
    assert code == 1 and "3/4 units ready" in out and "DEGRADED" in out
    code, out = run_cli("status", "--min-ready-units", "4")
    assert code == 3 and "CRITICAL" in out and "threshold 4 ready units: --min-ready-units" in out
    for u in units:
        u.nodes[0].server.set(ready=False, state="broken")
    code, out = run_cli("status")
    assert code == 3 and "0/4 units ready" in out
    code, out = run_cli("status", "--unit", "cell0-unit1")
    assert code == 3 and "fleet: 0/4 ready" in out  # the threshold counts the whole fleet


def test_the_threshold_is_the_fleet_ready_units_alarms(aws, fleet, run_cli):
    """What the FleetReadyUnits alarm pages on is what status calls critical (CloudFormation names
    the alarm <stack>-<logical id>-<suffix>)."""
    a = fleet.add_unit(cell=0, index=0)
    fleet.add_unit(cell=0, index=1)
    fleet.add_unit(cell=0, index=2)
    aws.cloudwatch.put_metric_alarm(
        AlarmName="flotilla-Observability-FleetReadyUnits1A2B3C4D-0123456789AB",
        MetricName="ReadyUnits",
        Namespace="Flotilla",
        Statistic="Minimum",
        Period=60,
        EvaluationPeriods=3,
        Threshold=3,
        ComparisonOperator="LessThanThreshold",
    )
    a.nodes[0].server.set(ready=False, state="forming")
    code, out = run_cli("status")
    assert code == 3, out
    assert "threshold 3 ready units: alarm flotilla-Observability-FleetReadyUnits1A2B3C4D" in " ".join(out.split())


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


def _lose_instance(world, instance_id: str) -> None:
    """An instance dies (hardware, EC2 retirement): EC2 terminates it and ECS stops its task."""
    world.aws.ec2.terminate_instances(InstanceIds=[instance_id])
    world.model.instance_terminated(instance_id)


def test_a_unit_short_of_capacity_shows_ecs_events_stopped_reasons_and_the_asg_failure(world, run_cli):
    unit = world.add_unit(cell=0, index=0)
    world.add_unit(cell=0, index=1)
    world.aws.autoscaling.capacity["us-east-1a"] = 0
    lost = world.running_instances(unit)[1]
    _lose_instance(world, lost)
    for _ in range(3):  # the scheduler tries to place the missing task; managed scaling tries to launch
        world.model.tick()
    code, out = run_cli("status", "--unit", "cell0-unit0")
    flat = " ".join(out.split())
    assert code == 1, out  # cell0-unit1 still serves
    assert "1 of 2 nodes RUNNING" in flat
    assert "EC2 has no trn1.32xlarge capacity left in us-east-1a (InsufficientInstanceCapacity)" in flat
    assert "docs/runbooks/capacity-shortage.md" in flat
    assert "ECS event:" in flat and "was unable to place a task because no container instance met all" in flat
    assert "stopped task:" in flat and f"TerminationNotice: Host EC2 (instance {lost}) terminated." in flat
    assert "Auto Scaling:" in flat and f"{unit.asg} Failed: We currently do not have sufficient trn1.32xlarge" in flat
    code, out = run_cli("status", "--unit", "cell0-unit0", "--json")
    (doc,) = json.loads(out)
    assert any("InsufficientInstanceCapacity" in line for line in doc["diagnosis"])


def test_ready_units_get_no_diagnosis_calls(world, run_cli):
    world.add_unit(cell=0, index=0)
    before = len(world.model.calls)
    assert run_cli("status")[0] == 0
    # Why a unit's tasks stopped is asked per service (stopped_tasks); listing a cluster's stopping
    # members (desiredStatus STOPPED, no serviceName) is part of every status.
    assert not any(
        op == "ListTasks" and kw.get("desiredStatus") == "STOPPED" and "serviceName" in kw
        for op, kw in world.model.calls[before:]
    )


def test_members_still_stopping_are_shown_stopping_and_not_counted_as_running(world, run_cli):
    """ECS lists a task it is stopping only under desiredStatus STOPPED, and it is still finishing
    its in-flight requests (SIGTERM comes in STOPPING; ECS task lifecycle): status shows such members
    as stopping, counts none of them as a running node, and does not call them stopped."""
    unit = world.add_unit(cell=0, index=0)
    world.add_unit(cell=0, index=1)
    world.model.TICK_ON = frozenset()  # time stands still while status reads
    tasks = [t for t in world.model.tasks.values() if t.group == f"service:{unit.service}"]
    for t in tasks:
        t.desired_status, t.last_status = "STOPPED", "STOPPING"
    code, out = run_cli("status", "--unit", "cell0-unit0", "--json")
    (doc,) = json.loads(out)
    assert code == 1 and doc["state"] == "NOT READY", out
    assert sorted(n["task"] for n in doc["nodes"]) == sorted(t.arn.rsplit("/", 1)[-1] for t in tasks), out
    assert {n["state"] for n in doc["nodes"]} == {"stopping"}, out
    assert "0 of 2 nodes RUNNING" in doc["problems"]
    stopping = [line for line in doc["diagnosis"] if " STOPPING" in line]
    assert len(stopping) == 2 and all(line.startswith("stopping task: ") for line in stopping), doc["diagnosis"]


def test_a_drain_undone_by_a_deploy_is_warned_about(world, run_cli):
    """CloudFormation sets DesiredCount from the template when it updates a service, so a deploy
    brings a drained unit back: status says so instead of counting it as an ordinary unit."""
    unit = world.add_unit(cell=0, index=0)
    world.add_unit(cell=0, index=1)
    assert run_cli("drain-unit", "cell0-unit0", "--yes", "--wait", "600")[0] == 0
    code, out = run_cli("status")
    assert code == 0 and "warning" not in out
    world.model.update_service(cluster=unit.cluster, service=unit.service, desiredCount=unit.nodes)  # the deploy
    world.model.settle()
    code, out = run_cli("status")
    flat = " ".join(out.split())
    assert (
        "warning: cell0-unit0 was drained (tag flotilla:drained-desired-count) but its desired count is 2 again" in flat
    )
    assert "flotilla drain-unit cell0-unit0" in flat and "flotilla restore-unit cell0-unit0" in flat


def _router_log(aws, lines_by_age: list[tuple[int, dict]]) -> None:
    """The Router stack's log group as the routers fill it: unit_states lines among access log lines."""
    import time as _time

    group = "flotilla-Router-LogsA1B2C3D4-abcdef123456"
    aws.logs.create_log_group(logGroupName=group)
    aws.logs.create_log_stream(logGroupName=group, logStreamName="router/router/task1")
    now = _time.time()
    events = [
        {"timestamp": int((now - age) * 1000), "message": json.dumps({"ts": now - age, **line})}
        for age, line in sorted(lines_by_age, key=lambda x: -x[0])
    ]
    aws.logs.put_log_events(logGroupName=group, logStreamName="router/router/task1", logEvents=events)


def test_health_via_router_logs_reads_the_routers_view_from_outside_the_vpc(aws, fleet, run_cli):
    units = [fleet.add_unit(cell=0, index=i) for i in range(4)]
    for u in units:
        for n in u.nodes:
            n.server.close()  # outside the VPC: no node answers
    state = {"state": "ready", "revision": "1", "queue_depth": 0, "running": 1}
    _router_log(
        aws,
        [
            (400, {"event": "unit_states", "cell": "cell0", "units": {"cell0-unit3": {**state, "routable": True}}}),
            (30, {"event": "router_request", "request_id": "r1", "unit": "cell0-unit2", "status": 200}),
            (
                20,
                {
                    "event": "unit_states",
                    "cell": "cell0",
                    "units": {
                        "cell0-unit0": {**state, "routable": True},
                        "cell0-unit1": {**state, "state": "forming", "routable": False},
                        "cell0-unit2": {**state, "routable": True},
                    },
                },
            ),
            (
                5,
                {
                    "event": "unit_states",
                    "cell": "cell0",
                    "units": {"cell0-unit2": {**state, "routable": False, "state": "draining"}},
                },
            ),
        ],
    )
    code, out = run_cli("status", "--health-via", "router-logs")
    flat = " ".join(out.split())
    assert code == 4, out  # cell0-unit3's only report is too old to count: UNKNOWN
    assert "1/4 units ready, 1 UNKNOWN, 2 not ready" in flat
    assert "cell0-unit1: the routers see it forming, not routable" in flat
    assert "cell0-unit2: the routers see it draining, not routable" in flat  # the newest report wins
    assert "no node answered" not in flat
    code, out = run_cli("status", "--health-via", "router-logs", "--json")
    assert [u["state"] for u in json.loads(out)] == ["READY", "NOT READY", "NOT READY", "UNKNOWN"]


def test_health_via_router_logs_without_the_router_log_group_says_where_it_looked(aws, fleet, run_cli):
    fleet.add_unit(cell=0, index=0)
    code, out = run_cli("status", "--health-via", "router-logs")
    assert code == 1 and "no log group named flotilla-Router-Logs*" in out


def test_status_shows_load_figures_as_the_ready_body_parser_reads_them(fleet, run_cli):
    # contract/ready.py takes a load figure as int() / float() would: a leader that sends them as
    # strings still reports 50% KV cache and a 31.5 s wait against a 25 s queue timeout.
    unit = fleet.add_unit(cell=0, index=0)
    load = {"queue_depth": "9", "running": "7", "max_running": "16", "kv_cache_used": "0.5"}
    unit.nodes[0].server.set(load={**load, "wait_s": "31.5", "queue_timeout_s": "25"})
    code, out = run_cli("status")
    assert code == 0, out
    assert "50%" in out and "31.5/25" in out and "7/16" in out


def _node(health: dict | None) -> Node:
    return Node(
        task_arn="arn:aws:ecs:us-east-1:1:task/c/t1", last_status="RUNNING", task_definition_arn="td:1", health=health
    )


def test_load_figures_a_member_does_not_give_show_as_not_said_not_as_defaults():
    # A follower or an older revision leaves figures out; the typed reading fills defaults (0, 0.0)
    # that status must not show as if the member had said them.
    follower = _node({"ready": True, "state": "ready", "rank": 1, "load": {"queue_depth": 2}})
    assert status._load(follower) == ("2", "-", "-/-", "-")
    no_timeout = _node({"ready": True, "state": "ready", "rank": 0, "load": {"wait_s": 3, "running": 1}})
    assert status._load(no_timeout) == ("-", "-", "1/-", "-")
    assert status._load(_node({"ready": True, "state": "ready", "rank": 0})) == ("-", "-", "-", "-")


def test_a_ready_body_that_cannot_be_read_shows_as_unreadable_not_a_crash():
    bad = _node({"ready": True, "state": "ready", "rank": 0, "load": {"queue_depth": [1]}})
    assert bad.report is None and bad.state == "unreadable"
    assert bad.unreadable is not None and "load.queue_depth" in bad.unreadable
    assert status._load(bad) == ("-", "-", "-", "-")
    unit = bare_unit(nodes=[bad])
    assert any("ready body cannot be read" in p and "load.queue_depth" in p for p in unit.problems())
    console = Console(record=True, width=300)
    status.render([unit], console)
    assert "unreadable" in console.export_text()
