"""Choosing a unit for a request: the fleet's pick (least loaded, or the unit its cache key prefers),
tried unit after unit while each attempt fails before its first byte, and shed when none takes it."""

from __future__ import annotations

from aiohttp import web

import contract
from runtime.router import answers, balance, intake
from runtime.router.accounting import Trace
from runtime.router.admission import AdmissionControl
from runtime.router.first_byte import FirstByte, Retry
from runtime.router.fleet import Fleet, Member
from runtime.router.metrics import RouterMetrics
from runtime.router.resume import resumable_request
from runtime.router.settings import RouterSettings


class Routing:
    """Routes one request: the upstream headers, then up to max_attempts units."""

    def __init__(
        self,
        settings: RouterSettings,
        fleet: Fleet,
        metrics: RouterMetrics,
        first_byte: FirstByte,
        admission: AdmissionControl | None,
    ) -> None:
        self.settings = settings
        self.fleet = fleet
        self.metrics = metrics
        self.first_byte = first_byte
        self.admission = admission

    async def route(
        self, request: web.Request, body: bytes, request_id: str, t0: float, trace: Trace
    ) -> web.StreamResponse:
        if self.admission is not None and not self.admission.admits():
            trace.shed = True
            return self.shed("admission", request_id)
        headers = intake.upstream_headers(request, request_id)
        key = balance.request_key(body, request.headers.get(contract.SESSION_HEADER))
        intake.tell_route_key(headers, key)
        if self.settings.max_moves and resumable_request(request.method, request.path, headers):
            headers[contract.RESUME_HEADER] = "1"
        tried: tuple[Member, ...] = ()
        refusal: web.Response | None = None
        for _ in range(self.settings.max_attempts):
            pick = self.fleet.pick(tried, key)
            member = pick.unit
            if member is None:
                if refusal is not None:
                    return refusal  # every unit we could try refused: pass the last answer on
                trace.shed = True
                return self.shed(pick.reason, request_id)
            member.outstanding += 1
            trace.attempts = len(tried) + 1
            try:
                return await self.first_byte.attempt(member, request, body, headers, request_id, t0, trace, key)
            except Retry as retry:
                self.metrics.retries.labels(retry.reason).inc()
                tried += (member,)
                refusal = retry.refusal or refusal
            finally:
                member.outstanding -= 1
                if member.removed:
                    self.fleet.retire_if_idle(member)
        if refusal is not None:
            return refusal
        return self.shed("no_unit", request_id)

    def shed(self, reason: str, request_id: str) -> web.Response:
        self.metrics.shed.labels(reason).inc()
        # Full: the wait the routable units report; otherwise the configured pause.
        retry_after = self.fleet.retry_after_s() if reason == "saturated" else self.settings.retry_after_s
        return answers.shed(reason, request_id, retry_after_s=retry_after)
