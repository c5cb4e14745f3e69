"""Who may call the router: API keys (Bearer, as OpenAI clients send them), per-key limits and
priority classes, as an aiohttp middleware in front of the proxy.

Keys come from the deployment's secret (contract/apikeys.py), re-read every TTL so revocation needs
no restart; a failed read keeps the last set, a secret deleted or scheduled for deletion ends them
all. Each router enforces 1/n of every key's limits, n the routers sharing them
(docs/runbooks/api-keys.md states what that guarantees). The key itself never goes past this
module: not to the unit, not into a log.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web
from multidict import CIMultiDict
from prometheus_client import Counter

import contract
from contract import apikeys
from contract.apikeys import KeyEntry, KeySet, KeySetError
from runtime.router.body import json_object

log = logging.getLogger("flotilla.router.access")

KEY_ID = web.RequestKey("flotilla.key_id", str)  # the caller's key id, for the access log
# OpenAI's own answer to a missing or wrong key is 401 with this error shape; the openai client
# raises AuthenticationError for any 401 (openai-python src/openai/_client.py, _make_status_error).
_MISSING = "You didn't provide an API key: send it as Authorization: Bearer <key>"
_INVALID = (
    "Incorrect API key provided (revoked, mistyped or never issued): ask the operator for a key (flotilla keys create)"
)


class SecretSource:
    """The keys' Secrets Manager secret: its SecretString, or None when it does not exist (no keys issued).

    Secrets Manager rather than an SSM SecureString: GetSecretValue's quota is 10,000 requests per
    second per account (Secrets Manager quotas), where Parameter Store's standard throughput (40/s) is
    already shared with the admission parameter every router reads; and a resource-level IAM grant
    names exactly this secret."""

    def __init__(self, name: str, *, client=None, region: str | None = None) -> None:
        if client is None:
            import boto3  # noqa: PLC0415 - only routers given a secret pay boto3's import time

            client = boto3.client("secretsmanager", region_name=region)
        self._client, self.name = client, name

    def read(self) -> str | None:
        try:
            # The current version, which `flotilla keys` moves by staging label (ops/key_store.py);
            # named, though it is the default, for moto (5.2.5), whose default ignores label moves.
            answer = self._client.get_secret_value(SecretId=self.name, VersionStage="AWSCURRENT")
            return str(answer["SecretString"])
        except self._client.exceptions.ResourceNotFoundException:
            return None
        except self._client.exceptions.InvalidRequestException as err:
            # GetSecretValue's answer for a secret scheduled for deletion ("A parameter value is not
            # valid for the current state of the resource. Possible causes: The secret is scheduled
            # for deletion", Secrets Manager API reference, InvalidRequestException): not a passing
            # fault to ride out with the last keys, but the keys' end. No key works until it is
            # restored (aws secretsmanager restore-secret) or created anew (flotilla keys create).
            log.error("API keys secret %s cannot be read in its state (%s): no key is accepted", self.name, err)
            return None


class FileSource:
    def __init__(self, path: str) -> None:
        self.name = path

    def read(self) -> str | None:
        try:
            return Path(self.name).read_text()
        except FileNotFoundError:
            return None


@dataclass
class _Bucket:
    level: float
    at: float


class KeyLimits:
    """Token buckets per key: requests/s (one second's share of burst) and tokens/min (a minute's share).

    Each router takes 1/routers of every limit. A request is admitted while a bucket is above zero
    and its token cost may take that bucket below zero (a request larger than a minute's share still
    runs, and the key then waits for it), so the wait is what the key has overspent."""

    def __init__(self, *, routers: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.routers, self._clock = routers, clock
        self._requests: dict[str, _Bucket] = {}
        self._tokens: dict[str, _Bucket] = {}

    def forget(self, keep: set[str]) -> None:
        for buckets in (self._requests, self._tokens):
            for kid in [k for k in buckets if k not in keep]:
                del buckets[kid]

    def _level(self, buckets: dict[str, _Bucket], kid: str, rate: float, capacity: float, now: float) -> _Bucket:
        b = buckets.get(kid)
        if b is None:
            b = buckets[kid] = _Bucket(capacity, now)
        else:
            b.level = min(capacity, b.level + (now - b.at) * rate)
            b.at = now
        return b

    def take(self, kid: str, entry: KeyEntry, tokens: int) -> tuple[str, float] | None:
        """None when admitted (and charged), else (which limit, seconds until it would admit)."""
        now = self._clock()
        if entry.requests_per_s is not None:
            rate = entry.requests_per_s / self.routers
            req = self._level(self._requests, kid, rate, max(1.0, rate), now)
            if req.level < 1.0:
                return "requests", (1.0 - req.level) / rate
        if entry.tokens_per_min is not None:
            share = entry.tokens_per_min / self.routers
            tok = self._level(self._tokens, kid, share / 60.0, share, now)
            if tok.level <= 0.0:
                return "tokens", (1e-9 - tok.level) / (share / 60.0)
            tok.level -= tokens
        if entry.requests_per_s is not None:
            self._requests[kid].level -= 1.0
        return None


def estimate_tokens(body: bytes) -> int:
    """What a request counts against tokens/min before it runs (contract/apikeys.py)."""
    completion = apikeys.DEFAULT_COMPLETION_ESTIMATE
    doc = json_object(body)
    if doc is not None:
        for name in ("max_completion_tokens", "max_tokens"):
            value = doc.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                completion = value
                break
    return math.ceil(len(body) / apikeys.BYTES_PER_TOKEN) + completion


def _error(status: int, message: str, *, code: str, err_type: str, retry_after: float | None = None) -> web.Response:
    headers = {contract.REQUEST_ID_HEADER: uuid.uuid4().hex}
    if retry_after is not None:
        headers["Retry-After"] = str(max(1, math.ceil(retry_after)))
    body = {"error": {"message": message, "type": err_type, "param": None, "code": code}}
    return web.json_response(body, status=status, headers=headers)


class AccessControl:
    """The keys in force (refreshed in the background) and the per-key limits; `middleware` checks both."""

    def __init__(
        self,
        *,
        read: Callable[[], str | None] | None = None,
        static_key: str | None = None,
        name: str = "",
        ttl_s: float = apikeys.API_KEYS_TTL_S,
        routers: int = 1,
        batch_headroom_percent: int = 75,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if (read is None) == (static_key is None):
            raise ValueError("AccessControl needs exactly one of read (a key source) or static_key")
        self._read, self.name, self._ttl = read, name, ttl_s
        self.keys = KeySet()
        if static_key is not None:
            self.keys = KeySet({apikeys.LOCAL_KEY_ID: KeyEntry(name="local", sha256=apikeys.digest(static_key))})
        self._static = static_key is not None
        self.limits = KeyLimits(routers=routers, clock=clock)
        self.batch_headroom = batch_headroom_percent / 100.0
        self.read_errors = 0
        self._task: asyncio.Task | None = None
        self._fleet = None
        self._settings = None
        self._outcomes: Counter | None = None
        self._auth_failures: Counter | None = None

    # --- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        if self._read is not None:
            await self.refresh()
            self._task = asyncio.create_task(self._loop(), name="api keys")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def refresh(self) -> None:
        assert self._read is not None
        try:
            text = await asyncio.to_thread(self._read)
            keys = KeySet.loads(text) if text is not None else KeySet()
        except KeySetError as err:
            self.read_errors += 1
            log.error("API keys in %s are not a key set (%s); keeping the last set in force", self.name, err)
            return
        except Exception as err:  # noqa: BLE001 - throttling, network, permissions: fail static
            self.read_errors += 1
            log.warning("reading API keys from %s failed (%s); keeping the last set in force", self.name, err)
            return
        if set(keys.keys) != set(self.keys.keys):
            log.warning("API keys from %s: %d in force", self.name, len(keys.keys))
        self.keys = keys
        self.limits.forget(set(keys.keys))

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._ttl)
            await self.refresh()

    def bind(self, *, fleet, settings, registry) -> None:
        """Attach to a router: its fleet (batch admission reads its load) and its metrics registry."""
        self._fleet, self._settings = fleet, settings
        self._outcomes = Counter(
            "flotilla_router_key_requests",
            "requests per API key id: admitted, rate_limited (its own limit) or batch_shed",
            ["key_id", "outcome"],
            registry=registry,
        )
        self._auth_failures = Counter(
            "flotilla_router_auth_failures",
            "requests refused 401: missing or invalid key",
            ["reason"],
            registry=registry,
        )

    # --- per request -------------------------------------------------------------------------
    def authenticate(self, header: str | None) -> tuple[str, KeyEntry] | str:
        """(key id, entry), or the reason for a 401: "missing" or "invalid"."""
        if not header:
            return "missing"
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return "missing"
        if self._static:
            entry = self.keys.keys[apikeys.LOCAL_KEY_ID]
            return (apikeys.LOCAL_KEY_ID, entry) if entry.matches(token) else "invalid"
        found = self.keys.lookup(token)
        return found if found is not None else "invalid"

    def batch_has_room(self) -> bool:
        """True while some routable unit is below the batch headroom of its caps (or none is routable:
        the proxy then answers 503 itself)."""
        fleet, s = self._fleet, self._settings
        if fleet is None or s is None:
            return True
        max_outstanding, max_queue = s.max_outstanding_per_unit, s.max_queue_depth
        if fleet.admission is not None:
            max_outstanding, max_queue = fleet.admission.caps(max_outstanding, max_queue)
        h = self.batch_headroom
        out_cap, queue_cap = max_outstanding * h, max_queue * h

        def room(u) -> bool:
            # ... and, where the unit reports its expected wait, below that share of its queue timeout
            # (a unit past the whole of it is full: runtime/router/overload.py)
            waiting = u.queue_timeout_s > 0 and u.wait_s >= u.queue_timeout_s * h
            return u.outstanding < out_cap and u.queue_depth < queue_cap and not waiting

        routable = [u for u in fleet.members.values() if u.routable]
        return not routable or any(room(u) for u in routable)

    def _count(self, kid: str, outcome: str) -> None:
        if self._outcomes is not None:
            self._outcomes.labels(kid, outcome).inc()

    @web.middleware
    async def middleware(self, request: web.Request, handler) -> web.StreamResponse:
        if not request.path.startswith("/v1/"):
            return await handler(request)
        found = self.authenticate(request.headers.get("Authorization"))
        if isinstance(found, str):
            if self._auth_failures is not None:
                self._auth_failures.labels(found).inc()
            message = _MISSING if found == "missing" else _INVALID
            code = "missing_api_key" if found == "missing" else "invalid_api_key"
            return _error(401, message, code=code, err_type="invalid_request_error")
        kid, entry = found
        # The unit never sees the key: the request goes on without Authorization.
        headers = CIMultiDict(request.headers)
        headers.popall("Authorization", None)
        request = request.clone(headers=headers)
        request[KEY_ID] = kid
        tokens = 0
        if entry.tokens_per_min is not None:
            timeout = self._settings.idle_stream_timeout_s if self._settings is not None else 30.0
            try:
                async with asyncio.timeout(timeout):
                    body = await request.read()
            except (TimeoutError, web.HTTPException, ConnectionError):
                return _error(
                    408,
                    f"the request body did not arrive whole within {timeout:g} s: send it whole",
                    code="body_timeout",
                    err_type="invalid_request_error",
                )
            tokens = estimate_tokens(body)
        if entry.priority == "batch" and not self.batch_has_room():
            self._count(kid, "batch_shed")
            retry = self._settings.retry_after_s if self._settings is not None else 1
            return _error(
                429,
                "the fleet is busy and batch-class keys are shed first; retry after the Retry-After delay",
                code="batch_shed",
                err_type="rate_limit_error",
                retry_after=retry,
            )
        refused = self.limits.take(kid, entry, tokens)
        if refused is not None:
            which, wait = refused
            self._count(kid, "rate_limited")
            limit = (
                f"{entry.requests_per_s:g} requests/s" if which == "requests" else f"{entry.tokens_per_min} tokens/min"
            )
            return _error(
                429,
                f"rate limit of this API key reached ({limit}); retry after the Retry-After delay",
                code="rate_limit_exceeded",
                err_type="rate_limit_error",
                retry_after=wait,
            )
        self._count(kid, "admitted")
        return await handler(request)


def make_access(settings) -> AccessControl | None:
    """The access control the settings ask for, None when the router is open (no keys configured)."""
    common = dict(
        ttl_s=settings.api_keys_ttl_s,
        routers=settings.limit_routers,
        batch_headroom_percent=settings.batch_headroom_percent,
    )
    if settings.api_key:
        return AccessControl(static_key=settings.api_key, name="--api-key", **common)
    if settings.api_keys_secret:
        secret = SecretSource(settings.api_keys_secret, region=settings.cloudmap_region)
        return AccessControl(read=secret.read, name=secret.name, **common)
    if settings.api_keys_file:
        source = FileSource(settings.api_keys_file)
        return AccessControl(read=source.read, name=source.name, **common)
    return None
