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
class MemberEndpoint:
    url: str  # the member's base URL, e.g. http://10.0.1.5:8000
    unit: str = ""  # provisional unit name (Cloud Map: the ECS service), "" if unknown


class DiscoveryError(RuntimeError):
    """Discovery could not be read this pass; the router keeps the last good list."""


class Discovery(Protocol):
    def discover(self) -> list[MemberEndpoint]:
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

    def discover(self) -> list[MemberEndpoint]:
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
        seen: dict[str, MemberEndpoint] = {}
        for url in urls:
            seen.setdefault(url, MemberEndpoint(url=url))
        return list(seen.values())


# DiscoverInstances returns at most this many instances and has no pagination (Cloud Map API reference,
# DiscoverInstances: MaxResults 1..1000, response members Instances and InstancesRevision only). The
# stacks keep every service below it (one service per cell, stacks/config.py checks the arithmetic).
DISCOVER_MAX_RESULTS = 1000


# IAM's refusal of a Cloud Map action: one of the errors common to every action (Cloud Map API
# Reference, "Common Errors", https://docs.aws.amazon.com/cloud-map/latest/api/CommonErrors.html; the
# list every AWS API reference shares, e.g. Amazon Transcribe's and Amazon DocumentDB's "Common Errors"
# pages: "AccessDeniedException: You do not have sufficient access to perform this action. HTTP Status
# Code: 400").
ACCESS_DENIED = "AccessDeniedException"


def _refused(exc: Exception) -> bool:
    """Whether Cloud Map refused the call for want of permission: botocore raises a service's error
    as a ClientError whose response["Error"]["Code"] is the service's code; the message is free text
    and names nothing reliably."""
    from botocore.exceptions import ClientError  # noqa: PLC0415 - loaded already once a Cloud Map client exists

    return isinstance(exc, ClientError) and exc.response.get("Error", {}).get("Code") == ACCESS_DENIED


class CloudMapDiscovery:
    """Every unit member ECS registered in the cells' Cloud Map services; no role filter (docs/discovery.md).

    ECS registers each task with only its address (contract.CLOUDMAP_ATTR_IPV4, maybe
    CLOUDMAP_ATTR_PORT) and its ECS service (one per unit): a member's role is known only after
    rendezvous, so the router learns it from the member itself and routes to leaders only
    (fleet.Member.apply_report). A port-less instance serves on contract.NODE_API_PORT.

    One service per cell: each pass asks DiscoverInstancesRevision per service (its own, higher
    account quota) and reads a service's instances again only when its revision moved, which
    registering or deregistering an instance does (API reference, DiscoverInstancesRevision).
    """

    def __init__(
        self, *, namespace: str, services: tuple[str, ...] | str, client=None, region: str | None = None
    ) -> None:
        if client is None:
            import boto3  # noqa: PLC0415 - imported here so static runs do not pay boto3's import time

            client = boto3.client("servicediscovery", region_name=region)
        self._client = client
        self._namespace = namespace
        self._services = (services,) if isinstance(services, str) else tuple(services)
        # per service: (revision, endpoints) of the last full read
        self._seen: dict[str, tuple[int | None, list[MemberEndpoint]]] = {}
        self._revision_refused = False  # the role may lack DiscoverInstancesRevision: read in full
        self.calls = {"DiscoverInstancesRevision": 0, "DiscoverInstances": 0}

    def discover(self) -> list[MemberEndpoint]:
        endpoints: dict[str, MemberEndpoint] = {}
        failed: list[str] = []
        for service in self._services:
            try:
                found = self._service(service)
            except DiscoveryError as exc:
                if service not in self._seen:
                    failed.append(str(exc))
                    continue
                log.warning("%s; keeping the last %d members of %s", exc, len(self._seen[service][1]), service)
                found = self._seen[service][1]
            for e in found:
                endpoints.setdefault(e.url, e)
        if failed and len(failed) == len(self._services):
            raise DiscoveryError("; ".join(failed))
        for message in failed:
            log.warning("%s; its members stay unknown until it answers", message)
        return list(endpoints.values())

    def _service(self, service: str) -> list[MemberEndpoint]:
        where = f"{self._namespace}/{service}"
        revision: int | None = None
        if not self._revision_refused:
            try:
                self.calls["DiscoverInstancesRevision"] += 1
                revision = self._client.discover_instances_revision(NamespaceName=self._namespace, ServiceName=service)[
                    "InstancesRevision"
                ]
            except Exception as exc:  # botocore errors and endpoint failures alike
                if _refused(exc):
                    log.warning("DiscoverInstancesRevision(%s) refused; reading instances in full every pass", where)
                    self._revision_refused = True
                else:
                    raise DiscoveryError(f"DiscoverInstancesRevision({where}) failed: {exc}") from exc
            seen = self._seen.get(service)
            if seen is not None and revision is not None and seen[0] == revision:
                return seen[1]
        try:
            self.calls["DiscoverInstances"] += 1
            # HealthStatus=ALL: ECS's custom health status follows the container check, which
            # passes only after a unit has been ready once; the router judges readiness itself.
            resp = self._client.discover_instances(
                NamespaceName=self._namespace,
                ServiceName=service,
                HealthStatus="ALL",
                MaxResults=DISCOVER_MAX_RESULTS,
            )
        except Exception as exc:  # botocore errors and endpoint failures alike: keep the last list
            raise DiscoveryError(f"DiscoverInstances({where}) failed: {exc}") from exc
        instances = resp.get("Instances", [])
        if len(instances) >= DISCOVER_MAX_RESULTS:
            log.error(
                "Cloud Map service %s returned %d instances, the most DiscoverInstances returns: members beyond "
                "them are invisible to the router (keep each cell under the limit, docs/discovery.md)",
                where,
                len(instances),
            )
        found: dict[str, MemberEndpoint] = {}
        for inst in instances:
            attrs = inst.get("Attributes", {})
            ip = attrs.get(contract.CLOUDMAP_ATTR_IPV4)
            if not ip:
                log.warning(
                    "Cloud Map instance %s has no %s; skipped", inst.get("InstanceId"), contract.CLOUDMAP_ATTR_IPV4
                )
                continue
            port = attrs.get(contract.CLOUDMAP_ATTR_PORT) or str(contract.NODE_API_PORT)
            url = f"http://{ip}:{port}"
            # The ECS service names the unit until the member's own report says which it is.
            found[url] = MemberEndpoint(url=url, unit=attrs.get(contract.CLOUDMAP_ATTR_ECS_SERVICE, ""))
        # A revision read before the instances: if one changed in between, the next pass reads again.
        self._seen[service] = (
            revision if revision is not None else resp.get("InstancesRevision"),
            list(found.values()),
        )
        return self._seen[service][1]
