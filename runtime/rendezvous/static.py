"""Static rendezvous: the member list is given (flag or FLOTILLA_PEERS) in rank order.

Used locally and in tests. Whether each listed peer is alive and of the same revision is checked by
the supervisor's formation handshake, the same way as on ECS.
"""

from __future__ import annotations

from typing import Sequence

from runtime.membership import Member, Membership
from runtime.rendezvous import RendezvousError


class StaticRendezvous:
    def __init__(
        self, *, unit_id: str, revision: str, peers: Sequence[tuple[str, int]], rank: int, dist_port: int
    ) -> None:
        if not peers:
            raise RendezvousError("static rendezvous needs at least one peer")
        if not 0 <= rank < len(peers):
            raise RendezvousError(f"rank {rank} is outside the {len(peers)} listed peers")
        self._membership = Membership(
            unit_id=unit_id,
            revision=revision,
            rank=rank,
            world_size=len(peers),
            dist_host=peers[0][0],
            dist_port=dist_port,
            members=tuple(Member(rank=i, host=h, api_port=p) for i, (h, p) in enumerate(peers)),
        )

    async def join(self) -> Membership:
        return self._membership

    async def changed(self, current: Membership) -> bool:
        return current != self._membership
