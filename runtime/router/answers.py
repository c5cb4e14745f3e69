"""What the router answers itself: errors in OpenAI's shape, the SSE error event that ends a stream
that cannot move, the refusals of a request it sheds, and the reading of a unit's busy answer."""

from __future__ import annotations

import json

from aiohttp import web

import contract


def error_response(
    status: int,
    message: str,
    *,
    code: str,
    err_type: str,
    request_id: str,
    retry_after: int | None = None,
    close: bool = False,
) -> web.Response:
    """An error in OpenAI's shape, so SDK clients surface the message; a Retry-After they still honour
    (contract/busy.py)."""
    headers = {contract.REQUEST_ID_HEADER: request_id}
    if retry_after is not None:
        headers["Retry-After"] = str(min(retry_after, contract.RETRY_AFTER_MAX_S))
    if close:
        headers["Connection"] = "close"
    body = {"error": {"message": message, "type": err_type, "param": None, "code": code}}
    return web.Response(status=status, headers=headers, body=json.dumps(body).encode(), content_type="application/json")


def sse_error_event(message: str, *, code: str) -> bytes:
    body = {"error": {"message": message, "type": "upstream_error", "param": None, "code": code}}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def busy_answer(raw: bytes) -> bool:
    """The refusal's OpenAI error code says the unit is full (contract.BUSY_CODES)."""
    try:
        code = json.loads(raw)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return False
    return code in contract.BUSY_CODES


def draining(request_id: str, retry_after_s: int) -> web.Response:
    """A new request after the drain grace: this router is going away, so the connection closes too."""
    return error_response(
        503,
        "this router is shutting down; retry",
        code="router_draining",
        err_type="service_unavailable",
        request_id=request_id,
        retry_after=retry_after_s,
        close=True,
    )


def shed(reason: str, request_id: str, *, retry_after_s: int) -> web.Response:
    """A request no unit takes: 429 while the service sheds load or every unit is full, else 503."""
    if reason == "admission":
        return error_response(
            429,
            "the service is shedding load during an incident; retry after the Retry-After delay",
            code="load_shed",
            err_type="rate_limit_error",
            request_id=request_id,
            retry_after=retry_after_s,
        )
    if reason == "saturated":
        return error_response(
            429,
            "every unit is at capacity; retry after the Retry-After delay",
            code="overloaded",
            err_type="rate_limit_error",
            request_id=request_id,
            retry_after=retry_after_s,
        )
    return error_response(
        503,
        "no unit is ready to serve; retry after the Retry-After delay",
        code="no_unit_ready",
        err_type="service_unavailable",
        request_id=request_id,
        retry_after=retry_after_s,
    )
