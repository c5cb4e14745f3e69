"""The balancing policy: the power of d choices on estimated load (runtime/router/balance.py), and the
herding comparison of bench/fleet/policy_sim.py at a small size (10 routers, 20-100 units of 8 slots,
20,000 requests; docs/benchmarks.md has it at fleet size).

The model's numbers are counts and simulated time from a seeded workload, so they do not depend on
how busy the machine running the test is."""

from __future__ import annotations

import random
from dataclasses import dataclass

from bench.fleet.policy_sim import Params, central_queue, distributed, workload
from runtime.router import balance


@dataclass
class V:
    in_flight: int = -1
    queue_depth: int = 0
    running: int = 0
    kv_cache_used: float = 0.0
    outstanding: int = 0
    outstanding_at_report: int = 0


def test_the_estimate_adds_what_this_router_sent_since_the_report_and_drops_what_came_back():
    assert balance.estimated_load(V(in_flight=5, outstanding=3, outstanding_at_report=1)) == 7
    assert balance.estimated_load(V(in_flight=5, outstanding=0, outstanding_at_report=2)) == 3
    # An older leader without in_flight: its engine's queue and batch.
    assert balance.estimated_load(V(queue_depth=2, running=4)) == 6
    assert balance.estimated_load(V(in_flight=1, outstanding=0, outstanding_at_report=4)) == 0


def test_sampling_picks_the_least_loaded_of_the_units_it_drew_and_never_an_unusable_one():
    units = [V(in_flight=n) for n in range(100)]
    rng = random.Random(5)
    usable = lambda v: v.in_flight % 10 != 0  # noqa: E731 - every tenth unit is saturated
    for _ in range(200):
        drawn: list[V] = []

        def watch(v: V) -> bool:
            drawn.append(v)
            return usable(v)

        chosen = balance.sample_choices(units, watch, rng)
        assert chosen is not None and usable(chosen)
        assert chosen.in_flight == min(v.in_flight for v in drawn if usable(v))
        assert len([v for v in drawn if usable(v)]) == balance.CHOICES


def test_sampling_that_finds_nothing_usable_returns_none_for_the_caller_to_scan():
    units = [V(in_flight=n) for n in range(50)]
    assert balance.sample_choices(units, lambda v: False, random.Random(1)) is None


FRESH = Params(routers=10, units=100, slots=8, load=0.8, requests=20_000, seed=11)  # report_s 0.05: the watch


def test_with_load_reported_within_50_ms_four_choices_keep_p99_wait_within_1_5x_of_one_central_queue():
    work = workload(FRESH)
    ideal = central_queue(FRESH, work)
    shipped = distributed(FRESH, "p4c", work)
    two = distributed(FRESH, "p2c", work)
    assert shipped["p99_s"] <= 1.5 * ideal["p99_s"] + 1e-9
    # Two choices alone leave too many requests queued behind busy units at 80 % load.
    assert two["p99_s"] > 1.5 * ideal["p99_s"] and two["waited"] > 5 * shipped["waited"]


STALE = Params(routers=10, units=20, slots=8, load=0.8, requests=20_000, seed=11, report_s=0.25)


def test_with_reports_a_poll_interval_old_least_loaded_routers_herd_and_sampling_spreads_them():
    work = workload(STALE)
    herd = distributed(STALE, "least_loaded", work)
    shipped = distributed(STALE, "p4c", work)
    ideal = central_queue(STALE, work)
    assert shipped["p99_s"] < herd["p99_s"] and shipped["waited"] < herd["waited"]
    # ... but with load a poll interval old no policy gets near the ideal: freshness closes the gap.
    assert shipped["p99_s"] > 1.5 * ideal["p99_s"]
