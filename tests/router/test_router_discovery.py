"""Discovery of unit members (static list, units file, Cloud Map as ECS registers them), routing to
leaders only, and the router's settings checks."""

from __future__ import annotations

import aiohttp
import boto3
import pytest
from moto import mock_aws
from router_standins import StandInUnit
from router_testkit import base_url, post, router_over, run, wait_for

import contract
from runtime.router.discovery import CloudMapDiscovery, DiscoveryError, StaticDiscovery
from runtime.router.settings import RouterSettings, SettingsError


def test_units_file_changes_add_and_remove_units_without_a_restart(tmp_path):
    async def scenario():
        a, b = [await StandInUnit(name=n).start() for n in ("a", "b")]
        units_file = tmp_path / "units.txt"
        units_file.write_text(f"# leaders\n{a.url}\n")
        discovery = StaticDiscovery(units_file=str(units_file))
        async with router_over([a], discovery=discovery) as router:
            assert set(router.fleet.units) == {a.url}
            units_file.write_text(f"{a.url}\n{b.url}\n")
            await wait_for(lambda: router.fleet.routable_count() == 2)
            units_file.write_text(f"{b.url}\n")
            await wait_for(lambda: set(router.fleet.units) == {b.url})
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


def units_service(sd) -> str:
    """The Cloud Map layout the Discovery stack creates: an HTTP namespace with a `units` service."""
    sd.create_http_namespace(Name="flotilla")
    ns_id = sd.list_namespaces()["Namespaces"][0]["Id"]
    return sd.create_service(Name="units", NamespaceId=ns_id)["Service"]["Id"]


def register_like_ecs(sd, svc_id: str, instance_id: str, ip: str, ecs_service: str, port: int | None = None):
    """What ECS writes for a task: its address and ECS service, no custom attributes (no role)."""
    attrs = {contract.CLOUDMAP_ATTR_IPV4: ip, contract.CLOUDMAP_ATTR_ECS_SERVICE: ecs_service}
    if port is not None:
        attrs[contract.CLOUDMAP_ATTR_PORT] = str(port)
    sd.register_instance(ServiceId=svc_id, InstanceId=instance_id, Attributes=attrs)


@mock_aws
def test_cloudmap_discovery_returns_every_member_ecs_registered_at_its_ip_and_port():
    sd = boto3.client("servicediscovery", region_name="us-east-1")
    svc_id = units_service(sd)
    register_like_ecs(sd, svc_id, "t-0", "10.0.1.5", "cell0-unit0")
    register_like_ecs(sd, svc_id, "t-1", "10.0.1.6", "cell0-unit0")
    register_like_ecs(sd, svc_id, "t-2", "10.0.2.7", "cell0-unit1", port=8123)
    found = CloudMapDiscovery(namespace="flotilla", service="units", client=sd).discover()
    port = contract.NODE_API_PORT
    assert sorted((e.url, e.unit) for e in found) == [
        (f"http://10.0.1.5:{port}", "cell0-unit0"),
        (f"http://10.0.1.6:{port}", "cell0-unit0"),
        ("http://10.0.2.7:8123", "cell0-unit1"),
    ]
    sd.deregister_instance(ServiceId=svc_id, InstanceId="t-0")
    again = CloudMapDiscovery(namespace="flotilla", service="units", client=sd).discover()
    assert sorted(e.url for e in again) == [f"http://10.0.1.6:{port}", "http://10.0.2.7:8123"]


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
            discovery = CloudMapDiscovery(namespace="flotilla", service="units", client=sd)
            async with router_over(leaders, discovery=discovery) as router:
                assert set(router.fleet.units) == {m.url for m in members}
                await wait_for(lambda: all(m.polls for m in members))
                states = {u.url: (u.role, u.state, u.routable) for u in router.fleet.units.values()}
                assert states == {
                    m.url: ("leader", "ready", True) if m.rank == 0 else ("follower", "follower", False)
                    for m in members
                }
                async with aiohttp.ClientSession() as session:
                    answers = [await post(session, router) for _ in range(8)]
                    async with session.get(base_url(router) + contract.METRICS_PATH) as r:
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
            routable = lambda: {u.url for u in router.fleet.units.values() if u.routable}  # noqa: E731
            assert routable() == {a.url}
            a.rank, b.rank = 1, 0  # the unit re-formed with the other member as rank 0
            await wait_for(lambda: routable() == {b.url})
            assert router.fleet.units[a.url].state == "follower"
        await a.stop()
        await b.stop()

    run(scenario())


@mock_aws
def test_cloudmap_discovery_failure_names_the_namespace_and_service():
    sd = boto3.client("servicediscovery", region_name="us-east-1")
    with pytest.raises(DiscoveryError, match="missing-ns/units"):
        CloudMapDiscovery(namespace="missing-ns", service="units", client=sd).discover()


def test_settings_reject_a_unit_that_is_not_a_base_url():
    with pytest.raises(SettingsError, match="http://host:port"):
        RouterSettings(units=("10.0.0.1",))


def test_settings_require_cloudmap_namespace_and_service():
    with pytest.raises(SettingsError, match=contract.ENV_CLOUDMAP_NAMESPACE):
        RouterSettings(discovery="cloudmap", cloudmap_service="units")


def test_settings_reject_an_out_of_range_poll_interval():
    with pytest.raises(SettingsError, match="poll_interval_s=0.0"):
        RouterSettings(units=("http://127.0.0.1:8000",), poll_interval_s=0.0)
