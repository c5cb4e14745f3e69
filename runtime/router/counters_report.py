"""The router's refusal and retry counters as log lines: every ready-units interval, one JSON line on
stdout per labelled counter that moved since the last report, with how much it moved. On AWS nothing
reaches the metrics port (loopback, runtime/router/metrics_port.py), so this is how an operator reads
sheds, retries and per-key refusals: CloudWatch Logs Insights over the routers' log group, summed
over routers (docs/runbooks/at-capacity.md, docs/runbooks/api-keys.md)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from runtime import logs

EVENT = "router_counters"
# Counters whose labels are few and bounded (reasons, outcomes, key ids), not per unit: a line per
# series stays a handful a minute in a fleet of thousands of units.
REPORTED = (
    "flotilla_router_shed",
    "flotilla_router_retries",
    "flotilla_router_upstream_errors",
    "flotilla_router_key_requests",
    "flotilla_router_auth_failures",
)


class CounterDeltas:
    """What each reported counter series gained since the previous call."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry
        self._last: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}

    def records(self) -> list[dict]:
        out = []
        for family in self._registry.collect():
            if family.type != "counter" or family.name not in REPORTED:
                continue
            for sample in family.samples:
                if not sample.name.endswith("_total"):  # the _created timestamps
                    continue
                key = (sample.name, tuple(sorted(sample.labels.items())))
                delta = sample.value - self._last.get(key, 0.0)
                self._last[key] = sample.value
                if delta:
                    out.append(logs.record(EVENT, metric=sample.name, delta=delta, **sample.labels))
        return out
