"""Busy is not broken: what a full unit answers and what Retry-After it and the routers in front of it
give, declared once for the node (runtime/node/queue_wait.py) and the router (runtime/router/overload.py).

A unit that is full answers 429 + Retry-After with one of BUSY_CODES; a router never changes a unit's
routability for them (only the unit's own health reports and real failures do).
"""

from __future__ import annotations

import math

# OpenAI SDKs retry 429 and honour a Retry-After of up to 120 s (openai==3.51.0
# openai/_base_client.py `_should_retry` / `_calculate_retry_timeout`, openai/_constants.py
# MAX_RETRY_AFTER_DELAY): a longer value makes them give up at once, so none is ever sent.
RETRY_AFTER_MAX_S = 120
BUSY_STATUS = 429
BUSY_CODE_SHED = "unit_busy"  # refused at once: the expected wait for a batch slot exceeds the queue timeout
BUSY_CODE_QUEUE_TIMEOUT = "queue_timeout"  # waited the whole queue timeout without a batch slot
BUSY_CODES = frozenset({BUSY_CODE_SHED, BUSY_CODE_QUEUE_TIMEOUT})


def retry_after_s(wait_s: float, floor_s: int = 1) -> int:
    """Retry-After for a refusal: the expected wait in whole seconds, at least floor_s, never more than
    what OpenAI SDKs still honour (RETRY_AFTER_MAX_S)."""
    return min(RETRY_AFTER_MAX_S, max(floor_s, math.ceil(wait_s)))


def retry_after_header(given: str | None, default_s: int) -> str:
    """The Retry-After to pass on from a unit's refusal: its delay in seconds capped at RETRY_AFTER_MAX_S
    (an older revision may send more), default_s when it gave none a client can read as seconds."""
    if given is not None and given.strip().isdigit():
        return str(min(RETRY_AFTER_MAX_S, int(given)))
    return str(min(RETRY_AFTER_MAX_S, default_s))


def full(wait_s: float, queue_timeout_s: float) -> bool:
    """A unit that would refuse a new request: its reported wait is past its queue timeout (a
    timeout of 0.0 means the unit does not say, as an older revision)."""
    return queue_timeout_s > 0 and wait_s > queue_timeout_s
