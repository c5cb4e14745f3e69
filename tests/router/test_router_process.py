"""The router as a real process (`python -m runtime router`): SIGTERM drain and bounded memory under
overload. Units here are stand-ins (test doubles) running in the test's event loop."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import aiohttp
from router_standins import StandInUnit
from router_testkit import rss_kib, run, wait_for

from runtime.router.settings import router_command

REPO = Path(__file__).resolve().parents[2]


async def start_router_process(**settings: Any) -> tuple[asyncio.subprocess.Process, str]:
    argv = router_command(
        host="127.0.0.1", port=0, metrics_port=0, poll_interval_s=0.05, log_level="WARNING", **settings
    )
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    line = await asyncio.wait_for(proc.stdout.readline(), 20)
    if not line.startswith(b"router listening on "):
        proc.kill()
        raise AssertionError(f"router did not start: {line!r} {await proc.stderr.read()!r}")
    return proc, line.decode().split()[-1]


async def wait_routable(session: aiohttp.ClientSession, url: str, count: int) -> None:
    async def routable() -> int:
        async with session.get(url + "/health") as r:
            return (await r.json())["routable_units"]

    for _ in range(1000):
        if await routable() == count:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"router at {url} never saw {count} routable unit(s)")


def test_sigterm_fails_health_at_once_finishes_in_flight_streams_and_exits_0():
    async def scenario():
        a = await StandInUnit(name="a").start()
        a.gate = asyncio.Event()
        proc, url = await start_router_process(units=[a.url], drain_grace_s=0.3)
        try:
            async with aiohttp.ClientSession() as s:
                await wait_routable(s, url, 1)
                resp = await s.post(url + "/v1/completions", json={"prompt": "x", "stream": True})
                first = await resp.content.readuntil(b"\n\n")
                proc.send_signal(signal.SIGTERM)
                health = None
                for _ in range(200):  # /health must turn 503 before the drain grace ends
                    async with s.get(url + "/health") as h:
                        if h.status == 503:
                            health = h.status
                            break
                    await asyncio.sleep(0.01)
                a.gate.set()
                rest = await resp.read()
                resp.close()
            code = await asyncio.wait_for(proc.wait(), 20)
        finally:
            if proc.returncode is None:
                proc.kill()
            await a.stop()
        assert health == 503
        assert b"tok0" in first and rest.endswith(b"data: [DONE]\n\n")
        assert code == 0

    run(scenario())


def test_router_process_rejects_bad_settings_with_a_message_naming_them():
    async def scenario():
        proc = await asyncio.create_subprocess_exec(
            *router_command(units=["10.0.0.1:8000"]),
            cwd=REPO,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "FLOTILLA_UNITS": ""},
        )
        _, err = await asyncio.wait_for(proc.communicate(), 20)
        return proc.returncode, err.decode()

    code, err = run(scenario())
    assert code == 2 and "10.0.0.1:8000" in err and "http://host:port" in err


def test_overload_is_shed_with_429_and_router_memory_stays_bounded():
    async def scenario():
        a = await StandInUnit(name="a").start()
        a.gate = asyncio.Event()  # the unit holds every request it accepts
        # The stand-in shares this loop with 400 concurrent clients: give its health answer time.
        proc, url = await start_router_process(
            units=[a.url],
            max_outstanding_per_unit=4,
            poll_timeout_s=10,
            stale_after_s=10,
            drain_grace_s=0,  # the SIGTERM below only ends the test: nothing watches /health through a grace
        )
        try:
            connector = aiohttp.TCPConnector(limit=200)
            async with aiohttp.ClientSession(connector=connector) as s:
                await wait_routable(s, url, 1)

                async def one():
                    async with s.post(url + "/v1/completions", json={"prompt": "x" * 2000}) as r:
                        await r.read()
                        return r.status

                held = [asyncio.create_task(one()) for _ in range(4)]
                await wait_for(lambda: a.active == 4)
                statuses = await asyncio.gather(*(one() for _ in range(400)))
                rss_after_first = rss_kib(proc.pid)
                for _ in range(4):
                    statuses += await asyncio.gather(*(one() for _ in range(400)))
                rss_after_all = rss_kib(proc.pid)
                a.gate.set()
                held_statuses = await asyncio.gather(*held)
            proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(proc.wait(), 20)
        finally:
            if proc.returncode is None:
                proc.kill()
            await a.stop()
        assert set(statuses) == {429} and len(statuses) == 2000
        assert held_statuses == [200] * 4 and a.max_active == 4
        # 1,600 more refused requests must not grow the router: nothing is queued.
        assert rss_after_all - rss_after_first < 8 * 1024, (rss_after_first, rss_after_all)

    run(scenario())
