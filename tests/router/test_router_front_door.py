"""Only the API through the front door: requests sent through the synthesized listener rules
(tests/front_door.py) to a real router over stand-in units. The API and the health check reach the
router; /metrics and every other path get the ALB's own 404 and never reach a router. And the router
serves no metrics on its public port, whatever path a request takes there."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import aiohttp
import pytest
from front_door import FrontDoor, listener_on
from router_standins import StandInUnit
from router_testkit import base_url, metrics_url, router_over, run

import contract

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "stacks"))
from synth_helpers import FRONT_DOORS, config_with, synthesize  # noqa: E402

# Paths a client might try for what the routers know: the metrics, the units' health, the root.
NOT_THE_API = ("/metrics", "/metrics?format=/v1/x", "/health/ready", "/health/watch", "/", "/V1/models", "/v1")


@pytest.fixture(scope="module", params=list(FRONT_DOORS))
def production_listener(request, tmp_path_factory):
    """The production listener of each shipped front door: HTTP on 80 without a certificate, HTTPS
    on 443 with one."""
    config = config_with(**FRONT_DOORS[request.param])
    template = synthesize(config, tmp_path_factory.mktemp("front-door")).template("Front")
    return listener_on(template, 443 if config.certificate_arn else 80)


async def through(door: FrontDoor, path: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as s:
        async with s.get(door.url + path, allow_redirects=False) as r:
            return r.status, await r.text()


def test_metrics_and_every_other_non_api_path_get_the_albs_404_and_never_reach_a_router(production_listener):
    async def scenario():
        unit = await StandInUnit(name="u").start()
        try:
            async with router_over([unit]) as router, FrontDoor(production_listener, base_url(router)) as door:
                answers = {path: await through(door, path) for path in NOT_THE_API}
                return answers, door.forwarded
        finally:
            await unit.stop()

    answers, forwarded = run(scenario())
    assert forwarded == []
    for path, (status, body) in answers.items():
        assert (status, body) == (404, "no route"), path
        assert "flotilla_router" not in body


def test_the_api_and_the_health_check_reach_the_router(production_listener):
    async def scenario():
        unit = await StandInUnit(name="u").start()
        try:
            async with router_over([unit]) as router, FrontDoor(production_listener, base_url(router)) as door:
                models = await through(door, "/v1/models")
                health = await through(door, contract.ROUTER_HEALTH_PATH)
                return models, health, door.forwarded
        finally:
            await unit.stop()

    (models_status, models), (health_status, health), forwarded = run(scenario())
    assert forwarded == ["/v1/models", contract.ROUTER_HEALTH_PATH]
    assert models_status == 200 and '"object": "list"' in models.replace('":"', '": "')
    assert health_status == 200 and '"status": "ok"' in health.replace('":"', '": "')


async def raw_get(port: int, path: str) -> tuple[int, bytes]:
    """GET `path` exactly as written (no client-side folding of `..` or decoding)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
    await writer.drain()
    response = await reader.read()
    writer.close()
    return int(response.split(b" ", 2)[1]), response


def test_the_routers_public_port_serves_no_metrics_by_any_path_and_its_metrics_port_does():
    """A request that reaches the public port by any route (a path the ALB forwards that the router
    folds to /metrics, an encoded one) finds no metrics there; the metrics port has them."""

    async def scenario():
        unit = await StandInUnit(name="u").start()
        try:
            async with router_over([unit]) as router:
                public = {
                    path: await raw_get(router.port, path)
                    for path in ("/metrics", "/v1/../metrics", "/v1/%2e%2e/metrics", "/v1/..%2fmetrics")
                }
                async with aiohttp.ClientSession() as s, s.get(metrics_url(router)) as r:
                    metrics = r.status, await r.text()
                return public, metrics, router.metrics_server.host
        finally:
            await unit.stop()

    public, (status, metrics), host = run(scenario())
    for path, (code, response) in public.items():
        assert code == 404 and b"flotilla_router" not in response, (path, code)
    assert status == 200 and "flotilla_router_routable_units 1.0" in metrics
    assert host == "127.0.0.1"  # loopback by default: only the router's own task or host can scrape it
