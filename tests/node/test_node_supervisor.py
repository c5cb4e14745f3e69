"""The supervisor's reaction to a membership change (what ECS rendezvous reports when a task dies or a
replacement arrives), in-process with the model-free `echo` engine: the unit re-forms, the re-form
counts against the restart budget, and a drain still ends cleanly."""

from __future__ import annotations

import asyncio
import time

import pytest
from memberships import membership
from testnet import free_port

from runtime.membership import Membership
from runtime.node.metrics import NodeMetrics
from runtime.node.settings import NodeSettings, load_settings
from runtime.node.supervisor import HELD_UP_S, HeardClock, UnitSupervisor


class FlippingRendezvous:
    """One member; reports a membership change when told to."""

    def __init__(self, port: int) -> None:
        self.m = membership([("127.0.0.1", port)], dist_port=free_port())
        self.flip = False
        self.joins = 0

    async def join(self) -> Membership:
        self.joins += 1
        return self.m

    async def changed(self, current: Membership) -> bool:
        if self.flip:
            self.flip = False
            return True
        return False


def echo_leader(peers: str, *flags: str) -> NodeSettings:
    """Rank 0 of unit u at revision r over the echo engine, its peers `peers`, with `flags` added."""
    return load_settings(
        ["--engine", "echo", "--peers", peers, "--rank", "0", "--unit", "u", "--revision", "r", *flags], {}
    )


async def wait_until(pred, timeout: float = 30.0) -> None:
    async def loop():
        while not pred():
            await asyncio.sleep(0.05)

    await asyncio.wait_for(loop(), timeout)


def test_a_membership_change_reforms_the_unit_and_counts_against_the_budget():
    async def scenario():
        port = free_port()
        s = echo_leader(f"127.0.0.1:{port}", "--rendezvous-watch", "0.2")
        rdv = FlippingRendezvous(port)
        sup = UnitSupervisor(settings=s, rendezvous=rdv, metrics=NodeMetrics())
        run = asyncio.create_task(sup.run())
        await wait_until(sup.ready)
        first = sup.formation
        rdv.flip = True
        await wait_until(lambda: not sup.ready())
        await wait_until(sup.ready)
        assert sup.formation != first and rdv.joins == 2 and len(sup._restarts) == 1
        assert sup.live()
        sup.begin_drain()
        assert await asyncio.wait_for(run, 30) == 0
        assert sup.state == "stopped" and sup.engine is None

    asyncio.run(scenario())


def test_a_wedged_engine_process_is_detected_and_the_unit_reforms():
    import os
    import signal

    async def scenario():
        port = free_port()
        s = echo_leader(f"127.0.0.1:{port}", "--engine-stall", "1")
        sup = UnitSupervisor(settings=s, rendezvous=FlippingRendezvous(port), metrics=NodeMetrics())
        run = asyncio.create_task(sup.run())
        await wait_until(sup.ready)
        first, pid = sup.formation, sup.engine.pid
        os.kill(pid, signal.SIGSTOP)  # alive but silent: a wedged engine
        await wait_until(lambda: sup.formation not in (None, first) and sup.ready())
        assert len(sup._restarts) == 1
        with __import__("pytest").raises(ProcessLookupError):
            os.kill(pid, 0)  # the wedged process was killed, not left behind
        sup.begin_drain()
        assert await asyncio.wait_for(run, 30) == 0

    asyncio.run(scenario())


def test_an_engine_that_reports_but_holds_a_request_without_a_token_is_hung_and_the_unit_reforms():
    """The engine process keeps reporting its load, so it is not silent, but the request it holds gets
    no token (here: a 60 s step against a 1 s bound). Out of routing since the progress stall bound,
    the unit would never come back by itself: past FLOTILLA_ENGINE_STALL_S it re-forms, and the held
    request ends with an error instead of waiting on."""

    async def scenario():
        port = free_port()
        s = echo_leader(f"127.0.0.1:{port}", "--engine-stall", "1", "--echo-step", "60", "--canary-idle", "0")
        sup = UnitSupervisor(settings=s, rendezvous=FlippingRendezvous(port), metrics=NodeMetrics())
        run = asyncio.create_task(sup.run())
        await wait_until(sup.ready)
        first, engine = sup.formation, sup.engine
        held = engine.submit(
            "r1", correlation_id="", prompt="x", max_tokens=1, default_max_tokens=1, temperature=0.0, top_p=1.0
        )
        await wait_until(lambda: sup.formation not in (None, first) and sup.ready())
        assert len(sup._restarts) == 1
        events = [ev async for ev in engine.events(held)]
        assert events[-1].kind == "broken", events  # ended, not left waiting for a token
        assert engine.held_without_progress_s() == 0.0  # the old engine holds nothing any more
        sup.begin_drain()
        assert await asyncio.wait_for(run, 30) == 0

    asyncio.run(scenario())


class StandInFollowers:
    """HTTP servers answering the handshake's status path as waiting followers would; a `slow` one
    never answers. Records, in order, each poll's arrival and each poll the leader gave up on."""

    def __init__(self, ranks: list[int], slow: set[int], world_size: int) -> None:
        self.ranks, self.slow, self.world_size = ranks, slow, world_size
        self.ports = {r: free_port() for r in ranks}
        self.log: list[tuple[str, int]] = []
        self._runners = []

    def _status(self, rank: int):
        from aiohttp import web

        from runtime.node.handshake import Load, MemberStatus

        async def handle(_request):
            self.log.append(("poll", rank))
            if rank in self.slow:
                try:
                    await asyncio.sleep(60)
                except asyncio.CancelledError:
                    self.log.append(("gave_up", rank))
                    raise
            body = MemberStatus(
                ready=False,
                state="forming",
                unit="u",
                revision="r",
                rank=rank,
                world_size=self.world_size,
                role="follower",
                cell="",
                load=Load(),
                boot_id=f"boot-{rank}",
                formation=None,
                offer=None,
                draining=False,
                engine_alive=False,
                engine_ready=False,
            )
            return web.json_response(body.to_dict())

        return handle

    async def start(self) -> None:
        from aiohttp import web

        from runtime.node.handshake import STATUS_PATH

        for r in self.ranks:
            app = web.Application()
            app.router.add_get(STATUS_PATH, self._status(r))
            runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", self.ports[r]).start()
            self._runners.append(runner)

    async def stop(self) -> None:
        for runner in self._runners:
            await runner.cleanup()


def test_the_leader_polls_its_followers_at_once_and_a_slow_one_delays_no_other():
    async def scenario():
        followers = StandInFollowers([1, 2, 3], slow={1, 2}, world_size=4)
        await followers.start()
        port = free_port()
        addresses = [("127.0.0.1", port)] + [("127.0.0.1", p) for _, p in sorted(followers.ports.items())]
        peers = ",".join(f"{host}:{p}" for host, p in addresses)
        s = echo_leader(peers)
        rdv = FlippingRendezvous(port)
        rdv.m = membership(addresses, dist_port=free_port())
        sup = UnitSupervisor(settings=s, rendezvous=rdv, metrics=NodeMetrics())
        run = asyncio.create_task(sup.run())
        try:
            await wait_until(lambda: sum(1 for e in followers.log if e == ("poll", 3)) >= 2)
        finally:
            sup.begin_drain()
            assert await asyncio.wait_for(run, 30) == 0
            await followers.stop()
        return followers.log

    log = asyncio.run(scenario())
    first_give_up = log.index(next(e for e in log if e[0] == "gave_up"))
    second_tick = [i for i, e in enumerate(log) if e == ("poll", 3)][1]
    # Every follower was asked before the leader gave up on any: the polls run at once.
    assert {e for e in log[:first_give_up]} == {("poll", 1), ("poll", 2), ("poll", 3)}, log
    # Both slow polls end at the tick's one deadline, before the next tick asks again.
    assert {("gave_up", 1), ("gave_up", 2)} <= set(log[:second_tick]), log


def test_the_heard_clock_does_not_count_a_wait_this_member_was_held_up_in():
    """HeardClock: a wait that ends more than HELD_UP_S past its own bound (here the loop itself blocked,
    as a stopped process is) is time the member could not hear its peers; a wait within its bound is not."""

    async def blocked(seconds: float) -> str:
        time.sleep(seconds)  # the whole loop held up, as when the node's process is stopped
        return "answer"

    async def failing() -> None:
        time.sleep(HELD_UP_S + 0.3)
        raise TimeoutError("no answer")

    async def scenario() -> HeardClock:
        clock = HeardClock()
        assert await clock.within(asyncio.sleep(0, "quick"), 1.0) == "quick"
        assert clock.lost == 0.0
        assert await clock.within(blocked(HELD_UP_S + 0.3), 0.1) == "answer"
        first = clock.lost
        assert first >= HELD_UP_S + 0.2  # the overrun past the 0.1 s bound, whole
        with pytest.raises(TimeoutError):
            await clock.within(failing(), 0.0)  # a wait that fails is counted too
        assert clock.lost >= first + HELD_UP_S + 0.3
        return clock

    clock = asyncio.run(scenario())
    assert clock.now() <= time.monotonic() - clock.lost  # the clock runs behind by exactly what was lost
