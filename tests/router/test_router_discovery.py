"""Discovery of unit leaders (static list, units file, Cloud Map) and the router's settings checks."""

from __future__ import annotations

import boto3
import pytest
from moto import mock_aws

import contract
from router_testkit import router_over, run, wait_for
from router_standins import StandInUnit
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


@mock_aws
def test_cloudmap_discovery_returns_unit_leaders_at_their_ip_and_api_port():
    sd = boto3.client("servicediscovery", region_name="us-east-1")
    sd.create_http_namespace(Name="flotilla")
    ns_id = sd.list_namespaces()["Namespaces"][0]["Id"]
    svc_id = sd.create_service(Name="units", NamespaceId=ns_id)["Service"]["Id"]
    for i, (role, ip, unit) in enumerate([("leader", "10.0.1.5", "cell0-unit0"),
                                          ("follower", "10.0.1.6", "cell0-unit0"),
                                          ("leader", "10.0.2.7", "cell0-unit1")]):
        sd.register_instance(ServiceId=svc_id, InstanceId=f"i-{i}", Attributes={
            "AWS_INSTANCE_IPV4": ip, contract.ATTR_ROLE: role, contract.ATTR_UNIT: unit,
            contract.ATTR_REVISION: "3"})
    found = CloudMapDiscovery(namespace="flotilla", service="units", client=sd).discover()
    port = contract.NODE_API_PORT
    assert sorted((e.url, e.unit, e.revision) for e in found) == [
        (f"http://10.0.1.5:{port}", "cell0-unit0", "3"), (f"http://10.0.2.7:{port}", "cell0-unit1", "3")]
    sd.deregister_instance(ServiceId=svc_id, InstanceId="i-0")
    again = CloudMapDiscovery(namespace="flotilla", service="units", client=sd).discover()
    assert [e.unit for e in again] == ["cell0-unit1"]


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
