"""The router layer end to end on real processes: units of two `runtime node` members (reference engine,
tiny model) behind `runtime router` processes on 127.0.0.1, under steady load from 8 concurrent clients.

Failover (kill -9 of a follower), rolling update (revision 1 -> 2, driven by the ECS rehearsal
emulator with the echo engine), router replacement (drain one of two routers), and overload (429
before admitted work finishes, router memory flat).
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import aiohttp
import pytest
from nodeproc import Unit
from router_real_units import Load, RouterProcess
from router_testkit import rss_kib, run, wait_for

import contract
from ops.rehearsal import run as rehearsal_run
from ops.rehearsal.template import read_fleet
from ops.rehearsal.traffic import Traffic

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "stacks"))
from synth_helpers import LLAMA_70B, config_with, synthesize  # noqa: E402

pytestmark = pytest.mark.timeout(300)

POLL_S = 0.2
BROKEN_FOR_S = 3.0  # how long the failover test leaves a unit without its follower


@pytest.fixture
def procs():
    """Every unit and router a test starts; all are stopped at teardown, whatever happened, and a
    process that would not stop fails the test (a unit or router left behind is a bug too)."""
    started: list = []
    yield started.append
    failures = []
    for proc in reversed(started):
        try:
            proc.stop()
        except Exception as exc:  # noqa: BLE001 - keep stopping the others, then fail with all of them
            failures.append(f"could not stop {proc}: {exc!r}")
    if failures:
        pytest.fail("; ".join(failures), pytrace=False)


async def first_unready(url: str, *, timeout: float) -> float:
    """When the leader's readiness first stops answering 200 (watched every 20 ms)."""
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1)) as s:
        while time.monotonic() < deadline:
            try:
                async with s.get(url + contract.NODE_READY_PATH) as r:
                    if r.status != 200:
                        return time.monotonic()
            except (aiohttp.ClientError, asyncio.TimeoutError):
                return time.monotonic()
            await asyncio.sleep(0.02)
    raise AssertionError(f"{url} stayed ready for {timeout} s after its follower was killed")


async def ready(*units: Unit, timeout: float = 180.0) -> None:
    """Until every member of each unit is ready, without blocking the event loop the load runs on."""
    await asyncio.gather(*(asyncio.to_thread(u.wait_ready, timeout) for u in units))


def describe(outcomes) -> str:
    bad = [o for o in outcomes if not o.ok]
    return f"{len(outcomes)} requests, {len(bad)} failed: " + "; ".join(
        f"[{o.status} {o.unit} stream={o.stream}] {o.error[:120]}" for o in bad[:8]
    )


STREAM_TOKENS = 192


def test_failover_follower_kill9_under_load_streams_on_that_unit_move_and_it_rejoins(tmp_path: Path, procs):
    a = Unit(tmp_path, name="unit-a", revision="1")
    b = Unit(tmp_path, name="unit-b", revision="1")
    router = RouterProcess(
        tmp_path,
        name="r",
        args=["--units", f"{a.leader.url},{b.leader.url}", "--poll-interval", str(POLL_S), "--drain-grace", "0"],
    )
    for proc in (a, b, router):
        procs(proc)
    marks: dict[str, float] = {}

    async def scenario():
        a.start()
        b.start()
        await ready(a, b)
        await router.start()
        await router.wait_routable(2)
        # Streams long enough that one under way at the kill is still running when the unit notices
        # (0.2 s after the kill here): with 48 tokens, a stream on a machine with nothing else to do
        # finished first in one run, and no stream was cut.
        load = Load(pick_url=lambda: router.url, clients=8, stream_max_tokens=STREAM_TOKENS, ignore_eos=True)

        async def controller():
            await wait_for(
                lambda: sum(o.unit == "unit-a" for o in load.outcomes) >= 10, timeout=60, what="traffic on unit-a"
            )
            watch = asyncio.create_task(first_unready(a.leader.url, timeout=60))
            await asyncio.sleep(0.05)  # the watch is polling before the kill
            # Kill the moment a stream from unit-a is under way (no pause in between: a short stream
            # on a fast unit could end first), so the cut-stream case is exercised.
            await wait_for(
                lambda: load.live_streams.get("unit-a", 0) > 0,
                timeout=60,
                what="a stream in progress on unit-a",
                interval=0.001,
            )
            marks["streams_in_progress"] = load.live_streams["unit-a"]
            a.members[1].sigkill()
            marks["killed"] = time.monotonic()
            marks["unready"] = await watch
            # Leave the unit broken long enough that "the router stopped sending to it" is a window
            # of whole seconds, not a scheduling accident.
            await asyncio.sleep(BROKEN_FOR_S)
            marks["replaced"] = time.monotonic()
            a.members[1].start()  # the replacement follower: the unit re-forms
            await ready(a, timeout=120)
            marks["reformed"] = time.monotonic()

        def enough(outs) -> bool:
            return (
                "reformed" in marks
                and len(outs) >= 200
                and sum(o.unit == "unit-a" and o.sent > marks["reformed"] for o in outs) >= 5
            )

        await asyncio.gather(controller(), load.run(enough))
        return load.outcomes, await router.metrics()

    outcomes, metrics = run(scenario(), timeout=240.0)
    router_code = router.stop()
    failed = [o for o in outcomes if not o.ok]
    last_on_a = max(
        (o.sent for o in outcomes if o.unit == "unit-a" and o.sent < marks["replaced"]), default=marks["unready"]
    )
    print(
        f"failover: {len(outcomes)} requests, {len(failed)} failed (streams running on unit-a at the "
        f"kill), last request sent to unit-a {last_on_a - marks['unready']:+.3f} s after it turned "
        f"unready, unit unready {marks['unready'] - marks['killed']:.3f} s after the kill; "
        f"stream error: {failed[0].error if failed else None!r}"
    )
    assert len(outcomes) >= 200
    # Streams running on the broken unit move to the other one (docs/node.md, "the stream moves"): no
    # request fails, and the router's count of moved streams shows the cut-stream path ran.
    assert failed == [], describe(failed)
    assert 'flotilla_router_retries_total{reason="move_' in metrics, "no stream was moved: the kill cut none"
    # The router stops sending to the broken unit within two poll intervals of it turning unready
    # (plus 0.5 s for scheduling on a shared 2-core machine), for as long as the unit stays broken.
    # The window ends when the replacement follower is started, the earliest the unit can be ready
    # again: the test's own "re-formed" mark comes later than the unit's real re-formation (it is
    # polled from a busy event loop), and requests the router rightly sends to the re-formed unit in
    # between must not count as late. Requests sent after the replacement starts are still covered
    # above: none of them may fail.
    late = [
        o for o in outcomes if o.unit == "unit-a" and marks["unready"] + 2 * POLL_S + 0.5 < o.sent < marks["replaced"]
    ]
    assert late == [], (
        f"{len(late)} requests sent to unit-a while it was broken, at "
        f"{[round(o.sent - marks['unready'], 3) for o in late]} s after it turned unready"
    )
    # Re-formed, it takes traffic again.
    assert sum(o.unit == "unit-a" and o.ok and o.sent > marks["reformed"] for o in outcomes) >= 5
    assert 'flotilla_router_unit_routable{revision="1",unit="unit-a"' in metrics
    assert router_code == 0


@pytest.mark.whole_machine  # two units, the router and a load, paced by the unit's answers
def test_rolling_update_revision_1_to_2_under_load_loses_no_request(tmp_path: Path, monkeypatch):
    """A unit rolls from revision 1 to 2 under load through the router, and ECS, not the test,
    decides when its old tasks stop: the rehearsal emulator (ops/rehearsal/ecs.py) plays the
    synthesized service's own rules (surge: minimum healthy 100 %, maximum 200 %; the old tasks stop
    only once the new ones pass their container health check; Cloud Map deregistration, SIGTERM and
    the stop timeout). tests/rehearsal/ checks those rules step by step; this checks what a client
    sees."""
    # Each answer's revision and emulated time: the rehearsal's report has only the totals.
    answers: list[tuple[float, str]] = []

    class TimedTraffic(Traffic):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            clock = self.clock

            class Logged(dict):
                def __setitem__(self, revision: str, count: int) -> None:
                    answers.append((clock.now(), revision))
                    super().__setitem__(revision, count)

            self.revisions = Logged()

    monkeypatch.setattr(rehearsal_run, "Traffic", TimedTraffic)
    cdk_out = tmp_path / "cdk.out"
    synthesize(config_with(units=1, nodes_per_unit=2, unit_rollout="surge", revision="1", model=LLAMA_70B), cdk_out)
    report = asyncio.run(
        rehearsal_run.rehearse(
            read_fleet(cdk_out), rehearsal_run.Options(new_revision="2", clients=8, work_dir=tmp_path / "run")
        )
    )
    assert report.rolled_out, report.rollout
    assert report.failures == [], report.failures[:8]
    assert report.revisions_served.get("1", 0) > 0 and report.revisions_served.get("2", 0) > 0
    assert report.final_revisions == {"cell0-unit0": "2"}
    # After CloudFormation saw the service steady (ECS had stopped the old tasks): only revision 2.
    (begin,) = [e.at for e in report.events if e.who == "rehearsal" and e.text.startswith("rolling out")]
    after = [revision for at, revision in answers if at > begin + report.rollout_s]
    assert len(after) >= 20 and set(after) == {"2"}, after
    assert len(answers) == report.served  # the log saw every answer


class RoundRobinFront:
    """A tiny stand-in for the ALB: sends to routers whose /health is 200, in turn."""

    def __init__(self, urls: list[str], *, check_every: float = 0.1) -> None:
        self.urls = urls
        self.healthy = set(urls)
        self.check_every = check_every
        self._next = 0
        self._task: asyncio.Task | None = None

    async def _check(self) -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.5)) as s:
            while True:
                for url in self.urls:
                    try:
                        async with s.get(url + contract.ROUTER_HEALTH_PATH) as r:
                            ok = r.status == 200
                    except (aiohttp.ClientError, asyncio.TimeoutError):
                        ok = False
                    (self.healthy.add if ok else self.healthy.discard)(url)
                await asyncio.sleep(self.check_every)

    def start(self) -> None:
        self._task = asyncio.create_task(self._check())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def pick(self) -> str:
        live = [u for u in self.urls if u in self.healthy] or self.urls
        self._next += 1
        return live[self._next % len(live)]


def test_router_replacement_draining_one_of_two_routers_under_load_loses_no_request(tmp_path: Path, procs):
    unit = Unit(tmp_path, name="unit-a", revision="1")
    args = ["--units", unit.leader.url, "--poll-interval", str(POLL_S), "--drain-grace", "1.0"]
    r1 = RouterProcess(tmp_path, name="blue", args=args)
    r2 = RouterProcess(tmp_path, name="green", args=args)
    for proc in (unit, r1, r2):
        procs(proc)
    marks: dict[str, float] = {}

    async def scenario():
        unit.start()
        await ready(unit)
        await asyncio.gather(r1.start(), r2.start())
        await asyncio.gather(r1.wait_routable(1), r2.wait_routable(1))
        front = RoundRobinFront([r1.url, r2.url])
        front.start()
        load = Load(pick_url=front.pick, clients=8)

        async def controller():
            await wait_for(lambda: len(load.outcomes) >= 40, timeout=60, what="40 requests")
            r1.sigterm()
            marks["code"] = await r1.wait_exit(60)
            marks["r1_gone"] = time.monotonic()

        def enough(outs) -> bool:
            return "r1_gone" in marks and sum(o.sent > marks["r1_gone"] for o in outs) >= 40

        try:
            await asyncio.gather(controller(), load.run(enough))
        finally:
            await front.stop()
        return load.outcomes

    outcomes = run(scenario(), timeout=240.0)
    assert all(o.ok for o in outcomes), describe(outcomes)
    assert marks["code"] == 0
    assert any(o.via == r1.url for o in outcomes)
    assert all(o.via == r2.url for o in outcomes if o.sent > marks["r1_gone"])


def test_overload_gets_429_before_admitted_work_finishes_and_router_memory_stays_flat(tmp_path: Path, procs):
    unit = Unit(tmp_path, name="unit-a", revision="1")
    router = RouterProcess(
        tmp_path,
        name="r",
        args=[
            "--units",
            unit.leader.url,
            "--poll-interval",
            str(POLL_S),
            # a busy 2-core machine may answer a poll late:
            # that must not read as "unit gone" (503)
            "--poll-timeout",
            "30",
            "--max-outstanding-per-unit",
            "4",
            "--drain-grace",
            "0",
        ],
    )
    procs(unit)
    procs(router)

    async def scenario():
        unit.start()
        await ready(unit)
        await router.start()
        await router.wait_routable(1)
        # long enough that the flood's refusals come back while it runs, even on a loaded machine
        admitted_load = Load(pick_url=lambda: router.url, max_tokens=800, ignore_eos=True)
        flood_load = Load(pick_url=lambda: router.url)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
            admitted = [asyncio.create_task(admitted_load.one(s, stream=True)) for _ in range(4)]
            metrics_line = 'flotilla_router_unit_outstanding{revision="1",unit="unit-a"'
            deadline = time.monotonic() + 30
            while True:
                text = await router.metrics()
                line = next((ln for ln in text.splitlines() if ln.startswith(metrics_line)), "")
                if line.endswith(" 4.0"):
                    break
                assert time.monotonic() < deadline, text
                await asyncio.sleep(0.02)
            floods = []
            rss = [rss_kib(router.proc.pid)]
            for _ in range(3):
                floods += await asyncio.gather(*(flood_load.one(s, stream=False) for _ in range(150)))
                rss.append(rss_kib(router.proc.pid))
            done = await asyncio.gather(*admitted)
        return done, floods, rss

    done, floods, rss = run(scenario(), timeout=240.0)
    assert all(o.ok for o in done), describe(done)
    assert [o.status for o in floods] == [429] * len(floods)
    window = max(o.done for o in floods) - min(o.sent for o in floods)
    print(
        f"overload: {len(floods)} refused with 429 in {window:.2f} s "
        f"while 4 admitted generations ran; router RSS {rss} KiB"
    )
    # "Quickly": every refusal came back while the admitted generations were still running.
    assert max(o.done for o in floods) < min(o.done for o in done)
    assert rss[-1] - rss[1] < 8 * 1024, rss
