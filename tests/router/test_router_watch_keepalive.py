"""What a router asks each watched leader for: a line within --change-report of a change and, when
nothing changed, a heartbeat every --keepalive. Heartbeats say only "still alive", and each is a
socket read for the router (625 leaders every 0.25 s were 2,500 reads a second), so they come at
half the silence bound (--stale-after) rather than every poll interval."""

from __future__ import annotations

from router_standins import StandInUnit
from router_testkit import run, wait_for

from runtime.router.discovery import StaticDiscovery
from runtime.router.fleet import Fleet
from runtime.router.settings import RouterSettings


def _watch_query(**settings: float) -> dict[str, str]:
    async def scenario():
        unit = await StandInUnit(name="u0").start()
        fleet = None
        try:
            config = RouterSettings(units=(unit.url,), **settings)
            fleet = Fleet(settings=config, discovery=StaticDiscovery(units=(unit.url,)))
            await fleet.start()
            await wait_for(lambda: unit.watch_queries, what="the router's watch")
            return unit.watch_queries[0]
        finally:
            if fleet is not None:
                await fleet.close()
            await unit.stop()

    return run(scenario())


def test_a_router_asks_for_heartbeats_every_keepalive_and_changes_within_the_change_report():
    assert _watch_query() == {"interval": "0.375", "changes": "0.05"}  # the defaults: silent after 0.75 s
    assert _watch_query(keepalive_s=0.2, stale_after_s=2.0) == {"interval": "0.2", "changes": "0.05"}
