"""The leader counts a prompt's outstanding prefill net of what its engine's prefix cache holds.

A conversation's next turn resends the turns before it; a unit whose cache holds them prefills only
the new part. The leader's `load.prefill_tokens` (what routers estimate a unit's wait from) counts
each prompt from its acceptance to its first token; counted whole, a unit holding conversations looks
busier than it is and their turns move away from their cache. The engine process says, with each
acceptance, how much of the prompt its cache holds then."""

from __future__ import annotations

import asyncio

from runtime.membership import Membership
from runtime.node.engine_config import EngineConfig
from runtime.node.engine_process import EngineProcess
from runtime.node.engine_protocol import Accepted, Done
from runtime.node.settings import load_settings

SOLO = Membership(unit_id="u", revision="1", rank=0, world_size=1, dist_host="127.0.0.1", dist_port=1)
FIRST = "You are a shopping assistant. Answer briefly. " * 3 + "User: red shoes under fifty dollars?"
SECOND = FIRST + " Assistant: three pairs. User: which one is waterproof?"


def _request(prompt: str) -> dict:
    return dict(correlation_id="", prompt=prompt, max_tokens=2, default_max_tokens=2, temperature=0.0, top_p=1.0)


def test_each_acceptance_says_what_the_prefix_cache_holds_of_the_prompt_and_admission_takes_that():
    config = EngineConfig.from_settings(
        load_settings(["--engine", "reference", "--model", "tiny", "--peers", "127.0.0.1:1", "--rank", "0"], {}),
        SOLO,
    )

    async def run() -> None:
        e = EngineProcess(config=config)
        await e.start()
        try:
            async with asyncio.timeout(120):
                await e.ready.wait()
                first = [ev async for ev in e.events(e.submit("r1", **_request(FIRST)))]
                second = [ev async for ev in e.events(e.submit("r2", **_request(SECOND)))]
        finally:
            await e.kill_and_wait()
        (a1,), (a2,) = ([ev for ev in evs if isinstance(ev, Accepted)] for evs in (first, second))
        d1, d2 = first[-1], second[-1]
        assert isinstance(d1, Done) and isinstance(d2, Done), (first[-1], second[-1])
        assert a1.cached_tokens == d1.cached_tokens == 0  # nothing held before the first turn
        # The second turn: told at acceptance what its admission then took from the cache, the first
        # turn's whole blocks, most of that prompt.
        assert a2.cached_tokens == d2.cached_tokens
        assert a1.prompt_tokens // 2 < a2.cached_tokens <= a1.prompt_tokens < a2.prompt_tokens

    asyncio.run(run())
