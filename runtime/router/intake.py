"""A request as it comes in, before any unit is chosen: its id, its body (read within a bound), and
the headers a unit gets with it (hop-by-hop ones dropped, the routing key and resume ask added)."""

from __future__ import annotations

import asyncio
import re
import uuid

from aiohttp import web

import contract
from runtime.router import balance
from runtime.router.answers import error_response
from runtime.router.resume import RESUMABLE_PATHS

# Headers that describe one hop, not the message (RFC 9110 §7.6.1), plus the ones aiohttp recomputes.
HOP_BY_HOP = frozenset(
    h.lower()
    for h in (
        *contract.INTERNAL_HEADERS,  # router <-> leader only: a client's copy never reaches a leader
        "Connection",
        "Keep-Alive",
        "Proxy-Authenticate",
        "Proxy-Authorization",
        "Proxy-Connection",
        "TE",
        "Trailer",
        "Transfer-Encoding",
        "Upgrade",
        "Host",
        "Content-Length",
    )
)
_REQUEST_ID_RE = re.compile(contract.REQUEST_ID_PATTERN)


def request_id(request: web.Request) -> str | web.Response:
    """The client's X-Request-Id, or one the router makes; a 400 for an id that breaks the pattern."""
    rid = request.headers.get(contract.REQUEST_ID_HEADER)
    if rid is None:
        return uuid.uuid4().hex
    if _REQUEST_ID_RE.match(rid):
        return rid
    return error_response(
        400,
        f"{contract.REQUEST_ID_HEADER} must be 1-128 characters of A-Z a-z 0-9 . _ : - "
        f"(got {rid[:40]!r}); send a valid id or none and the router makes one",
        code="invalid_request_id",
        err_type="invalid_request_error",
        request_id=rid[:128],
    )


async def read_body(request: web.Request, request_id: str, timeout_s: float) -> bytes | web.Response:
    """The whole body, or the answer to a body that did not arrive whole within timeout_s."""
    try:
        # Bounded: a client that trickles its body in must not hold a request open for ever.
        async with asyncio.timeout(timeout_s):
            return await request.read()
    except TimeoutError:
        return error_response(
            408,
            f"the request body did not arrive within {timeout_s:g} s: send it whole",
            code="body_timeout",
            err_type="invalid_request_error",
            request_id=request_id,
            close=True,
        )
    except web.RequestPayloadError:
        return error_response(
            400,
            "the request body could not be read (broken chunked framing?): send it with a Content-Length",
            code="unreadable_body",
            err_type="invalid_request_error",
            request_id=request_id,
            close=True,
        )


def upstream_headers(request: web.Request, request_id: str) -> dict[str, str]:
    """The client's end-to-end headers, its request id and the X-Forwarded-For chain."""
    headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
    headers[contract.REQUEST_ID_HEADER] = request_id
    peer = request.remote
    if peer:
        prior = request.headers.get("X-Forwarded-For")
        headers["X-Forwarded-For"] = f"{prior}, {peer}" if prior else peer
    return headers


def tell_route_key(headers: dict[str, str], key: balance.RequestKey) -> None:
    """The request's cache key and prompt summary, which the leader reports back to every router
    (docs/routing.md)."""
    if key.key is not None:
        headers[contract.ROUTE_KEY_HEADER] = str(key.key)
        if key.prompt:
            length, tail, marks = key.prompt_summary
            headers[contract.ROUTE_PROMPT_HEADER] = f"{length}:{tail}"
            headers[contract.ROUTE_MARKS_HEADER] = ",".join(map(str, marks))


def restartable(request: web.Request) -> bool:
    """A request that may start again on another unit once its first unit gave up before answering:
    a read, or a generation (it changes nothing on the unit; the first unit's answer is never read,
    as its connection is closed first, so the client gets exactly one)."""
    return request.method in ("GET", "HEAD") or (request.method == "POST" and request.path in RESUMABLE_PATHS)
