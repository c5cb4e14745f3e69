"""The router's one reading of a request body: a JSON object, or None for anything else.

The router reads bodies only for what it routes and counts by (the request key, a key's token
estimate, a continuation); the unit validates them and answers the client's errors. So a body the
router cannot read is not an error here, whatever it is: not JSON, not UTF-8, or nested deeper than
the parser's own stack (json raises RecursionError, not ValueError, for `[[[[...`)."""

from __future__ import annotations

import json
from typing import Any


def json_object(body: bytes) -> dict[str, Any] | None:
    """The body as a JSON object, or None when it is empty, not JSON, or not an object."""
    if not body:
        return None
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None
    return doc if isinstance(doc, dict) else None
