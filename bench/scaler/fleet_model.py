"""The fleet as the scaler benchmark models it (SimPy): units of batch slots behind a router, started
with a cold start, drained through the hand-over, released after a delay.

Each choice is a stated assumption, not a measurement (docs/benchmarks.md, "Scaling"):
- A unit has `slots` batch slots. A request holds one from admission to its last token: its prompt
  is prefilled first, one prompt at a time per unit at `prefill_tokens_per_s` (a prompt waits for the
  prefills ahead of it), then it decodes at `decode_tokens_per_s`. Its time to first token is its
  wait for a slot plus its wait for the prefill plus its own prefill. No prefix cache.
- The router sends a request to the least loaded (running + queued) of `sample` units drawn at
  random from those in rotation (the shipped router's least-work choice samples 8 units:
  docs/routing.md); when that unit would make it wait past `queue_timeout_s` for a slot (queue
  ahead x mean service / slots), the request is refused with 429.
- A unit the controller starts serves after `cold_start_s`. A unit it drains leaves rotation at
  once; its queued requests go to other units, its running ones are handed over at their next
  token (the prompt and the tokens so far prefilled again on the new unit, the rest decoded there);
  a hand-over the other units refuse is a request dropped by scale-in. The unit counts as draining
  for `drain_s` (its leader hands over and exits, ECS stops its tasks), and its instances cost until
  `release_s` after the hand-over.
- The controller runs every `pass_s`; it sees the units' load as reported `report_s` earlier, the
  request rate and the 429s of the last minute, and the p99 time to first token of the last
  minute's requests. Network hops take no time.
"""

from __future__ import annotations

import math
import random
from array import array
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol, cast

import numpy as np
import simpy

from bench.scaler.day import Requests


@dataclass(frozen=True)
class UnitModel:
    slots: int = 16  # the node's default --max-running
    prefill_tokens_per_s: float = 6000.0
    decode_tokens_per_s: float = 20.0
    queue_timeout_s: float = 25.0  # the node's default --queue-timeout
    cold_start_s: float = 600.0
    drain_s: float = 30.0
    release_s: float = 120.0
    sample: int = 8
    pass_s: float = 60.0
    report_s: float = 60.0


class Request:
    __slots__ = ("arrival", "ctx", "gen", "first", "decode_from", "attempt", "unit", "minute", "recorded")

    def __init__(self, arrival: float, ctx: int, gen: int, minute: int) -> None:
        self.arrival, self.ctx, self.gen, self.minute = arrival, ctx, gen, minute
        self.first: float | None = None  # when its first token reached the client
        self.decode_from = 0.0  # when its current unit started decoding it
        self.attempt = 0  # bumped when it leaves a unit: the old completion event is then stale
        self.unit: Unit | None = None
        self.recorded = False  # its time to first token is counted (once its first token has surely come)


class Unit:
    __slots__ = ("uid", "state", "running", "queue", "prefill_free", "held", "created", "released", "index")

    def __init__(self, uid: str, created: float) -> None:
        self.uid = uid
        self.state = "pending"  # pending -> active -> draining -> releasing -> released
        self.running = 0
        self.queue: deque[Request] = deque()
        self.prefill_free = 0.0
        self.held: set[Request] = set()
        self.created = created
        self.released: float | None = None
        self.index = -1  # position in Fleet.routable while active


@dataclass(frozen=True)
class Snapshot:
    """What a controller sees at a pass."""

    now: float
    # Every unit in rotation now: (unit, running, queued, wait_s) as reported report_s ago (zeros for a
    # unit that joined since: the routers have not reported it yet, and a new unit is empty).
    loads: tuple[tuple[str, int, int, float], ...]
    pending: int
    draining: int
    request_rate: float
    busy_rate: float
    ttft_p99_s: float | None
    rate_history: tuple[tuple[float, float], ...]


class Controller(Protocol):
    name: str

    def step(self, snap: Snapshot) -> tuple[int, list[str]]: ...


@dataclass
class Outcome:
    ttft_by_minute: dict[int, array] = field(default_factory=dict)
    refused_by_minute: dict[int, int] = field(default_factory=dict)
    arrived_by_minute: dict[int, int] = field(default_factory=dict)
    moved: int = 0
    dropped_by_scale_in: int = 0
    units: list[Unit] = field(default_factory=list)
    timeline: list[tuple[float, int, int, int]] = field(default_factory=list)  # (t, active, pending, draining)
    directions: list[tuple[float, str]] = field(default_factory=list)  # (t, up|down) of each change


class Fleet:
    def __init__(self, env: simpy.Environment, model: UnitModel, mean_service_s: float, seed: int) -> None:
        self.env, self.model = env, model
        self.mean_service_s = mean_service_s
        self.rng = random.Random(seed)
        self.routable: list[Unit] = []
        self.units: dict[str, Unit] = {}
        self.out = Outcome()
        self._next_uid = 0
        self._reported: dict[str, tuple[str, int, int, float]] = {}
        self._rates: deque[tuple[float, float]] = deque(maxlen=11)

    # --- units ------------------------------------------------------------------------------------
    def start_unit(self, *, warm: bool = False) -> Unit:
        uid = f"u{self._next_uid:04d}"
        self._next_uid += 1
        unit = Unit(uid, self.env.now)
        self.units[uid] = unit
        self.out.units.append(unit)
        if warm:
            self._activate(unit)
        else:
            self.env.timeout(self.model.cold_start_s, unit).callbacks.append(lambda ev: self._activate(ev.value))
        return unit

    def _activate(self, unit: Unit) -> None:
        if unit.state != "pending":
            return
        unit.state = "active"
        unit.index = len(self.routable)
        self.routable.append(unit)

    def _leave_rotation(self, unit: Unit) -> None:
        last = self.routable.pop()
        if last is not unit:
            self.routable[unit.index] = last
            last.index = unit.index
        unit.index = -1

    def drain(self, uid: str) -> None:
        unit = self.units.get(uid)
        if unit is None or unit.state != "active":
            return
        unit.state = "draining"
        self._leave_rotation(unit)
        queued, unit.queue = list(unit.queue), deque()
        for req in queued:
            self.route(req)
        now = self.env.now
        for req in list(unit.held):
            req.attempt += 1
            unit.running -= 1
            if req.first is not None and req.first <= now:
                self._record(req)
                done = min(req.gen - 1, int((now - req.decode_from) * self.model.decode_tokens_per_s))
                req.ctx += done
                req.gen -= done
                self.out.moved += 1
                if not self.route(req, handover=True):
                    self.out.dropped_by_scale_in += 1
            else:  # still in its prefill: nothing reached the client, it starts again elsewhere
                req.first = None
                self.route(req)
        unit.held.clear()
        self.env.timeout(self.model.drain_s, unit).callbacks.append(self._drained)
        self.env.timeout(self.model.release_s, unit).callbacks.append(self._release)

    def _drained(self, ev: simpy.Event) -> None:
        unit = cast(Unit, ev.value)
        if unit.state == "draining":
            unit.state = "releasing"

    def _release(self, ev: simpy.Event) -> None:
        unit = cast(Unit, ev.value)
        unit.state = "released"
        unit.released = self.env.now
        del self.units[unit.uid]

    # --- requests ---------------------------------------------------------------------------------
    def route(self, req: Request, *, handover: bool = False) -> bool:
        """Send the request to a unit; False when refused (429) or no unit is in rotation."""
        units = self.routable
        n = len(units)
        if n == 0:
            self._refuse(req, handover)
            return False
        rnd = self.rng.random
        best = units[int(rnd() * n)]
        best_load = best.running + len(best.queue)
        for _ in range(min(self.model.sample, n) - 1):
            u = units[int(rnd() * n)]
            load = u.running + len(u.queue)
            if load < best_load:
                best, best_load = u, load
        m = self.model
        if best.running >= m.slots and (len(best.queue) + 1) * self.mean_service_s / m.slots > m.queue_timeout_s:
            self._refuse(req, handover)
            return False
        req.unit = best
        if best.running < m.slots:
            self._start(best, req)
        else:
            best.queue.append(req)
        return True

    def _refuse(self, req: Request, handover: bool) -> None:
        if not handover:  # a refused hand-over is counted as dropped by its caller
            self.out.refused_by_minute[req.minute] = self.out.refused_by_minute.get(req.minute, 0) + 1

    def _start(self, unit: Unit, req: Request) -> None:
        now = self.env.now
        unit.running += 1
        unit.held.add(req)
        begin = unit.prefill_free if unit.prefill_free > now else now
        first = begin + req.ctx / self.model.prefill_tokens_per_s
        unit.prefill_free = first
        if req.first is None:
            req.first = first
        req.decode_from = first
        done = first + req.gen / self.model.decode_tokens_per_s - now
        ev = self.env.timeout(done, (req, req.attempt))
        ev.callbacks.append(self._done)

    def _done(self, ev: simpy.Event) -> None:
        req, attempt = cast(tuple[Request, int], ev.value)
        if attempt != req.attempt:
            return  # handed over since: another unit finishes it
        self._record(req)
        unit = cast(Unit, req.unit)
        unit.running -= 1
        unit.held.discard(req)
        if unit.queue:
            self._start(unit, unit.queue.popleft())

    def _record(self, req: Request) -> None:
        if req.recorded or req.first is None:
            return
        req.recorded = True
        ttft = self.out.ttft_by_minute.get(req.minute)
        if ttft is None:
            ttft = self.out.ttft_by_minute[req.minute] = array("d")
        ttft.append(req.first - req.arrival)

    # --- processes --------------------------------------------------------------------------------
    def arrivals(self, reqs: Requests, chunk: int = 200_000):
        env = self.env
        arrived = self.out.arrived_by_minute
        for lo in range(0, len(reqs), chunk):
            times = reqs.arrival[lo : lo + chunk].tolist()
            ctxs = reqs.ctx[lo : lo + chunk].tolist()
            gens = reqs.gen[lo : lo + chunk].tolist()
            for t, c, g in zip(times, ctxs, gens):
                if t > env.now:
                    yield env.timeout(t - env.now)
                minute = int(t // 60)
                arrived[minute] = arrived.get(minute, 0) + 1
                self.route(Request(t, c, g, minute))

    def control(self, controller: Controller, until: float):
        env, m = self.env, self.model
        while env.now < until:
            yield env.timeout(m.pass_s)
            snap = self._snapshot()
            add, remove = controller.step(snap)
            if add:
                self.out.directions.append((env.now, "up"))
                for _ in range(add):
                    self.start_unit()
            if remove:
                self.out.directions.append((env.now, "down"))
                for uid in remove:
                    self.drain(uid)
            counts = self._counts()
            self.out.timeline.append((env.now, *counts))

    def _counts(self) -> tuple[int, int, int]:
        states = [u.state for u in self.units.values()]
        return states.count("active"), states.count("pending"), states.count("draining")

    def _snapshot(self) -> Snapshot:
        now, m = self.env.now, self.model
        minute = int(now // 60) - 1
        arrived = self.out.arrived_by_minute.get(minute, 0)
        refused = self.out.refused_by_minute.get(minute, 0)
        rate = arrived / 60.0
        self._rates.append((now, rate))
        ttfts = self.out.ttft_by_minute.get(minute)
        p99 = float(np.quantile(np.frombuffer(ttfts, dtype=np.float64), 0.99)) if ttfts else None
        previous = self._reported
        # What the routers report now is what the controller sees at the next pass (report_s later).
        self._reported = {u.uid: (u.uid, u.running, len(u.queue), self._wait(u)) for u in self.routable}
        seen = self._reported if m.report_s <= 0 else previous
        reported = tuple(seen.get(u.uid, (u.uid, 0, 0, 0.0)) for u in self.routable)
        _, pending, draining = self._counts()
        return Snapshot(
            now=now,
            loads=reported,
            pending=pending,
            draining=draining,
            request_rate=rate,
            busy_rate=refused / 60.0,
            ttft_p99_s=p99,
            rate_history=tuple(self._rates),
        )

    def _wait(self, unit: Unit) -> float:
        if unit.running < self.model.slots:
            return 0.0
        return (len(unit.queue) + 1) * self.mean_service_s / self.model.slots


def mean_service_s(reqs: Requests, model: UnitModel) -> float:
    return float(np.mean(reqs.ctx) / model.prefill_tokens_per_s + np.mean(reqs.gen) / model.decode_tokens_per_s)


def required_units(reqs: Requests, model: UnitModel, occupancy: float, start_s: float, end_s: float) -> np.ndarray:
    """Units a fleet needs each minute to hold the most requests that overlap in any second of it at
    `occupancy` of their slots, had every request started at once (the oracle's sizing)."""
    service = reqs.ctx / model.prefill_tokens_per_s + reqs.gen / model.decode_tokens_per_s
    first = int(start_s)
    span = int(end_s) - first + int(service.max()) + 2
    delta = np.zeros(span + 1, dtype=np.int64)
    np.add.at(delta, (reqs.arrival - first).astype(np.int64), 1)
    np.add.at(delta, (reqs.arrival + service - first).astype(np.int64) + 1, -1)
    concurrent = np.cumsum(delta)[: int(end_s) - first]
    minutes = len(concurrent) // 60
    peak = concurrent[: minutes * 60].reshape(minutes, 60).max(axis=1)
    return np.ceil(peak / (model.slots * occupancy)).astype(np.int64)


def unit_hours(units: list[Unit], lo: float, hi: float) -> float:
    """Unit-hours paid between lo and hi: each unit from its start to its release."""
    total = 0.0
    for u in units:
        end = u.released if u.released is not None else hi
        total += max(0.0, min(end, hi) - max(u.created, lo))
    return total / 3600


def minutes_within(out: Outcome, target_s: float, lo: float, hi: float) -> tuple[int, int]:
    """(minutes whose p99 time to first token, refusals counted as never answered, is within target_s;
    minutes with requests) over [lo, hi)."""
    good = total = 0
    for minute in range(int(lo // 60), int(hi // 60)):
        arrived = out.arrived_by_minute.get(minute, 0)
        if not arrived:
            continue
        total += 1
        refused = out.refused_by_minute.get(minute, 0)
        ttfts = out.ttft_by_minute.get(minute)
        served = np.frombuffer(ttfts, dtype=np.float64) if ttfts else np.zeros(0)
        # The 99th percentile over the minute's requests with every refusal as an infinite wait.
        rank = math.ceil(0.99 * arrived)
        if arrived - refused < rank:
            continue
        if np.partition(served, rank - 1)[rank - 1] <= target_s if len(served) >= rank else False:
            good += 1
    return good, total


def reversals(directions: list[tuple[float, str]], within_s: float) -> int:
    """Changes of direction closer than within_s to the change before."""
    count = 0
    for (t0, d0), (t1, d1) in zip(directions, directions[1:]):
        if d0 != d1 and t1 - t0 < within_s:
            count += 1
    return count
