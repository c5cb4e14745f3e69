"""Prometheus metrics of the router: per-unit state and load, routed requests, retries, shedding, added latency.

Per-unit gauges are read from the fleet at scrape time, so a unit that left discovery leaves the
metrics too. Each Router owns its registry (tests run several routers in one process).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

# Added latency is sub-millisecond when healthy; buckets resolve 50 us .. 1 s.
ADDED_LATENCY_BUCKETS = (
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.00075,
    0.001,
    0.0015,
    0.002,
    0.003,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    1.0,
)


class _FleetCollector(Collector):
    def __init__(self, fleet) -> None:
        self._fleet = fleet

    def collect(self):
        labels = ["unit_url", "unit", "revision"]
        routable = GaugeMetricFamily(
            "flotilla_router_unit_routable", "1 when the unit is ready and not draining", labels=labels
        )
        state = GaugeMetricFamily(
            "flotilla_router_unit_state",
            "1 for the state the unit last reported (unreachable if the poll failed)",
            labels=labels + ["state"],
        )
        outstanding = GaugeMetricFamily(
            "flotilla_router_unit_outstanding", "requests this router has in flight to the unit", labels=labels
        )
        queue = GaugeMetricFamily("flotilla_router_unit_queue_depth", "queue depth the unit reported", labels=labels)
        running = GaugeMetricFamily(
            "flotilla_router_unit_running", "running sequences the unit reported", labels=labels
        )
        kv = GaugeMetricFamily(
            "flotilla_router_unit_kv_cache_used", "KV-cache fraction in use the unit reported", labels=labels
        )
        prefill = GaugeMetricFamily(
            "flotilla_router_unit_prefill_tokens",
            "prompt tokens waiting for their first token the unit reported (-1: it does not report them)",
            labels=labels,
        )
        for u in list(self._fleet.members.values()):
            lv = [u.url, u.unit, u.revision]
            routable.add_metric(lv, 1.0 if u.routable else 0.0)
            state.add_metric(lv + [u.state], 1.0)
            outstanding.add_metric(lv, u.outstanding)
            queue.add_metric(lv, u.queue_depth)
            running.add_metric(lv, u.running)
            kv.add_metric(lv, u.kv_cache_used)
            prefill.add_metric(lv, u.prefill_tokens)
        routable_units = GaugeMetricFamily("flotilla_router_routable_units", "units currently routable")
        routable_units.add_metric([], self._fleet.routable_count())
        # What health costs this router: lines from the leaders it watches, and the members it had to
        # ask (followers only while no live leader vouches for them; docs/discovery.md).
        watched = GaugeMetricFamily("flotilla_router_watched_leaders", "leaders whose /health/watch is open")
        watched.add_metric([], len(self._fleet.watching))
        lines = CounterMetricFamily("flotilla_router_watch_lines", "watch lines received from leaders")
        lines.add_metric([], self._fleet.watch_lines)
        polls = CounterMetricFamily(
            "flotilla_router_health_polls", "GET /health/ready sent, by the member's role at the time", labels=["role"]
        )
        for role, n in self._fleet.polls.items():
            polls.add_metric([role], n)
        routes = CounterMetricFamily(
            "flotilla_router_routes",
            "cache-aware picks: to the key's own unit (preferred), elsewhere by work (by_work), without a key",
            labels=["decision"],
        )
        for decision, n in self._fleet.routes.items():
            routes.add_metric([decision], n)
        yield from (routable, state, outstanding, queue, running, kv, prefill, routable_units, watched, lines, polls)
        yield routes


class RouterMetrics:
    def __init__(self, fleet) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_FleetCollector(fleet))
        r = self.registry
        self.routed = Counter("flotilla_router_requests", "requests answered by a unit", ["unit", "code"], registry=r)
        self.retries = Counter(
            "flotilla_router_retries",
            "attempts moved to another unit before anything reached the client",
            ["reason"],
            registry=r,
        )
        self.shed = Counter(
            "flotilla_router_shed", "requests refused by the router", ["reason"], registry=r
        )  # saturated (429) | no_unit (503) | draining
        self.upstream_errors = Counter(
            "flotilla_router_upstream_errors",
            "requests that failed at a unit after the response had started (stream broken, idle)",
            ["reason"],
            registry=r,
        )
        self.added_latency = Histogram(
            "flotilla_router_added_latency_seconds",
            "time the router adds before the first byte: its own work, excluding the unit's time to first byte",
            buckets=ADDED_LATENCY_BUCKETS,
            registry=r,
        )
        self.inflight = Gauge("flotilla_router_inflight", "requests in flight through the router", registry=r)
        self.draining = Gauge("flotilla_router_draining", "1 after SIGTERM", registry=r)
        self._routed_children: dict[tuple[str, int], Counter] = {}

    def count_routed(self, unit: str, status: int) -> None:
        child = self._routed_children.get((unit, status))
        if child is None:  # labels() takes a lock and formats: do it once per (unit, status)
            child = self._routed_children[(unit, status)] = self.routed.labels(unit, str(status))
        child.inc()
