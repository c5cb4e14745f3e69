"""Overload on one local unit (two nodes, the tiny model, behind the router): 24 long streams fill the
batch (16 running, the rest queued), 20 short requests arrive meanwhile. Every short request is
answered within 2 s, served or refused with 429 + Retry-After, never 503; the unit never leaves
rotation; and a request right after the long streams end is served at once."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest
from localmode import LocalMode

import contract

pytestmark = pytest.mark.timeout(240)

LONG_STREAMS = 24
LONG_TOKENS = 300  # long enough that the batch stays full for seconds on any machine we run on
SHORT_REQUESTS = 20
# A short queue timeout: a request the unit admits is answered within it plus a few tokens, so the
# 2 s bound below holds for served and refused requests alike; a full unit must refuse the rest.
QUEUE_TIMEOUT_S = "1"
ANSWER_BOUND_S = 2.0


def routable_units(metrics: str) -> float:
    line = next(x for x in metrics.splitlines() if x.startswith("flotilla_router_routable_units "))
    return float(line.split()[1])


@pytest.mark.whole_machine  # a unit, the router and 44 streams on them
def test_a_full_unit_refuses_short_requests_at_once_with_429_and_stays_in_rotation(tmp_path):
    local = LocalMode(tmp_path, env={"FLOTILLA_QUEUE_TIMEOUT_S": QUEUE_TIMEOUT_S})
    try:
        local.wait_ready(timeout=180)
        asyncio.run(asyncio.wait_for(_overload(local.url, local.metrics_url()), 120))
    finally:
        local.kill()


async def _overload(url: str, metrics_url: str) -> None:
    timeout = aiohttp.ClientTimeout(total=90)
    async with aiohttp.ClientSession(timeout=timeout) as s:
        started = [0]  # long streams that have produced tokens

        async def long_stream() -> int:
            body = {"model": "tiny", "prompt": "long", "max_tokens": LONG_TOKENS, "ignore_eos": True, "stream": True}
            async with s.post(url + "/v1/completions", json=body) as r:
                if r.status != 200:
                    # Past the batch a long stream may itself be refused at once: busy, never broken.
                    assert r.status == 429 and int(r.headers["Retry-After"]) >= 1, r.status
                    return r.status
                chunks, counted = 0, False
                async for line in r.content:
                    chunks += line.startswith(b"data: {")
                    if chunks >= 2 and not counted:
                        counted = True
                        started[0] += 1
                return r.status

        async def short(i: int) -> tuple[int, dict, bytes, float]:
            t0 = time.monotonic()
            body = {"model": "tiny", "prompt": f"short {i}", "max_tokens": 4}
            async with s.post(url + "/v1/completions", json=body) as r:
                return r.status, dict(r.headers), await r.read(), time.monotonic() - t0

        async def routable() -> float:
            async with s.get(metrics_url) as r:
                return routable_units(await r.text())

        longs = [asyncio.create_task(long_stream()) for _ in range(LONG_STREAMS)]
        deadline = time.monotonic() + 60
        while started[0] < 16:  # the batch is full (16 slots, the default --max-running)
            assert time.monotonic() < deadline, f"only {started[0]} long streams started within 60 s"
            await asyncio.sleep(0.05)

        answers, in_rotation = [], []
        for i in range(SHORT_REQUESTS):
            answers.append(await short(i))
            in_rotation.append(await routable())
            await asyncio.sleep(0.05)
        long_statuses = await asyncio.gather(*longs)
        t0 = time.monotonic()
        after = await short(-1)
        after_s = time.monotonic() - t0

    assert long_statuses.count(200) >= 16  # the batch was full
    statuses = [status for status, _, _, _ in answers]
    assert set(statuses) <= {200, 429}, statuses  # busy is never 503
    assert 429 in statuses  # the batch was full: some were refused, at once
    for status, headers, body, took in answers:
        assert took < ANSWER_BOUND_S, (status, took)
        if status == 429:
            assert int(headers["Retry-After"]) >= 1
            assert json.loads(body)["error"]["code"] in ("overloaded", *contract.BUSY_CODES)
    assert in_rotation == [1.0] * SHORT_REQUESTS  # the busy unit never left rotation
    assert after[0] == 200 and after_s < ANSWER_BOUND_S
