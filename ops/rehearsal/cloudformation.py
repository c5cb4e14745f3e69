"""CloudFormation and `cdk deploy` around the emulated services: which unit services update when.

Inside a stack a resource updates once every resource it DependsOn has ("With the DependsOn
attribute you can specify that the creation of a specific resource follows another",
AWSCloudFormation/latest/UserGuide/aws-attribute-dependson.html); resources without one between
them update in parallel. A service update ends when its ECS deployment is steady, or fails when the
circuit breaker trips ("Error occurred during operation 'ECS Deployment Circuit Breaker was
triggered'", aws/copilot-cli#5586); the stack then rolls back, every service updated so far going
back to its previous task definition (UPDATE_ROLLBACK, aws/containers-roadmap#1573). Between
stacks, `cdk deploy --concurrency N` runs up to N stacks "dependency permitting", and after a
failure starts no further stack (aws-cdk@2.1148.1 lib/index.js WorkGraph.failed: skipRest()).

With `cdk deploy --no-rollback` (CloudFormation's "Preserve successfully provisioned resources"),
"CloudFormation stops at the first failure in each independent provisioning path ... A failure in
one path doesn't affect other provisioning paths", keeps what it provisioned and leaves the failed
resources failed "until the next update operation", which retries them (UserGuide,
stack-failure-options.html). Without it, a failed creation rolls back by deleting what it
created, and CloudFormation cannot delete an Auto Scaling group whose instances are protected from
scale-in (ECS managed termination protection, aws/aws-cdk#18179): the stack ends ROLLBACK_FAILED.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from enum import StrEnum
from typing import Any

from ops.rehearsal.ecs import DeploymentStatus, Event, Revision, Service
from ops.rehearsal.template import CellStack, SynthesizedFleet

# Real seconds a stack waits for one service's deployment before calling the update failed (as
# CloudFormation's own stabilization timeout would, much later).
SERVICE_GIVE_UP_S = 600.0


class StackOutcome(StrEnum):
    COMPLETE = "COMPLETE"  # every service updated (created) and steady
    ROLLED_BACK = "ROLLED_BACK"  # a service failed; the stack went back to its previous revision
    NOT_STARTED = "NOT_STARTED"  # skipped after another stack failed, or a stack it needs failed
    # --no-rollback: CREATE_FAILED / UPDATE_FAILED with every other path provisioned and kept
    FAILED_PRESERVED = "FAILED_PRESERVED"
    # a creation rolled back, but a unit's Auto Scaling group held protected instances: delete only
    ROLLBACK_FAILED = "ROLLBACK_FAILED"


async def update_stack(
    stack: CellStack,
    services: Mapping[str, Service],
    revision: Revision,
    log: Callable[[Event], None],
    now: Callable[[], float],
    *,
    preserve: bool = False,
    give_up_s: float = SERVICE_GIVE_UP_S,
) -> StackOutcome:
    """One stack update (or creation) of every unit service to `revision`, in DependsOn order.

    preserve: `cdk deploy --no-rollback`; a failure stops only the resources that depend on it."""
    finished = {s.logical_id: asyncio.Event() for s in stack.services}
    failed = asyncio.Event()
    failed_paths: set[str] = set()  # logical ids that failed or were not started because of one
    touched: list[tuple[Service, Revision | None]] = []  # each started service and its previous revision

    async def one(logical: str) -> None:
        spec = next(s for s in stack.services if s.logical_id == logical)
        try:
            for dep in spec.depends_on:
                await finished[dep].wait()
            if preserve and failed_paths & set(spec.depends_on):
                failed_paths.add(logical)  # its path stopped at an earlier failure: not started
                return
            if failed.is_set() and not preserve:
                return
            service = services[spec.unit_id]
            previous = service.primary.revision if service.primary else None
            touched.append((service, previous))
            deployment = service.deploy(revision)
            settle = asyncio.ensure_future(service.settled(deployment, give_up_s))
            # Preserving, another path's failure does not stop this one.
            cancel = asyncio.ensure_future(asyncio.Event().wait() if preserve else failed.wait())
            await asyncio.wait({settle, cancel}, return_when=asyncio.FIRST_COMPLETED)
            cancel.cancel()
            if not settle.done():
                settle.cancel()  # another resource failed: CloudFormation stops waiting and rolls back
                return
            if settle.result() is not DeploymentStatus.COMPLETED:
                log(Event(now(), stack.name, f"{spec.unit_id}: UPDATE_FAILED (deployment {settle.result()})"))
                failed_paths.add(logical)
                failed.set()
        finally:
            finished[logical].set()

    log(Event(now(), stack.name, f"UPDATE_IN_PROGRESS to revision {revision.label}"))
    await asyncio.gather(*(one(s.logical_id) for s in stack.services))
    if not failed.is_set():
        log(Event(now(), stack.name, "UPDATE_COMPLETE"))
        return StackOutcome.COMPLETE
    if preserve:
        log(Event(now(), stack.name, f"UPDATE_FAILED, kept as provisioned; failed paths: {sorted(failed_paths)}"))
        return StackOutcome.FAILED_PRESERVED
    log(Event(now(), stack.name, "UPDATE_ROLLBACK_IN_PROGRESS"))
    rollbacks: list[asyncio.Future[Any]] = []
    protected: list[str] = []  # units whose group held instances ECS protects from scale-in
    for service, previous in touched:
        if previous is None:
            if service.tasks:
                protected.append(service.name)
            rollbacks.append(asyncio.ensure_future(service.delete()))  # a creation rolls back by deletion
            continue
        deployment = service.deploy(previous)  # already the primary if ECS rolled it back itself
        rollbacks.append(asyncio.ensure_future(service.settled(deployment, give_up_s)))
    await asyncio.gather(*rollbacks)
    if protected:
        log(Event(now(), stack.name, f"ROLLBACK_FAILED: cannot delete the Auto Scaling groups of {protected}"))
        return StackOutcome.ROLLBACK_FAILED
    log(Event(now(), stack.name, "UPDATE_ROLLBACK_COMPLETE"))
    return StackOutcome.ROLLED_BACK


async def deploy(
    fleet: SynthesizedFleet,
    services: Mapping[str, Service],
    revision: Revision,
    *,
    concurrency: int,
    log: Callable[[Event], None],
    now: Callable[[], float],
) -> dict[str, StackOutcome]:
    """`cdk deploy --all --concurrency N` over the unit stacks: each stack after those it depends on."""
    outcomes: dict[str, StackOutcome] = {}
    done = {s.name: asyncio.Event() for s in fleet.stacks}
    slots = asyncio.Semaphore(concurrency)
    any_failed = asyncio.Event()

    async def one(stack: CellStack) -> None:
        try:
            for dep in stack.depends_on:
                await done[dep].wait()
            if any_failed.is_set() or any(outcomes.get(d) is not StackOutcome.COMPLETE for d in stack.depends_on):
                outcomes[stack.name] = StackOutcome.NOT_STARTED
                return
            async with slots:
                if any_failed.is_set():
                    outcomes[stack.name] = StackOutcome.NOT_STARTED
                    return
                outcomes[stack.name] = await update_stack(stack, services, revision, log, now)
                if outcomes[stack.name] is not StackOutcome.COMPLETE:
                    any_failed.set()
        finally:
            done[stack.name].set()

    await asyncio.gather(*(one(s) for s in fleet.stacks))
    return outcomes


def static_waves(fleet: SynthesizedFleet, concurrency: int) -> list[list[str]]:
    """Unit ids per step if every unit update took one step: what the DependsOn graph and the stack
    dependencies allow with `concurrency` stacks at once (a stack holds its slot until done)."""
    step_of: dict[str, int] = {}
    finish: dict[str, int] = {}
    running: list[int] = []  # finish steps of the stacks holding a slot
    for stack in fleet.stacks:
        begin = max((finish[d] for d in stack.depends_on), default=0)
        running.sort()
        while len(running) >= concurrency:
            begin = max(begin, running.pop(0))
        steps: dict[str, int] = {}

        def step(logical: str, stack: CellStack = stack, steps: dict[str, int] = steps, begin: int = begin) -> int:
            if logical not in steps:
                spec = next(s for s in stack.services if s.logical_id == logical)
                steps[logical] = max([begin] + [step(d) + 1 for d in spec.depends_on])
            return steps[logical]

        for spec in stack.services:
            step_of[spec.unit_id] = step(spec.logical_id)
        finish[stack.name] = max(steps.values()) + 1
        running.append(finish[stack.name])
    waves: list[list[str]] = [[] for _ in range(max(step_of.values()) + 1)]
    for unit, step_no in step_of.items():
        waves[step_no].append(unit)
    return waves


def stacks_at_once(fleet: SynthesizedFleet) -> int:
    """The most unit stacks the dependency order lets update at the same time: the `cdk deploy
    --concurrency` at which the waves run as planned (lower still works, in more sequential waves)."""
    spans: dict[str, tuple[int, int]] = {}
    for stack in fleet.stacks:
        begin = max((spans[d][1] for d in stack.depends_on), default=0)
        depth: dict[str, int] = {}

        def level(logical: str, stack: CellStack = stack, depth: dict[str, int] = depth) -> int:
            if logical not in depth:
                spec = next(s for s in stack.services if s.logical_id == logical)
                depth[logical] = max([0] + [level(d) + 1 for d in spec.depends_on])
            return depth[logical]

        spans[stack.name] = (begin, begin + max(level(s.logical_id) for s in stack.services) + 1)
    return max(sum(1 for b, e in spans.values() if b <= t < e) for t in range(max(e for _, e in spans.values())))
