"""Busy is not broken: when a router counts a unit full, and what Retry-After it then gives.

A leader reports the wait a request arriving now would have for a batch slot and its queue timeout
(runtime/node/queue_wait.py); past the timeout it refuses such a request at once with 429. A router
sends nothing to a unit it knows to be that full, tries another, and answers 429 at once when every
unit is; it never takes a full unit out of rotation (runtime/router/first_byte.py `_refused`). Both the
router and the fleet model (bench/fleet/overload_sim.py) run this code.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from contract import busy


class WaitView(Protocol):
    wait_s: float  # reported: seconds until a batch slot for a request arriving now
    queue_timeout_s: float  # reported: 0.0 when the leader does not say (an older revision)


def full(u: WaitView) -> bool:
    """The unit would refuse a new request: its reported wait is past its queue timeout."""
    return busy.full(u.wait_s, u.queue_timeout_s)


def retry_after_s(units: Iterable[WaitView], floor_s: int) -> int:
    """The shortest reported wait among full units, in whole seconds, between floor_s and what OpenAI
    SDKs still honour (contract/busy.py); floor_s when none reports one."""
    waits = [u.wait_s for u in units if full(u)]
    if not waits:
        return floor_s
    return busy.retry_after_s(min(waits), floor_s)
