"""The supervisor's reaction to a membership change (what ECS rendezvous reports when a task dies or a
replacement arrives), in-process with the model-free `echo` engine: the unit re-forms, the re-form
counts against the restart budget, and a drain still ends cleanly."""

from __future__ import annotations

import asyncio

from testnet import free_port

from runtime.membership import Member, Membership
from runtime.node.metrics import NodeMetrics
from runtime.node.settings import load_settings
from runtime.node.supervisor import UnitSupervisor


class FlippingRendezvous:
    """One member; reports a membership change when told to."""

    def __init__(self, port: int) -> None:
        self.m = Membership(
            unit_id="u",
            revision="r",
            rank=0,
            world_size=1,
            dist_host="127.0.0.1",
            dist_port=free_port(),
            members=(Member(rank=0, host="127.0.0.1", api_port=port),),
        )
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


async def wait_until(pred, timeout: float = 30.0) -> None:
    async def loop():
        while not pred():
            await asyncio.sleep(0.05)

    await asyncio.wait_for(loop(), timeout)


def test_a_membership_change_reforms_the_unit_and_counts_against_the_budget():
    async def scenario():
        port = free_port()
        s = load_settings(
            [
                "--engine",
                "echo",
                "--peers",
                f"127.0.0.1:{port}",
                "--rank",
                "0",
                "--unit",
                "u",
                "--revision",
                "r",
                "--rendezvous-watch",
                "0.2",
            ],
            {},
        )
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
        s = load_settings(
            [
                "--engine",
                "echo",
                "--peers",
                f"127.0.0.1:{port}",
                "--rank",
                "0",
                "--unit",
                "u",
                "--revision",
                "r",
                "--engine-stall",
                "1",
            ],
            {},
        )
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
