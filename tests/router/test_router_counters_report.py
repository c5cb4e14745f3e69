"""The router's refusal counters on stdout (CloudWatch Logs through the log driver): how an operator
reads per-key 429s and 401s and sheds on AWS, where the metrics port is loopback only. One line per
counter series that moved, with how much it moved since the previous report."""

from __future__ import annotations

import json

import aiohttp
from router_standins import StandInUnit
from router_testkit import post, router_over, run, wait_for

from contract.apikeys import KeyEntry, KeySet, digest, new_key
from runtime.router.access import AccessControl
from runtime.router.counters_report import EVENT


def test_each_report_logs_what_each_key_and_refusal_counter_gained_since_the_last_one(capsys):
    kid, key = new_key()
    entry = KeyEntry(name="batch-job", sha256=digest(key), requests_per_s=1.0)

    async def scenario():
        unit = await StandInUnit(name="u").start()
        access = AccessControl(read=lambda: KeySet({kid: entry}).dumps(), ttl_s=60)
        lines: list[dict] = []

        def collect() -> list[dict]:
            out = capsys.readouterr().out
            lines.extend(r for r in map(json.loads, out.splitlines()) if r.get("event") == EVENT)
            return lines

        async with router_over([unit], access=access, ready_units_interval_s=0.1) as router:
            async with aiohttp.ClientSession() as s:
                answers = [await post(s, router, headers={"Authorization": f"Bearer {key}"}) for _ in range(4)]
                missing = await post(s, router)
            await wait_for(lambda: any(r["metric"].endswith("auth_failures_total") for r in collect()))
            first = list(lines)
            # Nothing new: the next reports carry no counter lines (deltas, not totals).
            await wait_for(lambda: router.fleet.routable_count() == 1)
            capsys.readouterr()
            await wait_for(lambda: '"unit_states"' in (out := capsys.readouterr().out) and EVENT not in out)
        await unit.stop()
        return answers, missing, first

    answers, missing, lines = run(scenario())
    statuses = [status for status, _, _ in answers]
    limited = statuses.count(429)
    assert statuses[0] == 200 and limited >= 1 and missing[0] == 401
    by_series = {(r["metric"], r.get("key_id"), r.get("outcome"), r.get("reason")): r["delta"] for r in lines}
    assert by_series[("flotilla_router_key_requests_total", kid, "rate_limited", None)] == limited
    assert by_series[("flotilla_router_key_requests_total", kid, "admitted", None)] == 4 - limited
    assert by_series[("flotilla_router_auth_failures_total", None, None, "missing")] == 1
