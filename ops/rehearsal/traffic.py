"""Steady load through the router and a watch on its rotation, for the rehearsal.

Clients send completions in a loop, half of them streamed (all, for long answers); a request counts
as served when it ends as a client expects (200 and a body, or every SSE chunk up to [DONE]) and as
failed otherwise. The watch reads the router's /health (`routable_units`: ready leaders it would route to) every 50 ms.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

import aiohttp

import contract
from ops.rehearsal.ecs import Clock

WATCH_EVERY_S = 0.05


@dataclass(frozen=True)
class Failure:
    at: float  # emulated seconds
    what: str


@dataclass
class Traffic:
    router_url: str
    model: str
    clock: Clock
    clients: int = 4
    max_tokens: int = 8
    stream_all: bool = False  # every client streams (long answers: what a drain may hand over)
    served: int = 0
    answering: int = 0  # requests whose response has begun and not yet ended
    failures: list[Failure] = field(default_factory=list)
    revisions: dict[str, int] = field(default_factory=dict)  # responses per serving revision
    # Once this many requests are served, clients start no new one (those open still end): the
    # rehearsal's last requests are known, and none starts only to be waited for (a long answer
    # started as the last one ended would add its whole length to the run).
    enough: int | None = None

    async def _one(self, session: aiohttp.ClientSession, stream: bool, n: int) -> None:
        body = {"model": self.model, "prompt": f"rehearsal request {n}: ", "max_tokens": self.max_tokens}
        if stream:
            body["stream"] = True
        try:
            async with session.post(f"{self.router_url}/v1/completions", json=body) as r:
                self.answering += 1
                try:
                    text = await r.text()
                finally:
                    self.answering -= 1
                revision = r.headers.get(contract.REVISION_HEADER, "?")
                if r.status != 200:
                    self.failures.append(Failure(self.clock.now(), f"HTTP {r.status}: {text[:160]}"))
                elif stream and not text.rstrip().endswith("data: [DONE]"):
                    self.failures.append(Failure(self.clock.now(), f"stream cut before [DONE]: {text[-160:]!r}"))
                elif not stream and "choices" not in json.loads(text):
                    self.failures.append(Failure(self.clock.now(), f"no choices: {text[:160]}"))
                else:
                    self.served += 1
                    self.revisions[revision] = self.revisions.get(revision, 0) + 1
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            self.failures.append(Failure(self.clock.now(), f"{type(e).__name__}: {e}"))

    async def run(self, stop: asyncio.Event) -> None:
        timeout = aiohttp.ClientTimeout(total=60)
        async with aiohttp.ClientSession(timeout=timeout) as session:

            async def client(i: int) -> None:
                n = 0
                while not stop.is_set() and (self.enough is None or self.served < self.enough):
                    await self._one(session, stream=self.stream_all or i % 2 == 1, n=n)
                    n += 1
                    await asyncio.sleep(0.02)

            await asyncio.gather(*(client(i) for i in range(self.clients)))


@dataclass
class RotationWatch:
    """The router's count of units in rotation over time: (emulated seconds, units) per change."""

    router_url: str
    clock: Clock
    samples: list[tuple[float, int]] = field(default_factory=list)
    unanswered: int = 0

    async def run(self, stop: asyncio.Event) -> None:
        timeout = aiohttp.ClientTimeout(total=1.0)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while not stop.is_set():
                try:
                    async with session.get(self.router_url + contract.ROUTER_HEALTH_PATH) as r:
                        units = int((await r.json()).get("routable_units", 0))
                    self.samples.append((self.clock.now(), units))
                except (aiohttp.ClientError, TimeoutError, ValueError):
                    self.unanswered += 1
                await asyncio.sleep(WATCH_EVERY_S)

    def between(self, start: float, end: float) -> list[tuple[float, int]]:
        return [(t, n) for t, n in self.samples if start <= t <= end]

    def timeline(self, start: float, end: float) -> list[tuple[float, int]]:
        """Only the changes: (when, units) each time the count moved."""
        out: list[tuple[float, int]] = []
        for t, n in self.between(start, end):
            if not out or out[-1][1] != n:
                out.append((t, n))
        return out

    def below(self, floor: int, start: float, end: float) -> float:
        """Emulated seconds the count spent below floor (each sample stands until the next)."""
        window = self.between(start, end)
        return sum(t2 - t1 for (t1, n), (t2, _) in zip(window, window[1:]) if n < floor)
