"""What the scaler decides from: each unit's load as its leader reports it to the routers, the
routers' traffic, and how many units are starting or leaving. Built by each runner from its own
sources (the routers' log lines in AWS, the processes' health locally, the model in the
simulation); decide() sees only these."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping


@dataclass(frozen=True)
class UnitLoad:
    """One unit in rotation, as its leader's load report says (docs/routing.md, "What each unit
    reports"): sequences in its batch and its batch slots, requests queued for a slot, prompt tokens
    not yet at their first token, and its own estimate of the wait for a slot."""

    unit: str
    running: int = 0
    max_running: int = 0  # 0: not reported (an older revision); the policy's slots_per_unit stands in
    queue_depth: int = 0
    prefill_tokens: int = 0
    wait_s: float = 0.0

    @classmethod
    def from_report(cls, unit: str, load: Mapping[str, Any]) -> UnitLoad:
        """From a leader's `load` (ready body or a router's unit_states record); missing or negative
        fields (a unit that does not report them) count as 0."""

        def num(key: str) -> float:
            value = load.get(key, 0)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                return 0
            return value

        return cls(
            unit=unit,
            running=int(num("running")),
            max_running=int(num("max_running")),
            queue_depth=int(num("queue_depth")),
            prefill_tokens=int(num("prefill_tokens")),
            wait_s=float(num("wait_s")),
        )


@dataclass(frozen=True)
class Traffic:
    """The routers' traffic over the last window: requests offered per second (sent on to units or
    refused), those answered 429 (shed by a router or refused by a full unit), the p99 time to first
    token of the answered ones (None: not measured), and recent offered rates as (time, req/s) for
    the short-term prediction (oldest first; the current window's rate is the last)."""

    request_rate: float = 0.0
    busy_rate: float = 0.0
    ttft_p99_s: float | None = None
    history: tuple[tuple[float, float], ...] = ()


@dataclass(frozen=True)
class FleetSignals:
    now_s: float
    active: tuple[UnitLoad, ...]  # units in rotation
    pending: int = 0  # units started and not ready yet (instances launching, model loading)
    draining: int = 0  # units handing their streams over before their instances are released
    traffic: Traffic = Traffic()
    unavailable: int = 0  # units given back because they could not get their instances (EC2 capacity, quota)
    # Units in rotation whose load no router reported lately (a router restarting, logs late): they
    # count as serving, with the reported units' mean load, and no unit is removed while any is unseen.
    unreported: int = 0

    @property
    def serving(self) -> int:
        return len(self.active) + self.unreported

    @property
    def current(self) -> int:
        """Units serving or on their way: what the scaler has asked for and not taken back."""
        return self.serving + self.pending
