"""Discovery of unit members (static list, units file, Cloud Map as ECS registers them), routing to
leaders only, and the router's settings checks."""

from __future__ import annotations

import aiohttp
import boto3
import pytest
from moto import mock_aws
from router_standins import StandInUnit
from router_testkit import metrics_url, post, router_over, run, wait_for

import contract
from bench.fleet.cloudmap import documented_cloud_map, ecs_attributes
from runtime.router.discovery import CloudMapDiscovery, DiscoveryError, StaticDiscovery
from runtime.router.settings import RouterSettings, SettingsError


def test_units_file_changes_add_and_remove_units_without_a_restart(tmp_path):
    async def scenario():
        a, b = [await StandInUnit(name=n).start() for n in ("a", "b")]
        units_file = tmp_path / "units.txt"
        units_file.write_text(f"# leaders\n{a.url}\n")
        discovery = StaticDiscovery(units_file=str(units_file))
        async with router_over([a], discovery=discovery) as router:
            assert set(router.fleet.members) == {a.url}
            units_file.write_text(f"{a.url}\n{b.url}\n")
            await wait_for(lambda: router.fleet.routable_count() == 2)
            units_file.write_text(f"{b.url}\n")
            await wait_for(lambda: set(router.fleet.members) == {b.url})
        await a.stop()
        await b.stop()

    run(scenario())


def test_unreadable_units_file_keeps_the_last_known_units(tmp_path):
    async def scenario():
        a = await StandInUnit(name="a").start()
        units_file = tmp_path / "units.txt"
        units_file.write_text(a.url)
        async with router_over([a], discovery=StaticDiscovery(units_file=str(units_file))) as router:
            units_file.unlink()
            errors = router.fleet.discovery_errors
            await wait_for(lambda: router.fleet.discovery_errors > errors)
            assert router.fleet.routable_count() == 1
        await a.stop()

    run(scenario())


def test_static_discovery_reports_a_missing_units_file_by_name(tmp_path):
    with pytest.raises(DiscoveryError, match="units.txt"):
        StaticDiscovery(units_file=str(tmp_path / "units.txt")).discover()


CELL0 = f"{contract.CLOUDMAP_UNITS_SERVICE_PREFIX}cell0"


def cell_services(sd, cells: int = 1, namespace: str = "flotilla") -> dict[str, str]:
    """The Cloud Map layout the Discovery stack creates: an HTTP namespace with one service per cell."""
    sd.create_http_namespace(Name=namespace)
    ns_id = next(n["Id"] for n in sd.list_namespaces()["Namespaces"] if n["Name"] == namespace)
    names = [f"{contract.CLOUDMAP_UNITS_SERVICE_PREFIX}cell{c}" for c in range(cells)]
    return {n: sd.create_service(Name=n, NamespaceId=ns_id)["Service"]["Id"] for n in names}


def units_service(sd) -> str:
    return cell_services(sd)[CELL0]


def register_like_ecs(sd, svc_id: str, instance_id: str, ip: str, ecs_service: str, port: int | None = None):
    """What ECS writes for a task: its address and ECS service, no custom attributes (no role)."""
    attrs = ecs_attributes(
        ip=ip,
        port=port,
        ecs_service=ecs_service,
        cluster="flotilla-cell0",
        task_family=f"flotilla-{ecs_service}",
        instance_id=f"i-{instance_id}",
        az="us-east-1a",
    )
    sd.register_instance(ServiceId=svc_id, InstanceId=instance_id, Attributes=attrs)


@mock_aws
def test_cloudmap_discovery_returns_every_member_ecs_registered_at_its_ip_and_port():
    sd = boto3.client("servicediscovery", region_name="us-east-1")
    svc_id = units_service(sd)
    register_like_ecs(sd, svc_id, "t-0", "10.0.1.5", "cell0-unit0")
    register_like_ecs(sd, svc_id, "t-1", "10.0.1.6", "cell0-unit0")
    register_like_ecs(sd, svc_id, "t-2", "10.0.2.7", "cell0-unit1", port=8123)
    found = CloudMapDiscovery(namespace="flotilla", services=(CELL0,), client=sd).discover()
    port = contract.NODE_API_PORT
    assert sorted((e.url, e.unit) for e in found) == [
        (f"http://10.0.1.5:{port}", "cell0-unit0"),
        (f"http://10.0.1.6:{port}", "cell0-unit0"),
        ("http://10.0.2.7:8123", "cell0-unit1"),
    ]
    sd.deregister_instance(ServiceId=svc_id, InstanceId="t-0")
    again = CloudMapDiscovery(namespace="flotilla", services=(CELL0,), client=sd).discover()
    assert sorted(e.url for e in again) == [f"http://10.0.1.6:{port}", "http://10.0.2.7:8123"]


def register_fleet(sd, services: dict[str, str], *, units_per_cell: int, nodes: int) -> set[str]:
    """Every member of every unit, registered in its cell's service as ECS would; their URLs."""
    urls = set()
    for c, (name, svc_id) in enumerate(services.items()):
        for u in range(units_per_cell):
            for n in range(nodes):
                ip = f"10.{c}.{u}.{n + 10}"
                register_like_ecs(sd, svc_id, f"t-{c}-{u}-{n}", ip, f"flotilla-cell{c}-unit{u}")
                urls.add(f"http://{ip}:{contract.NODE_API_PORT}")
    return urls


@mock_aws
def test_discovery_finds_every_member_of_a_fleet_larger_than_one_service_holds():
    """160 units x 8 nodes = 1,280 members (the 20,480-chip example): one service per cell of 20
    units keeps each service at 160, and the router reads all eight."""
    with documented_cloud_map(seed=1):
        sd = boto3.client("servicediscovery", region_name="us-east-1")
        services = cell_services(sd, cells=8)
        urls = register_fleet(sd, services, units_per_cell=20, nodes=8)
        found = CloudMapDiscovery(namespace="flotilla", services=tuple(services), client=sd).discover()
    assert len(urls) == 1280
    assert {e.url for e in found} == urls


@mock_aws
def test_one_service_cannot_hold_more_than_1000_members_and_discover_returns_at_most_1000():
    """Why one service per cell: Cloud Map refuses the 1,001st instance of a service, and
    DiscoverInstances, which has no pagination, returns at most 1,000 (100 unless asked)."""
    with documented_cloud_map(seed=2):
        sd = boto3.client("servicediscovery", region_name="us-east-1")
        svc_id = units_service(sd)
        for i in range(1000):
            register_like_ecs(sd, svc_id, f"t-{i}", f"10.0.{i // 250}.{i % 250}", "u")
        with pytest.raises(sd.exceptions.ResourceLimitExceeded):
            register_like_ecs(sd, svc_id, "t-1000", "10.0.9.9", "u")
        assert len(sd.discover_instances(NamespaceName="flotilla", ServiceName=CELL0)["Instances"]) == 100
        full = sd.discover_instances(NamespaceName="flotilla", ServiceName=CELL0, MaxResults=1000)["Instances"]
        assert len(full) == 1000


class CountingClient:
    """A Cloud Map client that counts calls per operation and service, and can fail one service or
    refuse one operation (with the error botocore would raise)."""

    def __init__(self, sd) -> None:
        self._sd = sd
        self.calls: list[tuple[str, str]] = []
        self.failing: set[str] = set()
        self.refusing: dict[str, Exception] = {}

    def _call(self, op: str, **kwargs):
        self.calls.append((op, kwargs["ServiceName"]))
        if kwargs["ServiceName"] in self.failing:
            raise RuntimeError(f"{kwargs['ServiceName']} is throttled")
        if op in self.refusing:
            raise self.refusing[op]
        return getattr(self._sd, op)(**kwargs)

    def discover_instances(self, **kwargs):
        return self._call("discover_instances", **kwargs)

    def discover_instances_revision(self, **kwargs):
        return self._call("discover_instances_revision", **kwargs)


@mock_aws
def test_a_pass_reads_again_only_the_services_whose_revision_moved():
    with documented_cloud_map(seed=3):
        sd = boto3.client("servicediscovery", region_name="us-east-1")
        services = cell_services(sd, cells=3)
        register_fleet(sd, services, units_per_cell=2, nodes=2)
        client = CountingClient(sd)
        discovery = CloudMapDiscovery(namespace="flotilla", services=tuple(services), client=client)
        assert len(discovery.discover()) == 12
        reads = lambda: sorted(svc for op, svc in client.calls if op == "discover_instances")  # noqa: E731
        assert reads() == sorted(services)
        client.calls.clear()
        assert len(discovery.discover()) == 12
        assert reads() == []  # nothing moved: three revision checks, no instance read
        cell1 = f"{contract.CLOUDMAP_UNITS_SERVICE_PREFIX}cell1"
        register_like_ecs(sd, services[cell1], "t-new", "10.1.9.9", "flotilla-cell1-unit9")
        client.calls.clear()
        found = {e.url for e in discovery.discover()}
        assert reads() == [cell1]
        assert f"http://10.1.9.9:{contract.NODE_API_PORT}" in found and len(found) == 13


@mock_aws
def test_a_service_that_fails_keeps_its_last_members_while_the_others_update():
    with documented_cloud_map(seed=4):
        sd = boto3.client("servicediscovery", region_name="us-east-1")
        services = cell_services(sd, cells=2)
        register_fleet(sd, services, units_per_cell=1, nodes=2)
        client = CountingClient(sd)
        discovery = CloudMapDiscovery(namespace="flotilla", services=tuple(services), client=client)
        before = {e.url for e in discovery.discover()}
        cell0, cell1 = services
        client.failing.add(cell0)
        register_like_ecs(sd, services[cell1], "t-new", "10.1.9.9", "flotilla-cell1-unit9")
        after = {e.url for e in discovery.discover()}
    assert after == before | {f"http://10.1.9.9:{contract.NODE_API_PORT}"}


def test_router_over_cloudmap_routes_only_to_the_members_that_lead():
    """Two units of two members each, registered as ECS does (no role attribute): the router polls
    all four, and only rank 0 of each takes requests; one unit's members report a role, the other's
    only their rank."""

    async def scenario():
        members = [
            await StandInUnit(name=f"cell0-unit{u}", rank=r, cell="cell0", report_role=(u == 0)).start()
            for u in (0, 1)
            for r in (0, 1)
        ]
        leaders = [m for m in members if m.rank == 0]
        with mock_aws():
            sd = boto3.client("servicediscovery", region_name="us-east-1")
            svc_id = units_service(sd)
            for i, m in enumerate(members):
                register_like_ecs(sd, svc_id, f"t-{i}", "127.0.0.1", m.name, port=m.port)
            discovery = CloudMapDiscovery(namespace="flotilla", services=(CELL0,), client=sd)
            async with router_over(leaders, discovery=discovery) as router:
                assert set(router.fleet.members) == {m.url for m in members}
                await wait_for(lambda: all(m.polls for m in members))
                states = {u.url: (u.role, u.state, u.routable) for u in router.fleet.members.values()}
                assert states == {
                    m.url: ("leader", "ready", True) if m.rank == 0 else ("follower", "follower", False)
                    for m in members
                }
                async with aiohttp.ClientSession() as session:
                    answers = [await post(session, router) for _ in range(8)]
                    async with session.get(metrics_url(router)) as r:
                        metrics = await r.text()
                assert [status for status, _, _ in answers] == [200] * 8
                assert sum(len(m.received) for m in leaders) == 8
                assert all(not m.received for m in members if m.rank != 0)
                assert metrics.count('state="follower"') == 2
        for m in members:
            await m.stop()

    run(scenario())


def test_when_leadership_moves_to_another_member_the_router_follows_it():
    async def scenario():
        a = await StandInUnit(name="u", rank=0).start()
        b = await StandInUnit(name="u", rank=1).start()
        async with router_over([a], discovery=StaticDiscovery(units=(a.url, b.url))) as router:
            routable = lambda: {u.url for u in router.fleet.members.values() if u.routable}  # noqa: E731
            assert routable() == {a.url}
            a.rank, b.rank = 1, 0  # the unit re-formed with the other member as rank 0
            await wait_for(lambda: routable() == {b.url})
            assert router.fleet.members[a.url].state == "follower"
        await a.stop()
        await b.stop()

    run(scenario())


@mock_aws
def test_cloudmap_discovery_failure_names_the_namespace_and_service():
    sd = boto3.client("servicediscovery", region_name="us-east-1")
    with pytest.raises(DiscoveryError, match=f"missing-ns/{CELL0}"):
        CloudMapDiscovery(namespace="missing-ns", services=(CELL0,), client=sd).discover()


def test_settings_reject_a_unit_that_is_not_a_base_url():
    with pytest.raises(SettingsError, match="http://host:port"):
        RouterSettings(units=("10.0.0.1",))


def test_settings_require_cloudmap_namespace_and_service():
    with pytest.raises(SettingsError, match=contract.ENV_CLOUDMAP_NAMESPACE):
        RouterSettings(discovery="cloudmap", cloudmap_services=(CELL0,))


def test_settings_reject_an_out_of_range_poll_interval():
    with pytest.raises(SettingsError, match="poll_interval_s=0.0"):
        RouterSettings(units=("http://127.0.0.1:8000",), poll_interval_s=0.0)


def test_metrics_show_what_health_costs_watched_leaders_lines_and_polls_by_role():
    async def scenario():
        leader = await StandInUnit(name="u", rank=0).start()
        follower = await StandInUnit(name="u", rank=1).start()
        leader.members = [{"rank": 1, "address": f"127.0.0.1:{follower.port}", "state": "ready", "ready": True}]
        async with router_over([leader], discovery=StaticDiscovery(units=(leader.url, follower.url))) as router:
            await wait_for(lambda: router.fleet.members[follower.url].vouched_by is not None, what="vouched")
            async with aiohttp.ClientSession() as session:
                async with session.get(metrics_url(router)) as r:
                    text = await r.text()
        await leader.stop()
        await follower.stop()
        assert "flotilla_router_watched_leaders 1.0" in text
        assert 'flotilla_router_health_polls_total{role="unknown"} 2.0' in text  # each member asked once
        assert "flotilla_router_watch_lines_total" in text

    run(scenario())


def revision_refused(
    sd,
    code: str = "AccessDeniedException",
    message: str = "not authorized to perform: servicediscovery:DiscoverInstancesRevision",
) -> CountingClient:
    """A client whose DiscoverInstancesRevision fails with `code` and `message`. A role without the
    permission gets IAM's refusal, which botocore raises for a JSON-protocol service as a ClientError
    with code AccessDeniedException."""
    from botocore.exceptions import ClientError

    client = CountingClient(sd)
    error = {"Code": code, "Message": message}
    client.refusing["discover_instances_revision"] = ClientError({"Error": error}, "DiscoverInstancesRevision")
    return client


# The refusal is told by its code alone: the message is free text, and one that names no refusal
# still comes with AccessDeniedException.
@pytest.mark.parametrize(
    "message",
    ["not authorized to perform: servicediscovery:DiscoverInstancesRevision", "request could not be authorized"],
)
@mock_aws
def test_a_role_refused_discover_instances_revision_reads_every_service_in_full_and_stops_asking(message):
    with documented_cloud_map(seed=5):
        sd = boto3.client("servicediscovery", region_name="us-east-1")
        services = cell_services(sd, cells=2)
        urls = register_fleet(sd, services, units_per_cell=1, nodes=2)
        client = revision_refused(sd, message=message)
        discovery = CloudMapDiscovery(namespace="flotilla", services=tuple(services), client=client)
        assert {e.url for e in discovery.discover()} == urls
        asked = [op for op, _ in client.calls if op == "discover_instances_revision"]
        assert asked == ["discover_instances_revision"]  # refused once: not asked for the second service
        client.calls.clear()
        cell1 = f"{contract.CLOUDMAP_UNITS_SERVICE_PREFIX}cell1"
        register_like_ecs(sd, services[cell1], "t-new", "10.1.9.9", "flotilla-cell1-unit9")
        found = {e.url for e in discovery.discover()}
        assert f"http://10.1.9.9:{contract.NODE_API_PORT}" in found  # a full read sees the change
        assert sorted(op for op, _ in client.calls) == ["discover_instances", "discover_instances"]


# Another code is no refusal, even when its message mentions AccessDenied.
@pytest.mark.parametrize("message", ["Rate exceeded", "AccessDenied checks are throttled"])
@mock_aws
def test_another_error_of_discover_instances_revision_is_a_failed_pass_not_a_fallback(message):
    with documented_cloud_map(seed=6):
        sd = boto3.client("servicediscovery", region_name="us-east-1")
        services = cell_services(sd, cells=1)
        register_fleet(sd, services, units_per_cell=1, nodes=2)
        throttled = revision_refused(sd, code="ThrottlingException", message=message)
        discovery = CloudMapDiscovery(namespace="flotilla", services=tuple(services), client=throttled)
        with pytest.raises(DiscoveryError, match="DiscoverInstancesRevision.*ThrottlingException"):
            discovery.discover()
        assert discovery.calls["DiscoverInstances"] == 0
