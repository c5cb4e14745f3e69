"""Helpers for router tests: run a scenario on a fresh event loop, start routers over stand-in units.

A plain module, not conftest.py: test modules import it by name, and a second conftest module would
clash with the other suites' conftest files on sys.path.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import aiohttp

from runtime.router.discovery import StaticDiscovery
from runtime.router.proxy import Router
from runtime.router.settings import RouterSettings

SCENARIO_TIMEOUT_S = 60


def run(coro, timeout: float = SCENARIO_TIMEOUT_S):
    """Run one async scenario, bounded so a bug cannot hang the suite."""

    async def bounded():
        return await asyncio.wait_for(coro, timeout)

    return asyncio.run(bounded())


def fast_settings(**overrides) -> RouterSettings:
    base = dict(
        host="127.0.0.1",
        port=0,
        metrics_port=0,
        units=("http://127.0.0.1:1",),
        poll_interval_s=0.05,
        poll_timeout_s=0.5,
        discovery_interval_s=0.1,
        drain_grace_s=0.0,
        connect_timeout_s=0.5,
        first_byte_timeout_s=5.0,
        idle_stream_timeout_s=5.0,
    )
    base.update(overrides)
    # Stand-ins share the router's event loop here: a busy test machine delays their lines.
    base.setdefault("stale_after_s", max(1.0, 3 * float(base["poll_interval_s"])))
    return RouterSettings(**base)


@contextlib.asynccontextmanager
async def router_over(units, discovery=None, admission=None, access=None, **overrides):
    """A started Router in front of the given stand-in units, waited until they are routable."""
    urls = tuple(u.url for u in units)
    settings = fast_settings(units=urls or ("http://127.0.0.1:1",), **overrides)
    router = Router(
        settings=settings, discovery=discovery or StaticDiscovery(units=urls), admission=admission, access=access
    )
    await router.start()
    try:
        await wait_for(lambda: router.fleet.routable_count() == sum(u.state == "ready" for u in units))
        yield router
    finally:
        await router.close()


async def wait_for(predicate, timeout: float = 10.0, interval: float = 0.01, what: str = "the condition") -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(interval)


def rss_kib(pid: int) -> int:
    """Resident memory of a process, from /proc (what the overload tests watch)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for pid {pid}")


def base_url(router: Router) -> str:
    return f"http://127.0.0.1:{router.port}"


def metrics_url(router: Router) -> str:
    """The router's /metrics, on its own port (never the public one)."""
    return router.metrics_server.url


async def post(
    session: aiohttp.ClientSession,
    router: Router,
    payload: dict | None = None,
    headers: dict | None = None,
    path: str = "/v1/completions",
):
    payload = payload or {"model": "tiny", "prompt": "hi", "max_tokens": 3}
    async with session.post(base_url(router) + path, json=payload, headers=headers) as resp:
        return resp.status, resp.headers.copy(), await resp.read()
