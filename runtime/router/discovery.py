"""Where the unit members are: a static list of leaders (local runs, tests) or AWS Cloud Map (every member).

Discovery only answers "which member URLs exist right now"; whether one leads and is routable is the
poller's business. The router re-reads discovery continuously, so units come and go without a restart.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import contract

log = logging.getLogger("flotilla.router.discovery")


@dataclass(frozen=True)
class UnitEndpoint:
    url: str  # the member's base URL, e.g. http://10.0.1.5:8000
    unit: str = ""  # provisional unit name (Cloud Map: the ECS service), "" if unknown


class DiscoveryError(RuntimeError):
    """Discovery could not be read this pass; the router keeps the last good list."""


class Discovery(Protocol):
    def discover(self) -> list[UnitEndpoint]:
        """Blocking; the router runs it in a worker thread."""
        ...


def normalise_url(url: str) -> str:
    return url.strip().rstrip("/")


class StaticDiscovery:
    """Units given on the command line, optionally plus a file re-read on every pass.

    The file holds one leader URL per line (blank lines and # comments ignored); editing it adds or
    removes units from a running router, which is how local rolling updates are driven.
    """

    def __init__(self, *, units: tuple[str, ...] = (), units_file: str | None = None) -> None:
        self._units = tuple(normalise_url(u) for u in units if u.strip())
        self._file = Path(units_file) if units_file else None

    def discover(self) -> list[UnitEndpoint]:
        urls = list(self._units)
        if self._file is not None:
            try:
                text = self._file.read_text()
            except OSError as exc:
                raise DiscoveryError(f"cannot read units file {self._file}: {exc}") from exc
            for line in text.splitlines():
                line = line.split("#", 1)[0].strip()
                if line:
                    urls.append(normalise_url(line))
        seen: dict[str, UnitEndpoint] = {}
        for url in urls:
            seen.setdefault(url, UnitEndpoint(url=url))
        return list(seen.values())


class CloudMapDiscovery:
    """Every unit member ECS registered in a Cloud Map service; no role filter (docs/discovery.md).

    ECS registers each task with only its address (contract.CLOUDMAP_ATTR_IPV4, maybe
    CLOUDMAP_ATTR_PORT) and its ECS service (one per unit): a member's role is known only after
    rendezvous, so the router learns it from the member's /health/ready and routes to leaders only
    (fleet.Unit.apply_report). A port-less instance serves on contract.NODE_API_PORT.
    """

    def __init__(self, *, namespace: str, service: str, client=None, region: str | None = None) -> None:
        if client is None:
            import boto3  # noqa: PLC0415 - imported here so static runs do not pay boto3's import time

            client = boto3.client("servicediscovery", region_name=region)
        self._client = client
        self._namespace = namespace
        self._service = service

    def discover(self) -> list[UnitEndpoint]:
        try:
            # HealthStatus=ALL: the router's own polling decides routability, not Route 53 checks
            resp = self._client.discover_instances(
                NamespaceName=self._namespace, ServiceName=self._service, HealthStatus="ALL", MaxResults=1000
            )
        except Exception as exc:  # botocore errors and endpoint failures alike: keep the last list
            raise DiscoveryError(f"DiscoverInstances({self._namespace}/{self._service}) failed: {exc}") from exc
        endpoints: dict[str, UnitEndpoint] = {}
        for inst in resp.get("Instances", []):
            attrs = inst.get("Attributes", {})
            ip = attrs.get(contract.CLOUDMAP_ATTR_IPV4)
            if not ip:
                log.warning(
                    "Cloud Map instance %s has no %s; skipped", inst.get("InstanceId"), contract.CLOUDMAP_ATTR_IPV4
                )
                continue
            port = attrs.get(contract.CLOUDMAP_ATTR_PORT) or str(contract.NODE_API_PORT)
            url = f"http://{ip}:{port}"
            # The ECS service names the unit until the member's own /health/ready says which it is.
            endpoints[url] = UnitEndpoint(url=url, unit=attrs.get(contract.CLOUDMAP_ATTR_ECS_SERVICE, ""))
        return list(endpoints.values())
