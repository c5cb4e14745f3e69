"""One rehearsal: create the fleet from the templates, put it under load through the router, roll it
to a new revision as ECS and CloudFormation would, and report what the clients and the router saw.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

import contract
from ops.rehearsal import cloudformation as cfn
from ops.rehearsal.ecs import Clock, Event, Revision, Service
from ops.rehearsal.local import LocalFleet, LocalSettings, RouterProcess, drain_log
from ops.rehearsal.template import SynthesizedFleet
from ops.rehearsal.traffic import Failure, RotationWatch, Traffic

# A revision that never gets ready: its engine "loads" longer than any rehearsal runs.
NEVER_READY_LOAD_S = 1e6


class RehearsalError(RuntimeError):
    """The rehearsal could not run (not: the rollout misbehaved, which the report says)."""


@dataclass(frozen=True)
class Options:
    scale: float = 0.01  # real seconds per emulated second
    load_s: float = 1.0  # real seconds the echo engine takes to "load" (the new revision's too)
    clients: int = 4
    concurrency: int | None = None  # cdk deploy --concurrency; None: what the stack lanes allow
    new_revision: str | None = None  # the label rolled to; None: "<template revision>-next"
    never_ready: bool = False  # the new revision never becomes ready
    engine: str = "echo"
    model: str = "tiny"
    ready_settle_s: float = 0.5
    work_dir: Path | None = None  # logs; None: a temporary directory, removed afterwards
    give_up_s: float = 900.0  # real seconds for the whole rehearsal
    answer_tokens: int | None = None  # every client streams answers this long; None: short answers, half streamed
    handover: bool = True  # False: the router moves no stream, so a draining leader waits for its answers


@dataclass(frozen=True)
class Drain:
    """One old leader's drain during the rollout: SIGTERM to its exit, and what its log says of it."""

    unit: str
    task: str
    real_s: float
    emulated_s: float
    in_flight: int | None  # requests it held at SIGTERM (None: its log has no drain)
    handed_over: int  # of those, handed over to the router at their next token
    unfinished: int | None  # still open when its drain timeout ran out (None: killed before its drain ended)


@dataclass
class Report:
    scale: float
    units: int
    nodes_per_unit: int
    floor: int  # units that must stay in rotation throughout the rollout
    concurrency: int
    waves: list[list[str]]
    old_revision: str
    new_revision: str
    create: dict[str, cfn.StackOutcome]
    rollout: dict[str, cfn.StackOutcome]
    served: int
    failures: list[Failure]
    revisions_served: dict[str, int]
    min_in_rotation: int
    below_floor_s: float  # emulated seconds
    rotation: list[tuple[float, int]]  # (emulated s since the rollout began, units) per change
    rollout_s: float  # emulated seconds from the rollout's start to its end
    wall_s: float  # real seconds for the whole rehearsal
    final_revisions: dict[str, str]  # unit -> revision its primary deployment runs at the end
    breaker_trips: dict[str, int]
    tasks_launched: dict[str, dict[str, int]]  # unit -> revision -> tasks started
    answer_tokens: int | None = None
    handover: bool = True
    drain_timeout_s: float = 0.0  # emulated seconds: the node's, from the template
    drains: list[Drain] = field(default_factory=list)  # each old leader stopped during the rollout
    events: list[Event] = field(default_factory=list)
    log_dir: Path | None = None

    @property
    def rolled_out(self) -> bool:
        return all(o is cfn.StackOutcome.COMPLETE for o in self.rollout.values())

    @property
    def floor_held(self) -> bool:
        return self.min_in_rotation >= self.floor

    @property
    def ok(self) -> bool:
        """What a rollout must guarantee: no request lost, rotation never below the floor."""
        return not self.failures and self.floor_held

    def drain_s(self, how: Callable[[list[float]], float]) -> float | None:
        """`how` (statistics.median, max) of the leaders' drains in emulated seconds; None without one."""
        return how([d.emulated_s for d in self.drains]) if self.drains else None


async def _wait_routable(url: str, units: int, give_up_s: float) -> None:
    deadline = time.monotonic() + give_up_s
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1.0)) as s:
        while time.monotonic() < deadline:
            try:
                async with s.get(url + contract.ROUTER_HEALTH_PATH) as r:
                    if int((await r.json()).get("routable_units", 0)) >= units:
                        return
            except (aiohttp.ClientError, TimeoutError, ValueError):
                pass
            await asyncio.sleep(0.1)
    raise RehearsalError(f"the router at {url} did not see {units} unit(s) ready within {give_up_s:.0f} s")


async def _until(pred: Callable[[], bool], give_up_s: float) -> None:
    deadline = time.monotonic() + give_up_s
    while not pred() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)


def floor_for(fleet: SynthesizedFleet, waves: list[list[str]]) -> int:
    """Units that stay in rotation: all but the largest wave of units whose rollout takes them
    out (minimum healthy below 100 %, i.e. `replace`)."""
    leaving = {s.unit_id for s in fleet.services if not s.keeps_serving}
    return len(fleet.services) - max((sum(1 for u in wave if u in leaving) for wave in waves), default=0)


async def rehearse(fleet: SynthesizedFleet, options: Options, log: Callable[[Event], None] | None = None) -> Report:
    started = time.monotonic()
    clock = Clock(options.scale)
    events: list[Event] = []

    def record(e: Event) -> None:
        events.append(e)
        if log is not None:
            log(e)

    work = options.work_dir or Path(tempfile.mkdtemp(prefix="flotilla-rehearsal-"))
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    specs = fleet.services
    concurrency = options.concurrency or max(1, len(fleet.stacks))
    waves = cfn.static_waves(fleet, concurrency)
    old_label = specs[0].revision
    new_label = options.new_revision or f"{old_label}-next"
    old = Revision(label=old_label, load_s=options.load_s)
    new = Revision(label=new_label, load_s=NEVER_READY_LOAD_S if options.never_ready else options.load_s)
    local = LocalFleet(
        LocalSettings(
            log_dir=logs,
            scale=options.scale,
            engine=options.engine,
            model=options.model,
            ready_settle_s=options.ready_settle_s,
        ),
        work / "units.txt",
    )
    services = {s.unit_id: Service(s, clock=clock, launcher=local, log=record) for s in specs}
    schedulers = [asyncio.ensure_future(s.run()) for s in services.values()]
    router = RouterProcess(
        work / "units.txt", logs / "router.log", local.ports, max_moves=None if options.handover else 0
    )
    stop = asyncio.Event()
    traffic = Traffic(router.url, model=specs[0].model_name, clock=clock, clients=options.clients)
    if options.answer_tokens:
        traffic.max_tokens, traffic.stream_all = options.answer_tokens, True
    # Requests that must end after the rollout, as before it (long answers: one per client).
    settled = options.clients if options.answer_tokens else 20
    watch = RotationWatch(router.url, clock=clock)
    background: list[asyncio.Future[None]] = []
    try:
        record(Event(clock.now(), "rehearsal", f"creating {len(specs)} unit(s) at revision {old_label}"))
        create = await cfn.deploy(fleet, services, old, concurrency=concurrency, log=record, now=clock.now)
        if any(o is not cfn.StackOutcome.COMPLETE for o in create.values()):
            raise RehearsalError(f"creating the fleet failed: {create}; see {logs}")
        await _wait_routable(router.url, len(specs), give_up_s=60.0)
        background = [asyncio.ensure_future(watch.run(stop)), asyncio.ensure_future(traffic.run(stop))]
        # The rollout starts once the fleet serves; with long answers, once every client has one open.
        if options.answer_tokens:
            await _until(lambda: traffic.answering >= options.clients or bool(traffic.failures), give_up_s=60.0)
        else:
            await _until(lambda: traffic.served >= settled or bool(traffic.failures), give_up_s=60.0)
        begin = clock.now()
        record(Event(begin, "rehearsal", f"rolling out revision {new_label} under load"))
        rollout = await cfn.deploy(fleet, services, new, concurrency=concurrency, log=record, now=clock.now)
        end = clock.now()
        traffic.enough = enough = traffic.served + settled
        await _until(lambda: traffic.served >= enough, give_up_s=30.0)
        stop.set()
        await asyncio.gather(*background)
        samples = watch.between(begin, end)
        return Report(
            scale=options.scale,
            units=len(specs),
            nodes_per_unit=specs[0].desired_count,
            floor=floor_for(fleet, waves),
            concurrency=concurrency,
            waves=waves,
            old_revision=old_label,
            new_revision=new_label,
            create=create,
            rollout=rollout,
            served=traffic.served,
            failures=traffic.failures,
            revisions_served=traffic.revisions,
            min_in_rotation=min((n for _, n in samples), default=0),
            below_floor_s=watch.below(floor_for(fleet, waves), begin, end),
            rotation=[(t - begin, n) for t, n in watch.timeline(begin, end)],
            rollout_s=end - begin,
            wall_s=time.monotonic() - started,
            final_revisions={
                u: (s.primary.revision.label if s.primary else "none") for u, s in sorted(services.items())
            },
            breaker_trips={u: s.breaker_trips for u, s in sorted(services.items())},
            tasks_launched={u: _launched(s) for u, s in sorted(services.items())},
            answer_tokens=options.answer_tokens,
            handover=options.handover,
            drain_timeout_s=specs[0].drain_timeout_s,
            drains=[d for s in services.values() for d in _drains(s, begin, end, clock.scale)],
            events=events,
            log_dir=logs if options.work_dir else None,
        )
    finally:
        stop.set()
        for job in background:
            job.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        for job in schedulers:
            job.cancel()
        await asyncio.gather(*schedulers, return_exceptions=True)
        router.stop()
        await asyncio.gather(*(s.delete() for s in services.values()), return_exceptions=True)
        for s in services.values():
            await s.close()
        await local.close()
        if options.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)


def _drains(service: Service, begin: float, end: float, scale: float) -> list[Drain]:
    """The leaders (rank 0) told to stop between begin and end (emulated s) that have exited."""
    out = []
    for task in service.tasks:
        if task.slot != 0 or task.stop_sent_at is None or task.exited_at is None:
            continue
        if not begin <= task.stop_sent_at <= end:
            continue
        said = drain_log(task.handle)
        took = task.exited_at - task.stop_sent_at
        out.append(
            Drain(
                unit=service.name,
                task=task.handle.name,
                real_s=took * scale,
                emulated_s=took,
                in_flight=said.in_flight if said else None,
                handed_over=said.handed_over if said else 0,
                unfinished=said.unfinished if said else None,
            )
        )
    return out


def _launched(service: Service) -> dict[str, int]:
    out: dict[str, int] = {}
    for task in service.tasks:
        label = task.deployment.revision.label
        out[label] = out.get(label, 0) + 1
    return out
