"""Prometheus metrics of one unit member (served at /metrics): requests, errors, latency, load."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_PER_TOKEN = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class NodeMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter(
            "flotilla_requests", "API requests by endpoint and HTTP status", ["endpoint", "status"], registry=r
        )
        self.errors = Counter(
            "flotilla_request_errors", "API requests that ended in an error, by kind", ["endpoint", "kind"], registry=r
        )
        self.ttft = Histogram(
            "flotilla_time_to_first_token_seconds", "arrival to first token", buckets=_LATENCY, registry=r
        )
        self.per_token = Histogram(
            "flotilla_time_per_output_token_seconds",
            "mean time between output tokens after the first, per request",
            buckets=_PER_TOKEN,
            registry=r,
        )
        self.duration = Histogram(
            "flotilla_request_duration_seconds", "arrival to finish", buckets=_LATENCY, registry=r
        )
        self.prompt_tokens = Counter("flotilla_prompt_tokens", "prompt tokens processed", registry=r)
        self.completion_tokens = Counter("flotilla_completion_tokens", "tokens generated", registry=r)
        self.queue_depth = Gauge("flotilla_queue_depth", "requests waiting for a batch slot", registry=r)
        self.running = Gauge("flotilla_running_sequences", "sequences in the running batch", registry=r)
        self.max_running = Gauge("flotilla_max_running_sequences", "batch slots", registry=r)
        self.kv_cache_used = Gauge("flotilla_kv_cache_used_ratio", "fraction of the KV-cache budget in use", registry=r)
        self.in_flight = Gauge("flotilla_in_flight_requests", "API requests being served", registry=r)
        self.expected_wait = Gauge(
            "flotilla_expected_wait_seconds",
            "leader: the wait for a batch slot a request arriving now would have (past the queue timeout: 429)",
            registry=r,
        )
        self.ready = Gauge("flotilla_unit_ready", "1 when the unit is formed, warm and not draining", registry=r)
        self.reforms = Counter("flotilla_unit_reforms", "times the unit had to re-form", registry=r)
        # vLLM's names (vllm:prefix_cache_queries / vllm:prefix_cache_hits), in prompt tokens.
        self.prefix_cache_queries = Counter(
            "flotilla_prefix_cache_queries", "prompt tokens looked up in the prefix cache", registry=r
        )
        self.prefix_cache_hits = Counter(
            "flotilla_prefix_cache_hits", "prompt tokens whose KV came from the prefix cache", registry=r
        )
        # Speculative decoding, vLLM's names (vllm:spec_decode_num_draft_tokens / _num_accepted_tokens).
        self.spec_draft_tokens = Counter(
            "flotilla_spec_decode_num_draft_tokens", "draft tokens verified (speculative decoding)", registry=r
        )
        self.spec_accepted_tokens = Counter(
            "flotilla_spec_decode_num_accepted_tokens", "draft tokens verified and kept", registry=r
        )
        self.tokens_per_step = Gauge(
            "flotilla_decode_tokens_per_step", "tokens a decoding sequence gained per step lately", registry=r
        )
        self._seen: dict[str, tuple[int, ...]] = {}  # the engine's totals at the last scrape, per group

    def _add_since(self, group: str, counters: tuple[Counter, ...], totals: tuple[int, ...]) -> None:
        """Add what the engine counted since the last call. Its totals start again at 0 when the
        unit re-forms (a new engine process): then all of them are new."""
        before = self._seen.get(group, (0,) * len(totals))
        if any(t < b for t, b in zip(totals, before)):
            before = (0,) * len(totals)
        for counter, t, b in zip(counters, totals, before):
            counter.inc(t - b)
        self._seen[group] = totals

    def prefix_cache(self, queries: int, hits: int) -> None:
        self._add_since("prefix", (self.prefix_cache_queries, self.prefix_cache_hits), (queries, hits))

    def engine_counters(self, ld) -> None:
        """The engine's counters and figures from its last load report (engine_protocol.Load)."""
        self.prefix_cache(ld.prefix_cache_queries, ld.prefix_cache_hits)
        totals = (int(ld.spec_draft_tokens), int(ld.spec_accepted_tokens))
        self._add_since("speculation", (self.spec_draft_tokens, self.spec_accepted_tokens), totals)
        self.tokens_per_step.set(ld.tokens_per_step)
