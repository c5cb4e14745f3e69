"""Bounded waits on a unit that also end as soon as the unit left routing for a failure: the wait
for a first byte and for each next chunk of a stream."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from runtime.router.fleet import Fleet, Member
from runtime.router.settings import RouterSettings

# Member states whose leader hands its requests over itself (a drain: runtime/node/server.py), so a
# request waiting on such a unit is left to it.
HANDS_OVER = frozenset({"draining", "stopped"})


class UnitLeft(Exception):
    """The unit a request waits on left routing for a failure (see Departure)."""


class Departure:
    """Whether the unit a request waits on left routing for a failure (silent, unreachable, its
    engine stalled, broken) and stayed out for grace_s, while another unit is routable: a unit whose
    report was merely late is back at its next line and keeps the request, and with no other unit to
    go to, waiting for this one is the request's best chance."""

    __slots__ = ("member", "fleet", "grace_s", "since")

    def __init__(self, member: Member, fleet: Fleet, grace_s: float) -> None:
        self.member = member
        self.fleet = fleet
        self.grace_s = grace_s
        self.since: float | None = None  # loop time it was first seen out

    def gone(self, now: float) -> bool:
        u = self.member
        if u.ready or u.state in HANDS_OVER:
            self.since = None
            return False
        if self.since is None:
            self.since = now
        return now - self.since >= self.grace_s and self.fleet.routable_count() > 0


class Wait:
    """A bounded wait (asyncio.timeout) that, given a departure watch, also ends as soon as its unit
    left routing for a failure: it looks every `period` seconds and then fires the timeout at once,
    with `left` set. The awaited call is cancelled like on any timeout, which closes the unit's
    connection; the wait itself stays a plain await (no task in between), so a chunk reaches the
    client as soon as it arrives."""

    __slots__ = ("_timeout", "_departure", "_period", "_handle", "left")

    def __init__(self, timeout_s: float, departure: Departure | None, period: float) -> None:
        self._timeout = asyncio.timeout(timeout_s)
        self._departure = departure
        self._period = period
        self._handle: asyncio.TimerHandle | None = None
        self.left = False

    async def __aenter__(self) -> Wait:
        await self._timeout.__aenter__()
        if self._departure is not None:
            self._handle = asyncio.get_running_loop().call_later(self._period, self._look)
        return self

    def _look(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._departure is not None
        if self._timeout.expired():  # it fired in this same loop turn: nothing left to cut short
            return
        if self._departure.gone(loop.time()):
            self.left = True
            # A deadline now: the timeout fires at the loop's next turn, as any asyncio.timeout does
            # (https://docs.python.org/3.11/library/asyncio-task.html#asyncio.Timeout.reschedule).
            self._timeout.reschedule(loop.time())
        else:
            self._handle = loop.call_later(self._period, self._look)

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self._handle is not None:
            self._handle.cancel()
        await self._timeout.__aexit__(exc_type, exc, tb)  # raises TimeoutError when it fired


def watch_period(settings: RouterSettings) -> float:
    """How often a wait looks whether its unit left routing: a few times per grace period."""
    return max(0.05, settings.stale_after_s / 3)


async def next_chunk(content: aiohttp.StreamReader, quiet: float, departure: Departure | None, period: float) -> bytes:
    """The next piece of a unit's body within `quiet` seconds (TimeoutError past it); with a
    departure watch, UnitLeft once the unit left routing for a failure with nothing arriving."""
    waiting = Wait(quiet, departure, period)
    try:
        async with waiting:
            chunk = await content.readany()
    except TimeoutError:
        if waiting.left:
            raise UnitLeft from None
        raise
    if departure is not None:
        departure.since = None  # it spoke: out of routing or not, it is not hung
    return chunk
