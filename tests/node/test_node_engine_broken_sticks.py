"""A request that finds the engine broken makes the unit unready before its client hears of it, and
the unit stays unready: the engine's own load report, written a moment before it noticed the failure
and read just after, must not make the unit routable again (its clients would retry into it)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys

from runtime.engines.base import EngineState
from runtime.membership import Membership
from runtime.node.engine_config import EngineConfig
from runtime.node.engine_process import EngineProcess
from runtime.node.engine_protocol import Load
from runtime.node.settings import load_settings

SOLO = Membership(unit_id="u", revision="1", rank=0, world_size=1, dist_host="127.0.0.1", dist_port=1)
CONFIG = EngineConfig.from_settings(
    load_settings(["--engine", "echo", "--peers", "127.0.0.1:1", "--rank", "0"], {}), SOLO
)


def _load(state: str) -> dict:
    return {"op": "load", **{f.name: 0 for f in dataclasses.fields(Load)}, "state": state, "detail": ""}


def _state_after(lines: list[dict]) -> EngineState:
    """The engine process's load state once a real child process has written `lines`, read the way
    the node reads its engine process (the child then waits for its stdin to close)."""

    async def run() -> EngineState:
        written = [*lines, {"op": "failed", "message": "all written"}]
        script = "import sys\n"
        script += "".join(f"print({json.dumps(json.dumps(x))}, flush=True)\n" for x in written)
        script += "sys.stdin.read()\n"
        e = EngineProcess(config=CONFIG)
        e.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", script, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
        )
        reader = asyncio.create_task(e._read())
        try:
            async with asyncio.timeout(60):
                while e.failure != "all written":
                    await asyncio.sleep(0.01)
            return e.load.state
        finally:
            assert e.proc.stdin is not None
            e.proc.stdin.close()
            await reader

    return asyncio.run(run())


def test_a_ready_report_after_a_broken_request_leaves_the_unit_broken():
    broken = {"op": "error", "id": "r1", "kind": "broken", "message": "the vLLM server dropped the stream"}
    # The second "ready" was sent before the engine noticed its server was gone.
    assert _state_after([_load("ready"), broken, _load("ready")]) is EngineState.BROKEN


def test_load_reports_still_move_an_engine_that_never_broke():
    assert _state_after([_load("ready"), _load("starting"), _load("ready")]) is EngineState.READY
    assert _state_after([_load("starting"), _load("ready"), _load("starting")]) is EngineState.STARTING
