"""Unit memberships for tests, built the way rendezvous builds them (runtime.rendezvous.build_membership):
ranks in the order the addresses are given, rank 0's host the collectives' bootstrap host."""

from __future__ import annotations

from collections.abc import Sequence

from runtime.membership import Membership
from runtime.rendezvous import Candidate, build_membership


def membership(
    addresses: Sequence[tuple[str, int]],
    *,
    rank: int = 0,
    unit_id: str = "u",
    revision: str = "r",
    dist_port: int = 29500,
) -> Membership:
    """The unit of the members at `addresses` (host, API port) in rank order, as seen by `rank`."""
    ordered = [Candidate(host=host, api_port=port) for host, port in addresses]
    return build_membership(unit_id=unit_id, revision=revision, ordered=ordered, me=ordered[rank], dist_port=dist_port)
