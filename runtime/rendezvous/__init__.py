"""Rendezvous: who is in my unit and what is my rank. Backends: `static` (local runs, tests), `ecs`.

Every backend produces a runtime.membership.Membership. The rank order is computed the same way on
every member from the same inputs (topology path, then instance id), so no coordinator is needed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Protocol, Sequence

from runtime.membership import Member, Membership


class RendezvousError(RuntimeError):
    """The unit cannot form as configured (a peer of another revision, a missing task, ...)."""


class RendezvousTimeout(RendezvousError):
    """Not every member appeared before the rendezvous timeout."""


@dataclass(frozen=True)
class Candidate:
    """A would-be member before ranks are assigned."""

    host: str
    api_port: int
    instance_id: str | None = None
    task_arn: str | None = None
    network_nodes: tuple[str, ...] = ()


def rank_order_key(c: Candidate) -> tuple:
    # Network nodes are listed spine first, so sorting by the path keeps neighbouring ranks (adjacent
    # pipeline stages) under the same spine; instance id breaks ties identically on every member.
    return (tuple(c.network_nodes), c.instance_id or "", c.host, c.api_port, c.task_arn or "")


def order_candidates(candidates: Iterable[Candidate]) -> list[Candidate]:
    return sorted(candidates, key=rank_order_key)


def build_membership(
    *, unit_id: str, revision: str, ordered: Sequence[Candidate], me: Candidate, dist_port: int
) -> Membership:
    """Assign ranks in the given order; `me` must be one of `ordered`."""
    if me not in ordered:
        raise RendezvousError(f"this member ({me.host}:{me.api_port}) is not among the unit's members")
    members = tuple(
        Member(
            rank=i,
            host=c.host,
            api_port=c.api_port,
            instance_id=c.instance_id,
            task_arn=c.task_arn,
            network_nodes=tuple(c.network_nodes),
        )
        for i, c in enumerate(ordered)
    )
    return Membership(
        unit_id=unit_id,
        revision=revision,
        rank=list(ordered).index(me),
        world_size=len(members),
        dist_host=members[0].host,
        dist_port=dist_port,
        members=members,
    )


class Rendezvous(Protocol):
    async def join(self) -> Membership:
        """Wait (bounded by the backend's timeout) until the whole unit is present; return it."""
        ...

    async def changed(self, current: Membership) -> bool:
        """True if the unit's member set is no longer `current` (a member left or a new one came)."""
        ...
