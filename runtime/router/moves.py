"""Mid-stream moves: a resumable stream that broke after its first byte continues on another unit
from the tokens its client already has (runtime/router/resume.py builds the continuation)."""

from __future__ import annotations

import asyncio
import logging

import aiohttp
from aiohttp import web

import contract
from runtime.router import balance
from runtime.router.fleet import Fleet, Member
from runtime.router.metrics import RouterMetrics
from runtime.router.resume import StreamLedger
from runtime.router.settings import RouterSettings

log = logging.getLogger("flotilla.router")

# A resumable stream a unit ended for want of a batch slot (server.MOVABLE_ENDINGS): "handover_" + its code.
HANDOVER_QUEUE_TIMEOUT = "handover_" + contract.BUSY_CODE_QUEUE_TIMEOUT
MOVE_WAIT_S = 0.25  # how often a stream waiting to move looks for a free slot again (a report period)


class StreamMover:
    """Finds a unit to continue a broken stream on, within the stream's move budget."""

    def __init__(self, settings: RouterSettings, fleet: Fleet, metrics: RouterMetrics) -> None:
        self.settings = settings
        self.fleet = fleet
        self.metrics = metrics

    async def move(
        self,
        ledger: StreamLedger,
        failed: Member,
        request: web.Request,
        body: bytes,
        headers: dict[str, str],
        request_id: str,
        reason: str,
        key: balance.RequestKey | None = None,
    ) -> tuple[Member, aiohttp.ClientResponse] | None:
        """Continue a broken stream on another unit: the original body plus the tokens its client has,
        sent to units other than the ones it already ran on, until one answers 200 or the move budget
        is spent. The new unit is counted outstanding until the caller releases it."""
        if reason in ("idle_timeout", "stream_broken"):
            failed.mark_unready(reason)  # hung or gone: no new request goes there before its next report
        continued = ledger.continuation(body)
        if continued is None:
            return None
        deadline = await self._deadline(ledger, failed, reason)
        if deadline is None:
            return None
        headers = {**headers, contract.CONTINUATION_HEADER: "1"}
        return await self._continue(ledger, failed, request, continued, headers, request_id, reason, key, deadline)

    async def _deadline(self, ledger: StreamLedger, failed: Member, reason: str) -> float | None:
        """Until when the stream may wait for a unit with a free slot; None once that wait is over."""
        loop = asyncio.get_running_loop()
        if reason == HANDOVER_QUEUE_TIMEOUT and not ledger.since_move:
            # The unit had no batch slot free within its queue timeout (its load report and the move
            # raced): full, not failed. Its move is given back and the unit may take the stream once
            # a slot frees, within the wait that began when the stream first had to move.
            if ledger.avoid and ledger.avoid[-1] is failed and ledger.moves:
                ledger.avoid.pop()
                ledger.moves -= 1
            if ledger.move_deadline is None:
                ledger.move_deadline = loop.time() + self.settings.first_byte_timeout_s
            if loop.time() >= ledger.move_deadline:
                return None  # waited its whole bound: a unit that reports free slots it never gives ends here
            await asyncio.sleep(MOVE_WAIT_S)
            return ledger.move_deadline
        ledger.avoid.append(failed)
        ledger.move_deadline = loop.time() + self.settings.first_byte_timeout_s
        return ledger.move_deadline

    async def _continue(
        self,
        ledger: StreamLedger,
        failed: Member,
        request: web.Request,
        continued: bytes,
        headers: dict[str, str],
        request_id: str,
        reason: str,
        key: balance.RequestKey | None,
        deadline: float,
    ) -> tuple[Member, aiohttp.ClientResponse] | None:
        # Busy is not broken, for a move either: when no other unit has a free batch slot (or the
        # one asked answers 429), the stream waits for a slot to free as their answers end, up to
        # --first-byte-timeout, the bound on a unit's silence before a first byte, and a refusal
        # for being full does not spend the move budget. A continuation goes only to a unit with a
        # free slot: queued behind a full batch it could time out in the unit's queue, an error
        # the client would see. Without this, losing one unit of a full fleet failed every stream
        # on it: the survivors were full at that moment.
        s = self.settings
        loop = asyncio.get_running_loop()
        while ledger.moves < s.max_moves:
            # By the same policy as a new request: the unit its cache key prefers, among the rest,
            # may hold the prompt's prefix and re-prefill only the generated part.
            full = self.fleet.full_units(tuple(ledger.avoid))
            pick = self.fleet.pick(tuple(ledger.avoid) + tuple(full), key)
            member = pick.unit
            if member is None and (full or pick.reason == "saturated") and loop.time() < deadline:
                await asyncio.sleep(MOVE_WAIT_S)
                continue
            if member is None or member.session is None or member.session.closed:
                return None
            ledger.moves += 1
            ledger.avoid.append(member)
            self.metrics.retries.labels(f"move_{reason}").inc()
            log.warning(
                "request %s: %s on unit %s after %d token(s); continuing on unit %s (move %d of %d)",
                request_id,
                reason,
                failed.unit,
                ledger.sent,
                member.unit,
                ledger.moves,
                s.max_moves,
            )
            member.outstanding += 1
            try:
                async with asyncio.timeout(s.first_byte_timeout_s):
                    upstream = await member.session.request(
                        request.method,
                        member.url + request.rel_url.raw_path_qs,
                        headers=headers,
                        data=continued,
                        allow_redirects=False,
                    )
            except (aiohttp.ClientError, OSError, TimeoutError):
                member.outstanding -= 1
                continue
            if upstream.status == 200 and upstream.headers.get("Content-Type", "").startswith("text/event-stream"):
                ledger.since_move = 0
                return member, upstream
            # Refused (busy, draining, not ready): try the next unit. Busy is not broken, so the
            # refusal leaves the unit's routability to its own reports.
            upstream.release()
            member.outstanding -= 1
            if upstream.status == 429 and loop.time() < deadline:
                ledger.moves -= 1  # full, not failed: the unit may take it once a slot frees
                ledger.avoid.remove(member)
                await asyncio.sleep(MOVE_WAIT_S)
        return None
