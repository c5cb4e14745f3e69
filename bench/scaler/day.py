"""One simulated day of requests for the scaler benchmark: a stated diurnal curve, an announced surge
(booked ahead as a scheduled minimum), an unannounced spike, and request lengths drawn from the Azure
LLM inference trace (2023, conversation service: traces/README.md).

The curve (all stated, none measured): the rate follows a raised cosine from `trough` x peak at
`peak_hour` - 12 h to the peak at `peak_hour`; from `surge_start_h` for `surge_hours` it is
`surge_factor` times that; from `spike_start_h` for `spike_minutes` it is `spike_factor` times it.
Arrivals are Poisson within each second at that second's rate (numpy, seeded).
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass

import numpy as np

from traces import open_trace

AZURE_CONV = "azure-conv"  # traces/README.md: one hour of an Azure conversation service, 2023
DAY_S = 86_400


@dataclass(frozen=True)
class Day:
    peak_rate: float = 120.0  # requests/s at the diurnal peak
    trough: float = 0.25  # the night's rate as a share of the peak
    peak_hour: float = 20.0
    surge_start_h: float = 11.0  # announced and booked: a scheduled minimum covers it
    surge_hours: float = 2.0
    surge_factor: float = 5.0
    spike_start_h: float = 17.0  # unannounced
    spike_minutes: float = 15.0
    spike_factor: float = 2.0
    start_h: float = 0.0  # the simulated span: [start_h, start_h + hours)
    hours: float = 24.0
    seed: int = 1

    @property
    def start_s(self) -> float:
        return self.start_h * 3600

    @property
    def end_s(self) -> float:
        return (self.start_h + self.hours) * 3600

    @property
    def surge(self) -> tuple[float, float]:
        start = self.surge_start_h * 3600
        return start, start + self.surge_hours * 3600

    @property
    def spike(self) -> tuple[float, float]:
        start = self.spike_start_h * 3600
        return start, start + self.spike_minutes * 60

    def diurnal(self, t: float) -> float:
        phase = 2 * math.pi * ((t / 3600 - self.peak_hour + 12) % 24) / 24
        return self.peak_rate * (self.trough + (1 - self.trough) * (1 - math.cos(phase)) / 2)

    def rate(self, t: float) -> float:
        r = self.diurnal(t)
        lo, hi = self.surge
        if lo <= t < hi:
            r *= self.surge_factor
        lo, hi = self.spike
        if lo <= t < hi:
            r *= self.spike_factor
        return r


def trace_lengths(name: str = AZURE_CONV) -> tuple[np.ndarray, np.ndarray]:
    """(ContextTokens, GeneratedTokens) of every request of the trace, in file order."""
    ctx: list[int] = []
    gen: list[int] = []
    with open_trace(name) as f:
        for row in csv.DictReader(f):
            ctx.append(int(row["ContextTokens"]))
            gen.append(max(1, int(row["GeneratedTokens"])))
    return np.asarray(ctx, dtype=np.int64), np.asarray(gen, dtype=np.int64)


@dataclass
class Requests:
    arrival: np.ndarray  # seconds since midnight, sorted
    ctx: np.ndarray
    gen: np.ndarray

    def __len__(self) -> int:
        return len(self.arrival)


def requests(day: Day, lengths: tuple[np.ndarray, np.ndarray] | None = None) -> Requests:
    """Every request of the simulated span: Poisson counts per second at the day's rate, uniform
    times inside the second, lengths drawn with replacement from the trace's rows."""
    rng = np.random.default_rng(day.seed)
    seconds = np.arange(int(day.start_s), int(day.end_s), dtype=np.int64)
    rates = np.fromiter((day.rate(float(s)) for s in seconds), dtype=np.float64, count=len(seconds))
    counts = rng.poisson(rates)
    arrival = np.repeat(seconds.astype(np.float64), counts) + rng.random(int(counts.sum()))
    arrival.sort()
    ctx_all, gen_all = lengths if lengths is not None else trace_lengths()
    pick = rng.integers(0, len(ctx_all), size=len(arrival))
    return Requests(arrival=arrival, ctx=ctx_all[pick], gen=gen_all[pick])
