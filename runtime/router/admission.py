"""The router's side of `flotilla shed`: reads the fleet-wide admission limit (contract/admission.py)
from its SSM parameter every few seconds and applies it to each request: a share admitted at all,
and lower per-unit caps for the balancer. Reading fails static: the last value read stays in force.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable

from contract.admission import AdmissionError, AdmissionLimit

log = logging.getLogger("flotilla.router.admission")


class ParameterSource:
    """An SSM String parameter: its value, or None when it does not exist (no limit).

    Parameter Store throughput is shared by GetParameter, GetParameters and PutParameter per account
    and Region (Systems Manager user guide, parameter-store-throughput.html): with the default
    interval of 10 s even the largest router fleet (1,000 tasks) reads 100 times a second, so an
    account close to its quota should raise --admission-interval or enable higher throughput. A
    throttled read keeps the last value (AdmissionControl)."""

    def __init__(self, name: str, *, client=None, region: str | None = None) -> None:
        if client is None:
            import boto3  # noqa: PLC0415 - only routers given a parameter pay boto3's import time

            client = boto3.client("ssm", region_name=region)
        self._client, self.name = client, name

    def read(self) -> str | None:
        try:
            return str(self._client.get_parameter(Name=self.name)["Parameter"]["Value"])
        except self._client.exceptions.ParameterNotFound:
            return None


class AdmissionControl:
    """The limit in force, refreshed by a background task; every method is safe to call per request."""

    def __init__(self, read: Callable[[], str | None], *, interval_s: float, name: str = "") -> None:
        self._read, self._interval, self.name = read, interval_s, name
        self.limit: AdmissionLimit | None = None
        self.read_errors = 0
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        await self.refresh()
        self._task = asyncio.create_task(self._loop(), name="admission")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def refresh(self) -> None:
        try:
            text = await asyncio.to_thread(self._read)
            limit = AdmissionLimit.loads(text) if text is not None else None
        except AdmissionError as err:
            self.read_errors += 1
            log.error("admission parameter %s is not a limit (%s); keeping the last one in force", self.name, err)
            return
        except Exception as err:  # noqa: BLE001 - throttling, network, permissions: fail static
            self.read_errors += 1
            log.warning("reading admission parameter %s failed (%s); keeping the last one in force", self.name, err)
            return
        if limit is not None and not limit.limits_anything:
            limit = None
        if limit != self.limit:
            log.warning("admission limit %s: %s", "cleared" if limit is None else "now", limit.dumps() if limit else "")
        self.limit = limit

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            await self.refresh()

    def admits(self) -> bool:
        limit = self.limit
        return limit is None or limit.admit_percent >= 100 or random.random() * 100 < limit.admit_percent

    def caps(self, max_outstanding_per_unit: int, max_queue_depth: int) -> tuple[int, int]:
        limit = self.limit
        if limit is None:
            return max_outstanding_per_unit, max_queue_depth
        return limit.caps(max_outstanding_per_unit, max_queue_depth)
