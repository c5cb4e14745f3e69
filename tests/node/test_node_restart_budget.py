"""The restart budget is a sliding window: a re-form older than restart_window_s no longer counts, so a
member that re-forms now and then lives on, and one that re-forms more than max_restarts times inside
any one window gives up (docs/node.md, the supervisor's group semantics)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

from testnet import free_port

from runtime.node import supervisor
from runtime.node.metrics import NodeMetrics
from runtime.node.settings import load_settings
from runtime.node.supervisor import UnitSupervisor

MAX_RESTARTS, WINDOW_S = 2, 100.0


def _supervisor() -> UnitSupervisor:
    port = free_port()
    s = load_settings(
        ["--engine", "echo", "--peers", f"127.0.0.1:{port}", "--rank", "0", "--unit", "u", "--revision", "r"]
        + ["--max-restarts", str(MAX_RESTARTS), "--restart-window", str(WINDOW_S)],
        {},
    )
    return UnitSupervisor(settings=s, rendezvous=None, metrics=NodeMetrics())  # type: ignore[arg-type]


def test_re_forms_older_than_the_window_leave_the_budget_and_a_burst_inside_it_exhausts_it(monkeypatch):
    clock = [1000.0]
    # The supervisor's clock only: asyncio keeps the real one.
    monkeypatch.setattr(supervisor, "time", SimpleNamespace(monotonic=lambda: clock[0], time=time.time))
    sup = _supervisor()

    async def scenario() -> list[tuple[float, bool, int]]:
        sup._stop.set()  # no back-off sleeps: what is tested is the count, not the wait
        seen = []
        for at in (1000.0, 1050.0, 1101.0, 1160.0, 1170.0):
            clock[0] = at
            seen.append((at, await sup._after_failure(f"failure at {at}"), len(sup._restarts)))
        return seen

    seen = asyncio.run(scenario())
    assert seen[:2] == [(1000.0, True, 1), (1050.0, True, 2)]
    # 101 s after the first re-form it has left the window: two in it, within the budget of 2
    assert seen[2] == (1101.0, True, 2)
    # 1160: the one at 1050 slid out as well (110 s old): 1101 and 1160 remain
    assert seen[3] == (1160.0, True, 2)
    # 1170: 1101, 1160, 1170 are all inside one window: 3 re-forms > 2, the member gives up
    assert seen[4] == (1170.0, False, 3)
    assert sup.state.value == "broken"
