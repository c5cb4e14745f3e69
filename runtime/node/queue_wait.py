"""How long a request arriving now would wait for a batch slot: what lets the leader refuse at once
(429 + Retry-After) a request that would wait past its queue timeout, instead of holding it and the
client's connection for the whole timeout, and what the leader reports so routers send it elsewhere.

The leader knows each request it holds: queued (no token yet) or running (since its first token), its
max_tokens, and when its tokens came. Continuous batching frees a slot when a sequence ends, so the
wait is found by playing the queue forward: each running sequence frees its slot after its expected
remaining steps, each queued request then takes the earliest free slot and holds it for its expected
length; the new request gets the slot after them. A step's time is measured (running sequences'
token pace, else finished ones'); a request's expected length is max_tokens scaled by the share of
max_tokens that 9 in 10 recent finished requests stayed within: an estimate that errs long, so that a
request let in rarely waits out the queue timeout after all (it would then be told late). Prefill
is not modelled (a small share of a long request).
bench/fleet/overload_sim.py runs this same class in the fleet model.
"""

from __future__ import annotations

import collections
import heapq
import math

from contract.busy import retry_after_s as retry_after_s  # a refusal's Retry-After, shared with the router

# How much one finished request moves the learned step time (exponential average).
_SMOOTHING = 0.2
# The length share is this quantile of the last _SHARES_KEPT finished requests' shares of max_tokens.
_SHARE_QUANTILE = 0.9
_SHARES_KEPT = 200


class _Held:
    __slots__ = ("max_steps", "first", "last", "steps")

    def __init__(self, max_steps: int) -> None:
        self.max_steps = max(1, max_steps)
        self.first: float | None = None  # time of the first token: the request holds a slot from then
        self.last = 0.0  # time of the latest token
        self.steps = 0  # tokens of its first choice so far


class QueueWait:
    """Requests the leader holds, in arrival order; times are any one monotonic clock."""

    def __init__(self) -> None:
        self._held: dict[str, _Held] = {}  # insertion order = arrival order = the engine's FIFO
        self.step_s: float | None = None  # learned from finished requests
        self.length_share = 1.0  # learned: the share of max_tokens (steps) finished requests stayed within
        self._shares: collections.deque[float] = collections.deque(maxlen=_SHARES_KEPT)

    def __len__(self) -> int:
        return len(self._held)

    def submitted(self, rid: str, max_tokens: int) -> None:
        self._held[rid] = _Held(max_tokens)

    def token(self, rid: str, now: float) -> None:
        """A token of the request's first choice came (one decode step)."""
        h = self._held.get(rid)
        if h is None:
            return
        if h.first is None:
            h.first = now
        h.last = now
        h.steps += 1

    def finished(self, rid: str, now: float, steps: int | None = None) -> None:
        """The request ended (any way); `steps` overrides the tokens counted (a caller that does not
        report every token)."""
        h = self._held.pop(rid, None)
        if h is None or h.first is None:
            return
        n = h.steps if steps is None else steps
        if n >= 2:
            pace = ((now if steps is not None else h.last) - h.first) / (n - 1)
            self.step_s = pace if self.step_s is None else self.step_s + _SMOOTHING * (pace - self.step_s)
            self._shares.append(min(1.0, n / h.max_steps))
            ordered = sorted(self._shares)
            self.length_share = ordered[min(len(ordered) - 1, int(len(ordered) * _SHARE_QUANTILE))]

    def _pace(self) -> float | None:
        """Seconds per decode step: the running sequences' pace now, else the learned one."""
        span, steps = 0.0, 0
        for h in self._held.values():
            if h.first is not None and h.steps >= 2:
                span += h.last - h.first
                steps += h.steps - 1
        if steps and span > 0:
            return span / steps
        return self.step_s

    def _left_steps(self, h: _Held, progress: float) -> float:
        """Decode steps the request is expected still to take after `progress` steps."""
        expect = math.ceil(self.length_share * h.max_steps)
        if progress >= expect:  # already past the usual share: it may run to its max_tokens
            expect = h.max_steps
        return max(1.0, expect - progress)

    def expected_wait(self, slots: int, now: float) -> float | None:
        """Seconds until a request arriving now gets a batch slot: 0.0 when one is free, None when
        it cannot be told (no step measured yet, or the slot count unknown)."""
        if slots < 1:
            return None
        running = [h for h in self._held.values() if h.first is not None]
        queued = [h for h in self._held.values() if h.first is None]
        free = slots - len(running)
        if len(queued) < free:
            return 0.0
        pace = self._pace()
        if pace is None:
            return None
        frees = [0.0] * max(0, free)
        for h in running:
            assert h.first is not None
            # Progress by the clock, not by tokens counted: a caller may report only the first one.
            progress = max(float(h.steps), 1.0 + (now - h.first) / pace)
            frees.append(self._left_steps(h, progress) * pace)
        heapq.heapify(frees)
        for h in queued:
            heapq.heappush(frees, heapq.heappop(frees) + self._left_steps(h, 0.0) * pace)
        return frees[0]
