"""How a router picks a unit: the power of two choices over routable units, by estimated load.

Many routers each see every unit's load as of its last report (up to a poll interval old). Sending
to the least-loaded unit of such a view makes the routers herd: all of them pick the same unit until
its next report. Sampling two units at random and taking the less loaded one (Mitzenmacher, "The
Power of Two Choices in Randomized Load Balancing", IEEE TPDS 2001; Envoy's LEAST_REQUEST default)
spreads the herd and still avoids the busy units. bench/fleet/policy_sim.py measured the policies
against each other and against one central queue (docs/benchmarks.md, Fleet); this module is the
code both the router and that model run.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar


class LoadView(Protocol):
    """What a router knows of one unit: its last report plus its own requests in flight."""

    queue_depth: int  # reported: requests waiting for a batch slot
    running: int  # reported: sequences in the batch
    kv_cache_used: float  # reported
    outstanding: int  # this router's requests in flight to the unit, exact and current
    outstanding_at_report: int  # the same count when the last report was taken


U = TypeVar("U", bound=LoadView)


def estimated_load(u: LoadView) -> int:
    """Requests the unit holds as far as this router can tell: the last report, plus what this router
    sent since, minus what it got back since (both already inside the report otherwise)."""
    est = u.queue_depth + u.running + u.outstanding - u.outstanding_at_report
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


def two_choices(
    candidates: Sequence[U], usable: Callable[[U], bool], rng: random.Random, *, draws: int = 8
) -> U | None:
    """The less loaded of two usable units drawn at random; None if `draws` draws found no usable
    unit (the caller then scans, which also tells "every unit saturated" from "none routable")."""
    n = len(candidates)
    if n <= 2:
        return least_loaded(candidates, usable, rng)
    first: U | None = None
    first_i = -1
    for _ in range(draws):
        i = int(rng.random() * n)
        if i == first_i:
            continue
        u = candidates[i]
        if not usable(u):
            continue
        if first is None:
            first, first_i = u, i
            continue
        a, b = _key(first), _key(u)
        if a == b:
            return first if rng.random() < 0.5 else u
        return first if a < b else u
    return first
