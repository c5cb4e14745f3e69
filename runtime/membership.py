"""Who is in a unit and who leads it: the output of rendezvous, the input of every engine.

Rendezvous (static or ECS) produces a Membership; the engine turns it plus the model's shape into
a parallel plan (layer ranges, tensor slices). Keeping the two apart lets the same membership drive
the reference engine and the neuron engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class Role(StrEnum):
    """A member's part in its unit; the value is what /health/ready reports as `role`."""

    LEADER = "leader"  # rank 0: serves the API and runs the engine's scheduler
    FOLLOWER = "follower"  # runs the engine's worker loop for its shard


@dataclass(frozen=True)
class Member:
    rank: int
    host: str  # address other members and the router use
    api_port: int  # the member's HTTP port (health on every rank, API on rank 0)
    instance_id: str | None = None  # EC2 instance (ECS rendezvous), None locally
    task_arn: str | None = None
    network_nodes: tuple[str, ...] = ()  # DescribeInstanceTopology path, top (spine) first


@dataclass(frozen=True)
class Membership:
    unit_id: str
    revision: str
    rank: int  # this process's rank; 0 is the leader
    world_size: int
    dist_host: str  # leader's address for torch.distributed / collectives bootstrap
    dist_port: int
    members: tuple[Member, ...] = field(default_factory=tuple)  # ordered by rank

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is outside world_size {self.world_size}")
        if self.members and len(self.members) != self.world_size:
            raise ValueError(f"{len(self.members)} members listed for world_size {self.world_size}")
        if self.members and [m.rank for m in self.members] != list(range(self.world_size)):
            raise ValueError("members must be listed in rank order 0..world_size-1")

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    @property
    def role(self) -> Role:
        return Role.LEADER if self.is_leader else Role.FOLLOWER
