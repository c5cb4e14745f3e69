"""A request whose cancel reaches the engine process together with its submit still ends.

That is what a frozen engine sees when it resumes (a SIGSTOPped process, a step that took seconds):
the supervisor sent the request, its client left, the supervisor sent the cancel, and both lines
wait in the engine's stdin. The request must still end with exactly one error event, or the
supervisor holds its stream for good: the unit then counts as holding work without producing a
token, reports itself stalled, and never serves again (a chaos run found a unit out of routing for
two minutes after its engine was frozen for five seconds)."""

from __future__ import annotations

import asyncio
import os
import signal

from runtime.membership import Membership
from runtime.node.engine_config import EngineConfig
from runtime.node.engine_process import EngineProcess
from runtime.node.engine_protocol import Done, Error, Token
from runtime.node.settings import load_settings

SOLO = Membership(unit_id="u", revision="1", rank=0, world_size=1, dist_host="127.0.0.1", dist_port=1)
CONFIG = EngineConfig.from_settings(
    load_settings(["--engine", "echo", "--peers", "127.0.0.1:1", "--rank", "0"], {}), SOLO
)
REQUEST = dict(correlation_id="", prompt="hello", max_tokens=4, default_max_tokens=4, temperature=0.0, top_p=1.0)


async def _ending(e: EngineProcess, stream) -> list:
    async with asyncio.timeout(30):
        return [ev async for ev in e.events(stream)]


def test_a_request_cancelled_while_its_engine_was_frozen_ends_and_the_engine_holds_nothing_after():
    async def run() -> None:
        e = EngineProcess(config=CONFIG)
        await e.start()
        try:
            async with asyncio.timeout(60):
                await e.ready.wait()
            assert e.pid is not None
            os.kill(e.pid, signal.SIGSTOP)
            try:
                frozen = e.submit("r1", **REQUEST)
                e.cancel("r1")  # its client left before the first byte
                await asyncio.sleep(0.3)  # both lines are in the engine's stdin before it runs again
            finally:
                os.kill(e.pid, signal.SIGCONT)
            events = await _ending(e, frozen)
            assert [type(ev) for ev in events] == [Error], events
            assert events[0].kind == "cancelled"
            # Nothing is held: the unit is not taken for stalled, and its next request is served.
            assert not e._streams
            assert not e.stalled(0.1)
            served = await _ending(e, e.submit("r2", **REQUEST))
            assert isinstance(served[-1], Done), served
            assert sum(isinstance(ev, Token) for ev in served) == 4
        finally:
            await e.kill_and_wait()

    asyncio.run(run())
