"""Helpers for router tests: run a scenario on a fresh event loop, start routers over stand-in units.

A plain module, not conftest.py: test modules import it by name, and a second conftest module would
clash with the other suites' conftest files on sys.path.
"""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp

from runtime.router.discovery import StaticDiscovery
from runtime.router.proxy import Router
from runtime.router.settings import RouterSettings

SCENARIO_TIMEOUT_S = 60


def run(coro):
    """Run one async scenario, bounded so a bug cannot hang the suite."""
    async def bounded():
        return await asyncio.wait_for(coro, SCENARIO_TIMEOUT_S)
    return asyncio.run(bounded())


def fast_settings(**overrides) -> RouterSettings:
    base = dict(host="127.0.0.1", port=0, units=("http://127.0.0.1:1",), poll_interval_s=0.05,
                poll_timeout_s=0.5, discovery_interval_s=0.1, drain_grace_s=0.0,
                connect_timeout_s=0.5, first_byte_timeout_s=5.0, idle_stream_timeout_s=5.0)
    base.update(overrides)
    return RouterSettings(**base)


@contextlib.asynccontextmanager
async def router_over(units, discovery=None, **overrides):
    """A started Router in front of the given stand-in units, waited until they are routable."""
    urls = tuple(u.url for u in units)
    settings = fast_settings(units=urls or ("http://127.0.0.1:1",), **overrides)
    router = Router(settings=settings, discovery=discovery or StaticDiscovery(units=urls))
    await router.start()
    try:
        await wait_for(lambda: router.fleet.routable_count() == sum(u.state == "ready" for u in units))
        yield router
    finally:
        await router.close()


async def wait_for(predicate, timeout: float = 10.0, interval: float = 0.01) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        await asyncio.sleep(interval)


def base_url(router: Router) -> str:
    return f"http://127.0.0.1:{router.port}"


async def post(session: aiohttp.ClientSession, router: Router, payload: dict | None = None,
               headers: dict | None = None, path: str = "/v1/completions"):
    payload = payload or {"model": "tiny", "prompt": "hi", "max_tokens": 3}
    async with session.post(base_url(router) + path, json=payload, headers=headers) as resp:
        return resp.status, resp.headers.copy(), await resp.read()
