"""The router's settings: one validated object built once (from flags and environment) and passed down.

Every knob has a default that suits a small fleet; bad values fail at start-up with a message naming
the setting, the value and the allowed range.
"""

from __future__ import annotations

from dataclasses import dataclass

import contract


class SettingsError(ValueError):
    """A router setting is out of range or inconsistent; the message names it and the fix."""


@dataclass(frozen=True, kw_only=True)
class RouterSettings:
    host: str = "0.0.0.0"
    port: int = contract.ROUTER_PORT
    # discovery: "static" (units and/or units_file) or "cloudmap" (namespace + service)
    discovery: str = "static"
    units: tuple[str, ...] = ()                 # leader base URLs, e.g. http://10.0.1.5:8000
    units_file: str | None = None               # static list in a file, re-read every discovery pass
    cloudmap_namespace: str | None = None
    cloudmap_service: str | None = None
    cloudmap_region: str | None = None
    discovery_interval_s: float = 2.0
    # health and load polling of every unit
    poll_interval_s: float = 0.25
    poll_timeout_s: float = 1.0
    # proxying
    connect_timeout_s: float = 1.0
    first_byte_timeout_s: float = 60.0          # prefill of a long prompt on a busy unit
    idle_stream_timeout_s: float = 30.0         # longest silence between two chunks of a response
    max_attempts: int = 3                       # units tried per request while nothing reached the client
    max_body_bytes: int = 4 * 1024 * 1024
    # shedding: a unit is saturated when either bound is reached
    max_outstanding_per_unit: int = 64          # requests this router has in flight to one unit
    max_queue_depth: int = 32                   # queue depth the unit itself reports
    retry_after_s: int = 1
    access_log: bool = True                     # one JSON line per routed request on stderr
    ready_units_interval_s: float = 60.0        # ReadyUnits EMF lines on stdout (docs/observability.md)
    # SIGTERM drain
    drain_grace_s: float = 5.0                  # keep serving after /health turns 503 (ALB notices)
    drain_timeout_s: float = 120.0              # give up waiting for in-flight requests after this

    def __post_init__(self) -> None:
        if self.discovery not in ("static", "cloudmap"):
            raise SettingsError(
                f"discovery={self.discovery!r} is not supported: use 'static' (with --units or "
                f"{contract.ENV_UNITS}) or 'cloudmap' (with a namespace and service)")
        if self.discovery == "static" and not self.units and not self.units_file:
            raise SettingsError(
                f"static discovery needs units: pass --units http://host:port[,...] or set "
                f"{contract.ENV_UNITS}, or pass --units-file")
        if self.discovery == "cloudmap" and not (self.cloudmap_namespace and self.cloudmap_service):
            raise SettingsError(
                f"cloudmap discovery needs {contract.ENV_CLOUDMAP_NAMESPACE} and "
                f"{contract.ENV_CLOUDMAP_SERVICE} (or --cloudmap-namespace/--cloudmap-service)")
        for url in self.units:
            if not (url.startswith("http://") or url.startswith("https://")) or url.count(":") < 2:
                raise SettingsError(
                    f"unit {url!r} is not a base URL: write it as http://host:port (e.g. "
                    f"http://127.0.0.1:{contract.NODE_API_PORT})")
        if not 0 < self.port < 65536 and self.port != 0:
            raise SettingsError(f"port={self.port} must be 0..65535")
        _positive("poll_interval_s", self.poll_interval_s, 0.01, 60)
        _positive("poll_timeout_s", self.poll_timeout_s, 0.01, 60)
        _positive("discovery_interval_s", self.discovery_interval_s, 0.05, 3600)
        _positive("connect_timeout_s", self.connect_timeout_s, 0.01, 60)
        _positive("first_byte_timeout_s", self.first_byte_timeout_s, 0.01, 3600)
        _positive("idle_stream_timeout_s", self.idle_stream_timeout_s, 0.01, 3600)
        _positive("max_attempts", self.max_attempts, 1, 16)
        _positive("max_outstanding_per_unit", self.max_outstanding_per_unit, 1, 100_000)
        _positive("max_queue_depth", self.max_queue_depth, 1, 100_000)
        _positive("max_body_bytes", self.max_body_bytes, 1024, 1 << 30)
        _positive("retry_after_s", self.retry_after_s, 1, 3600)
        _positive("ready_units_interval_s", self.ready_units_interval_s, 0.05, 3600)
        _positive("drain_grace_s", self.drain_grace_s, 0, 3600)
        _positive("drain_timeout_s", self.drain_timeout_s, 0, 86400)


def _positive(name: str, value: float, low: float, high: float) -> None:
    if not low <= value <= high:
        raise SettingsError(f"{name}={value} is out of range: allowed {low}..{high}")
