"""The shared-limit guarantee the per-key limits document (docs/runbooks/api-keys.md), checked on the
SimPy model that drives the routers' own buckets (bench/access/limit_sim.py) on a simulated clock."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "access"))

from limit_sim import Case, simulate  # noqa: E402

LIMIT, SECONDS = 40.0, 120.0


@pytest.mark.parametrize("routing", ["round_robin", "random"])
def test_routers_at_the_count_the_limit_is_divided_by_admit_at_most_the_limit_plus_one_burst_each(routing):
    n = 4
    o = simulate(Case(routing, n=n, running=n, offered=3.0), limit=LIMIT, seconds=SECONDS)
    burst = max(1.0, LIMIT / n)  # each router's bucket starts full with one second's share
    admitted = o.admitted_per_limit * LIMIT * SECONDS
    assert admitted <= LIMIT * SECONDS + n * burst
    assert admitted >= 0.95 * LIMIT * SECONDS  # and the key does get its limit


def test_more_routers_than_the_limit_is_divided_by_admit_that_many_times_more():
    o = simulate(Case("round_robin", n=2, running=6, offered=4.0), limit=LIMIT, seconds=SECONDS)
    assert 2.8 <= o.admitted_per_limit <= 3.0 + 6 * (LIMIT / 2) / (LIMIT * SECONDS)  # running / n = 3


def test_a_key_under_its_limit_is_hardly_ever_refused():
    # Each router's bucket holds one second of its share: a Poisson key at 80 % of its limit seldom
    # overruns it, whichever way the ALB spreads the key's requests.
    for routing in ("round_robin", "random"):
        o = simulate(Case(routing, n=4, running=4, offered=0.8), limit=LIMIT, seconds=SECONDS)
        assert o.refused_share < 0.02, routing
