"""API keys: the format `flotilla keys` writes to the deployment's secret and every router reads.

A key is `flt_<id>_<secret>`; only its SHA-256 is stored, under its id, with its priority class and
limits. Keys are 256 random bits, so one fast hash suffices: nobody can guess a preimage, and a slow
password hash would cost the router CPU on every request for nothing.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import re
import secrets
from dataclasses import asdict, dataclass, field
from typing import Any

KEY_PREFIX = "flt_"
_KEY_RE = re.compile(r"^flt_([0-9a-f]{8})_([A-Za-z0-9_-]{43})$")
_ID_RE = re.compile(r"^[0-9a-f]{8}$")
PRIORITIES = ("interactive", "batch")  # batch is shed first (runtime/router/access.py)
MAX_REQUESTS_PER_S = 100_000.0
MAX_TOKENS_PER_MIN = 1_000_000_000
# A request's token cost as a per-minute limit counts it before it runs (OpenAI counts the same way:
# the larger of max_tokens and a character-count estimate, platform.openai.com/docs/guides/rate-limits):
# a quarter of the body's bytes for the prompt, plus max_tokens, or this when the request sets none.
DEFAULT_COMPLETION_ESTIMATE = 256
BYTES_PER_TOKEN = 4
LOCAL_KEY_ID = "local"  # the id of the one key `make local API_KEY=...` accepts
# Seconds a router serves the keys it last read before reading the secret again: a revoked key
# works at most this long after `flotilla keys` writes. The default of the config's
# front.api_keys_ttl_s, which the stacks pass to every router (contract.ENV_API_KEYS_TTL).
API_KEYS_TTL_S = 30


def secret_name(deployment: str) -> str:
    """The Secrets Manager secret holding a deployment's hashed keys (the router may read only it)."""
    return f"flotilla/{deployment}/api-keys"


class KeySetError(ValueError):
    """The secret's value or a key setting is not valid; the message names the field and the fix."""


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def key_id(key: str) -> str | None:
    """The id part of a well-formed key, None for anything else."""
    match = _KEY_RE.match(key)
    return match.group(1) if match else None


def new_key() -> tuple[str, str]:
    """(id, key): a fresh key, to be printed once and stored only as its digest."""
    kid = secrets.token_hex(4)
    return kid, f"{KEY_PREFIX}{kid}_{secrets.token_urlsafe(32)}"


def _check_limit(name: str, value: Any, high: float, *, whole: bool) -> None:
    if value is None:
        return
    kind = (int,) if whole else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind) or not math.isfinite(value) or not 0 < value <= high:
        raise KeySetError(
            f"{name}={value!r}: a {'whole ' if whole else ''}number above 0 and at most {high:g}, or none"
        )


@dataclass(frozen=True)
class KeyEntry:
    """One issued key: its digest and what it may do. A limit of None is no limit."""

    name: str
    sha256: str
    priority: str = "interactive"
    requests_per_s: float | None = None
    tokens_per_min: int | None = None
    created: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not 1 <= len(self.name) <= 128:
            raise KeySetError(f"name={self.name!r}: 1 to 128 characters saying who holds the key")
        if not isinstance(self.sha256, str) or not re.fullmatch(r"[0-9a-f]{64}", self.sha256):
            raise KeySetError("sha256: the 64 hex digits of the key's SHA-256")
        if self.priority not in PRIORITIES:
            raise KeySetError(f"priority={self.priority!r}: one of {', '.join(PRIORITIES)}")
        _check_limit("requests_per_s", self.requests_per_s, MAX_REQUESTS_PER_S, whole=False)
        _check_limit("tokens_per_min", self.tokens_per_min, MAX_TOKENS_PER_MIN, whole=True)

    def matches(self, key: str) -> bool:
        return hmac.compare_digest(digest(key), self.sha256)


@dataclass(frozen=True)
class KeySet:
    """Every key of a deployment, by id: the whole value of the secret."""

    keys: dict[str, KeyEntry] = field(default_factory=dict)

    def lookup(self, key: str) -> tuple[str, KeyEntry] | None:
        """(id, entry) when key is one of ours and not revoked, else None."""
        kid = key_id(key)
        entry = self.keys.get(kid) if kid else None
        return (kid, entry) if kid and entry and entry.matches(key) else None

    def dumps(self) -> str:
        return json.dumps(
            {
                "version": 1,
                "keys": {k: {n: v for n, v in asdict(e).items() if v is not None} for k, e in self.keys.items()},
            },
            sort_keys=True,
        )

    @classmethod
    def loads(cls, text: str) -> KeySet:
        try:
            doc: Any = json.loads(text)
        except json.JSONDecodeError as err:
            raise KeySetError(f"not JSON ({err.msg}): manage the secret with `flotilla keys`") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("keys"), dict) or doc.get("version") != 1:
            raise KeySetError('not a key set: expected {"version": 1, "keys": {...}}; manage it with `flotilla keys`')
        keys = {}
        known = set(KeyEntry.__dataclass_fields__)
        for kid, raw in doc["keys"].items():
            if not _ID_RE.match(kid) or not isinstance(raw, dict):
                raise KeySetError(f"key {kid!r}: ids are 8 hex digits with an object of settings")
            unknown = sorted(set(raw) - known)
            if unknown:
                raise KeySetError(
                    f"key {kid}: unknown field(s) {', '.join(unknown)}; allowed {', '.join(sorted(known))}"
                )
            try:
                keys[kid] = KeyEntry(**raw)
            except KeySetError as err:
                raise KeySetError(f"key {kid}: {err}") from None
            except TypeError:
                raise KeySetError(f"key {kid}: needs name and sha256") from None
        return cls(keys)
