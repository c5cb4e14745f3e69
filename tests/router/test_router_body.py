"""The router reads a body only for routing and counting; any body it cannot read must leave that to
the unit (which answers the client's 400) instead of failing the router with a 500."""

from __future__ import annotations

import sys

import pytest

from runtime.router.access import estimate_tokens
from runtime.router.balance import request_key
from runtime.router.body import json_object

# Deeper than CPython's recursion limit: json.loads raises RecursionError, not ValueError.
DEEP = [b"[" * (sys.getrecursionlimit() * 2) + b"]" * (sys.getrecursionlimit() * 2)]
UNREADABLE = [*DEEP, b"", b"{", b"\xff\xfe", b"[1, 2]", b'"text"', b"null"]


@pytest.mark.parametrize("body", UNREADABLE, ids=["deep", "empty", "cut", "not-utf8", "array", "string", "null"])
def test_a_body_the_router_cannot_read_is_no_object_and_routes_by_work_alone(body):
    assert json_object(body) is None
    key = request_key(body)
    assert key.key is None  # no prefix to follow: least work decides
    assert estimate_tokens(body) >= 0


def test_an_object_is_read_and_keyed():
    body = b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 7}'
    assert json_object(body) == {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 7}
    assert request_key(body).key is not None
