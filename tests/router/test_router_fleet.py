"""A router over a fleet: 200 stand-in units of 2 members (bench/fleet/standin.py) registered in moto's
Cloud Map as ECS registers them (bench/fleet/cloudmap.py), plus ready units that are not registered.

What a fleet needs of the router: it finds every unit through the per-cell services, watches leaders
only and never asks a follower once its leader vouches for it, spreads requests over the units,
sends nothing to followers or to units outside the fleet, and stops sending to a unit that dies or
turns unready."""

from __future__ import annotations

import asyncio
import collections
import contextlib

import aiohttp
import boto3
from moto import mock_aws
from router_testkit import base_url, fast_settings, run, wait_for

import contract
from bench.fleet.cloudmap import documented_cloud_map, ecs_attributes
from bench.fleet.standin import close_fleet, start_fleet
from runtime.router.discovery import CloudMapDiscovery
from runtime.router.proxy import Router

UNITS, NODES, PER_CELL = 200, 2, 20


def register(sd, fleet) -> tuple[str, ...]:
    sd.create_http_namespace(Name="flotilla.internal")
    ns = sd.list_namespaces()["Namespaces"][0]["Id"]
    services: dict[str, str] = {}
    for unit in fleet.units:
        if unit.decoy:
            continue
        name = f"{contract.CLOUDMAP_UNITS_SERVICE_PREFIX}{unit.cell}"
        if name not in services:
            services[name] = sd.create_service(Name=name, NamespaceId=ns)["Service"]["Id"]
        for m in unit.members:
            sd.register_instance(
                ServiceId=services[name],
                InstanceId=f"task-{unit.name}-{m.rank}",
                Attributes=ecs_attributes(
                    ip="127.0.0.1",
                    port=m.port,
                    ecs_service=unit.ecs_service,
                    cluster=f"flotilla-{unit.cell}",
                    task_family=f"flotilla-{unit.name}",
                    instance_id=f"i-{unit.name}-{m.rank}",
                    az="us-east-1a",
                ),
            )
    return tuple(services)


@contextlib.asynccontextmanager
async def router_over(fleet):
    """A started router that finds the fleet's registered units in moto's Cloud Map, and their services."""
    with mock_aws(), documented_cloud_map(seed=5):
        sd = boto3.client("servicediscovery", region_name="us-east-1")
        services = register(sd, fleet)
        # The stand-ins answer from the router's own event loop: on a busy machine (a CI worker beside
        # torch processes) a slow loop delays their lines and their accepts as much as the router's
        # reading, and a leader judged silent or unreachable has its watch dropped and its followers
        # asked again. Silence and refused connections have their own tests (test_router_routing.py);
        # here every change is a closed stream or a watch line.
        settings = fast_settings(
            poll_interval_s=0.25, stale_after_s=10.0, connect_timeout_s=5.0, discovery_interval_s=0.5
        )
        discovery = CloudMapDiscovery(namespace="flotilla.internal", services=services, client=sd)
        router = Router(settings=settings, discovery=discovery)
        await router.start()
        try:
            yield router, services
        finally:
            await router.close()


def test_a_router_routes_across_200_units_it_found_in_cloud_map_and_never_to_anything_else():
    async def scenario():
        fleet, ticker = await start_fleet(units=UNITS, nodes=NODES, units_per_cell=PER_CELL, decoys=3, latency_ms=2)
        by_name = {u.name: u for u in fleet.units}
        try:
            async with router_over(fleet) as (router, services):
                assert len(services) == 10
                assert len(router.fleet.members) == UNITS * NODES
                await wait_for(lambda: router.fleet.routable_count() == UNITS, timeout=30, what="200 routable")
                # Once every leader vouches for its follower nobody asks the followers again.
                followers = [u for u in router.fleet.members.values() if u.role != "leader"]
                await wait_for(
                    lambda: all(u.vouched_by is not None for u in followers),
                    timeout=10,
                    what="every follower vouched for",
                )
                polls = dict(router.fleet.polls)
                follower_polls = sum(m.polls for u in fleet.units for m in u.members[1:])

                async with aiohttp.ClientSession() as s:

                    async def one() -> int:
                        async with s.post(base_url(router) + "/v1/completions", json={"prompt": "x"}) as r:
                            await r.read()
                            return r.status

                    statuses = []
                    for _ in range(40):
                        statuses += await asyncio.gather(*(one() for _ in range(20)))
                    assert statuses == [200] * 800
                    served = {u.name for u in fleet.units if u.arrivals}
                    assert len(served) >= 150  # spread, not herded onto a few
                    assert not any(u.arrivals for u in fleet.units if u.decoy)
                    assert sum(m.api_requests for u in fleet.units for m in u.members[1:]) == 0
                    states = collections.Counter(u.state for u in router.fleet.members.values() if u.role == "leader")
                    assert router.fleet.polls["follower"] == polls["follower"], (dict(router.fleet.polls), states)
                    assert sum(m.polls for u in fleet.units for m in u.members[1:]) == follower_polls, states

                    # One unit's process dies, another turns unready: once the router has seen
                    # each (a closed stream, a watch line), no new request reaches either.
                    dead, sick = by_name["cell3-unit4"], by_name["cell7-unit11"]
                    await fleet.kill(dead, "exit")
                    await fleet.kill(sick, "unready")
                    urls = {u.unit: u for u in router.fleet.members.values() if u.role == "leader"}
                    await wait_for(
                        lambda: not urls[dead.name].routable and not urls[sick.name].routable,
                        timeout=10,
                        what="the router to stop routing to both",
                    )
                    seen = len(sick.arrivals)
                    statuses = []
                    for _ in range(20):
                        statuses += await asyncio.gather(*(one() for _ in range(20)))
                    assert statuses == [200] * 400
                    assert len(sick.arrivals) == seen
                    assert [kind for _, kind in dead.tombstone if kind == "api"] == []
        finally:
            await close_fleet(fleet, ticker)

    run(scenario(), timeout=120)


def test_a_router_reads_the_stand_in_fleets_prompts_and_marks_as_a_units_and_keeps_every_unit_routable():
    """The fleet benchmark's busy fleet lists completion prompts with their marks in its watch lines, as
    a leader does (runtime/node/server.py): the router must read them as it reads a unit's, or the
    benchmark would time the path of unreadable lines (a unit marked unready) instead of this one."""

    async def scenario():
        fleet, ticker = await start_fleet(units=20, nodes=2, units_per_cell=20, latency_ms=2, seed=9)
        try:
            async with router_over(fleet) as (router, _):
                await wait_for(lambda: router.fleet.routable_count() == 20, timeout=30, what="20 routable")
                fleet.prompt_share, fleet.changes_per_s = 0.5, 40.0
                await wait_for(lambda: sum(u.keys_seen for u in fleet.units) >= 400, timeout=30, what="keys")
                fleet.changes_per_s = 0.0
                listed = {p[0][0]: p for u in fleet.units for p in u.prompts if p is not None}
                keys = {k for u in fleet.units for k in u.keys}
                assert 0 < len(listed) < len(keys)  # about half the admitted requests are prompts
                await wait_for(
                    lambda: len(router.fleet.holders) == len(keys) and len(router.fleet.prompts) == len(listed),
                    timeout=10,
                    what="every listed key and prompt read",
                )
                for key, (entry, marks) in listed.items():
                    _, length, tokens, tail = entry
                    assert router.fleet.prompts._prompts.get(key) == (length, tokens, tail, tuple(marks))
                assert router.fleet.routable_count() == 20  # no line was unreadable
        finally:
            await close_fleet(fleet, ticker)

    run(scenario(), timeout=120)
