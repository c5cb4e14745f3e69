"""Where the unit leaders are: a static list (local runs, tests) or AWS Cloud Map (DiscoverInstances).

Discovery only answers "which leader URLs exist right now"; whether a unit is routable is the
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
    url: str                       # the leader's base URL, e.g. http://10.0.1.5:8000
    unit: str = ""                 # unit id as registered (Cloud Map attribute), "" if unknown
    revision: str = ""


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
    """Unit leaders registered in a Cloud Map service (attribute role=leader).

    Each unit member registers an instance with the attributes contract.ATTR_UNIT, ATTR_ROLE and
    ATTR_REVISION plus its IPv4 address; the router talks to leaders at that address and
    contract.NODE_API_PORT (or the AWS_INSTANCE_PORT the member registered).
    """

    def __init__(self, *, namespace: str, service: str, client=None, region: str | None = None) -> None:
        if client is None:
            import boto3  # imported here so static runs do not pay boto3's import time

            client = boto3.client("servicediscovery", region_name=region)
        self._client = client
        self._namespace = namespace
        self._service = service

    def discover(self) -> list[UnitEndpoint]:
        try:
            # HealthStatus=ALL: the router's own polling decides routability, not Route 53 checks
            resp = self._client.discover_instances(
                NamespaceName=self._namespace, ServiceName=self._service,
                QueryParameters={contract.ATTR_ROLE: "leader"}, HealthStatus="ALL", MaxResults=1000)
        except Exception as exc:  # botocore errors and endpoint failures alike: keep the last list
            raise DiscoveryError(
                f"DiscoverInstances({self._namespace}/{self._service}) failed: {exc}") from exc
        endpoints: dict[str, UnitEndpoint] = {}
        for inst in resp.get("Instances", []):
            attrs = inst.get("Attributes", {})
            if attrs.get(contract.ATTR_ROLE) != "leader":
                continue  # QueryParameters already filters; this keeps the rule explicit
            ip = attrs.get("AWS_INSTANCE_IPV4")
            if not ip:
                log.warning("Cloud Map instance %s has no AWS_INSTANCE_IPV4; skipped",
                            inst.get("InstanceId"))
                continue
            port = attrs.get("AWS_INSTANCE_PORT") or str(contract.NODE_API_PORT)
            url = f"http://{ip}:{port}"
            endpoints[url] = UnitEndpoint(url=url, unit=attrs.get(contract.ATTR_UNIT, ""),
                                          revision=attrs.get(contract.ATTR_REVISION, ""))
        return list(endpoints.values())
