"""How a router picks a unit: the power of d choices over routable units, by estimated load.

Many routers each see every unit's load as of its last report. Sending to the least-loaded unit of
such a view makes the routers herd: all of them pick the same unit until its next report. Sampling
d units at random and taking the least loaded of them (Mitzenmacher, "The Power of Two Choices in
Randomized Load Balancing", IEEE TPDS 2001, which also treats d > 2; Envoy's LEAST_REQUEST samples
two by default) spreads the herd and still avoids busy units. bench/fleet/policy_sim.py measured the
policies against each other and against one central queue (docs/benchmarks.md, Fleet): with load
reported within 50 ms, four choices kept p99 queue wait at the ideal's where two did not. This
module is the code both the router and that model run.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

# Units sampled per pick (measured: docs/benchmarks.md, Fleet).
CHOICES = 4


class LoadView(Protocol):
    """What a router knows of one unit: its last report plus its own requests in flight."""

    in_flight: int  # reported: requests the leader holds; -1 when it does not say (older revision)
    queue_depth: int  # reported: requests waiting for a batch slot
    running: int  # reported: sequences in the batch
    kv_cache_used: float  # reported
    outstanding: int  # this router's requests in flight to the unit, exact and current
    outstanding_at_report: int  # the same count when the last report was taken


U = TypeVar("U", bound=LoadView)


def estimated_load(u: LoadView) -> int:
    """Requests the unit holds as far as this router can tell: the last report, plus what this router
    sent since, minus what it got back since (both already inside the report otherwise)."""
    reported = u.in_flight if u.in_flight >= 0 else u.queue_depth + u.running
    est = reported + u.outstanding - u.outstanding_at_report
    return est if est > 0 else 0


def _key(u: LoadView) -> tuple[int, float]:
    # KV-cache use breaks ties: of two units holding as many requests, the one with room for
    # longer ones.
    return (estimated_load(u), u.kv_cache_used)


def least_loaded(candidates: Sequence[U], usable: Callable[[U], bool], rng: random.Random) -> U | None:
    """The usable unit with the lowest estimated load (ties by KV-cache use, then at random)."""
    best: U | None = None
    best_key: tuple[int, float, float] | None = None
    for u in candidates:
        if not usable(u):
            continue
        key = (*_key(u), rng.random())
        if best_key is None or key < best_key:
            best, best_key = u, key
    return best


def sample_choices(
    candidates: Sequence[U],
    usable: Callable[[U], bool],
    rng: random.Random,
    *,
    choices: int = CHOICES,
    draws: int = 16,
) -> U | None:
    """The least loaded of `choices` distinct usable units drawn at random (ties by KV-cache use,
    then at random); fewer if `draws` draws found fewer; None if they found none (the caller then
    scans, which also tells "every unit saturated" from "none routable")."""
    n = len(candidates)
    if n <= choices:
        return least_loaded(candidates, usable, rng)
    best: U | None = None
    best_key: tuple[int, float, float] | None = None
    seen: set[int] = set()
    found = 0
    for _ in range(draws):
        i = int(rng.random() * n)
        if i in seen:
            continue
        seen.add(i)
        u = candidates[i]
        if not usable(u):
            continue
        key = (*_key(u), rng.random())
        if best_key is None or key < best_key:
            best, best_key = u, key
        found += 1
        if found == choices:
            break
    return best
