"""ECS rendezvous: a unit is the RUNNING tasks of one ECS service that belong to my deployment.

Self comes from the task metadata endpoint (v4). Peers share my service group, task definition and
`startedBy` (the deployment), so tasks of an old and a new revision never form one unit. Ranks
follow DescribeInstanceTopology's network-node path, then instance id: the same on every member.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
import urllib.request
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from runtime.membership import Membership
from runtime.rendezvous import Candidate, RendezvousError, RendezvousTimeout, build_membership, order_candidates

log = logging.getLogger("flotilla.rendezvous.ecs")

METADATA_ENV = "ECS_CONTAINER_METADATA_URI_V4"


@dataclass(frozen=True)
class TaskIdentity:
    """What ECS says about my own task: enough to find my peers."""

    cluster: str
    task_arn: str
    group: str  # "service:<name>"
    task_definition_arn: str
    started_by: str  # the service deployment that started the task

    @property
    def service_name(self) -> str:
        kind, _, name = self.group.partition(":")
        if kind != "service" or not name:
            raise RendezvousError(
                f"task {self.task_arn} belongs to group {self.group!r}, not to an ECS "
                "service: run unit members as a service (one task per node)"
            )
        return name


def read_task_metadata(uri: str | None = None, *, timeout_s: float = 5.0) -> dict[str, Any]:
    """GET $ECS_CONTAINER_METADATA_URI_V4/task (the agent serves it on a link-local address)."""
    base = uri or os.environ.get(METADATA_ENV)
    if not base:
        raise RendezvousError(
            f"{METADATA_ENV} is not set: ecs rendezvous only works inside an ECS task; "
            "use FLOTILLA_RENDEZVOUS=static elsewhere"
        )
    with urllib.request.urlopen(base.rstrip("/") + "/task", timeout=timeout_s) as resp:  # noqa: S310
        return json.load(resp)


class InstanceTopology:
    """Network-node paths of EC2 instances (DescribeInstanceTopology), spine first."""

    def __init__(self, ec2_client: Any) -> None:
        self._ec2 = ec2_client
        # A running instance never moves in the network, and the API's rate limit is low: cache.
        self._known: dict[str, tuple[str, ...]] = {}

    def network_nodes(self, instance_ids: Sequence[str]) -> dict[str, tuple[str, ...]]:
        missing = sorted(set(instance_ids) - set(self._known))
        if missing:
            found = self._lookup(missing)
            self._known.update({iid: found.get(iid, ()) for iid in missing})
        return {iid: self._known[iid] for iid in instance_ids}

    def _lookup(self, ids: Sequence[str]) -> dict[str, tuple[str, ...]]:
        out: dict[str, tuple[str, ...]] = {}
        for i in range(0, len(ids), 100):  # the API takes at most 100 instance ids per call
            kwargs: dict[str, Any] = {"InstanceIds": ids[i : i + 100]}
            while True:
                resp = self._ec2.describe_instance_topology(**kwargs)
                for inst in resp.get("Instances", []):
                    out[inst["InstanceId"]] = tuple(inst.get("NetworkNodes", ()))
                token = resp.get("NextToken")
                if not token:
                    break
                kwargs["NextToken"] = token
        # Instance types without topology data are simply ordered by id (empty path sorts first).
        return out


class EcsRendezvous:
    def __init__(
        self,
        *,
        unit_id: str,
        revision: str,
        world_size: int,
        api_port: int,
        dist_port: int,
        ecs_client: Any,
        ec2_client: Any,
        topology: InstanceTopology | None = None,
        metadata: Callable[[], dict[str, Any]] = read_task_metadata,
        timeout_s: float = 600.0,
        poll_s: float = 2.0,
    ) -> None:
        self._unit_id, self._revision = unit_id, revision
        self._world_size, self._api_port, self._dist_port = world_size, api_port, dist_port
        self._ecs, self._ec2 = ecs_client, ec2_client
        self._topology = topology or InstanceTopology(ec2_client)
        self._metadata = metadata
        self._timeout_s, self._poll_s = timeout_s, poll_s
        self._me: TaskIdentity | None = None
        self._address: dict[str, str] = {}

    # -- identity ---------------------------------------------------------------------------------
    def identity(self) -> TaskIdentity:
        if self._me is None:
            md = self._metadata()
            cluster, task_arn = md["Cluster"], md["TaskARN"]
            tasks = self._ecs.describe_tasks(cluster=cluster, tasks=[task_arn])["tasks"]
            if not tasks:
                raise RendezvousError(f"ECS does not know my own task {task_arn} in cluster {cluster}")
            t = tasks[0]
            self._me = TaskIdentity(
                cluster=cluster,
                task_arn=task_arn,
                group=t.get("group", ""),
                task_definition_arn=t["taskDefinitionArn"],
                started_by=t.get("startedBy", ""),
            )
        return self._me

    # -- one look at the service ------------------------------------------------------------------
    def candidates(self) -> list[Candidate]:
        """RUNNING tasks of my service and deployment, with instances and topology, in rank order."""
        me = self.identity()
        arns: list[str] = []
        for page in self._ecs.get_paginator("list_tasks").paginate(
            cluster=me.cluster, serviceName=me.service_name, desiredStatus="RUNNING"
        ):
            arns.extend(page.get("taskArns", []))
        tasks = []
        for i in range(0, len(arns), 100):
            tasks.extend(self._ecs.describe_tasks(cluster=me.cluster, tasks=arns[i : i + 100])["tasks"])
        mine = [
            t
            for t in tasks
            if t.get("lastStatus") == "RUNNING"
            and t.get("group") == me.group
            and t.get("taskDefinitionArn") == me.task_definition_arn
            and t.get("startedBy", "") == me.started_by
        ]
        ci_arns = sorted({t["containerInstanceArn"] for t in mine if t.get("containerInstanceArn")})
        instance_of: dict[str, str] = {}
        for i in range(0, len(ci_arns), 100):
            for ci in self._ecs.describe_container_instances(
                cluster=me.cluster, containerInstances=ci_arns[i : i + 100]
            )["containerInstances"]:
                instance_of[ci["containerInstanceArn"]] = ci["ec2InstanceId"]
        instance_ids = sorted(set(instance_of.values()))
        unknown = [i for i in instance_ids if i not in self._address]
        if unknown:  # an instance keeps its primary private address for life: look each up once
            for page in self._ec2.get_paginator("describe_instances").paginate(InstanceIds=unknown):
                for r in page["Reservations"]:
                    for inst in r["Instances"]:
                        self._address[inst["InstanceId"]] = inst["PrivateIpAddress"]
        address = self._address
        paths = self._topology.network_nodes(instance_ids) if instance_ids else {}
        out = []
        for t in mine:
            iid = instance_of.get(t.get("containerInstanceArn", ""))
            if iid is None or iid not in address:
                continue  # not placed yet / instance gone: it is not a member until it is
            out.append(
                Candidate(
                    host=address[iid],
                    api_port=self._api_port,
                    instance_id=iid,
                    task_arn=t["taskArn"],
                    network_nodes=paths.get(iid, ()),
                )
            )
        return order_candidates(out)

    def try_form(self) -> tuple[Membership | None, int]:
        """(membership, members present): a membership if the first world_size candidates in rank
        order include me, else None."""
        me = self.identity()
        ordered = self.candidates()
        if len(ordered) < self._world_size:
            return None, len(ordered)
        unit = ordered[: self._world_size]
        mine = [c for c in unit if c.task_arn == me.task_arn]
        if not mine:
            return None, len(ordered)  # a spare (e.g. a surge task): wait until a place frees up
        return build_membership(
            unit_id=self._unit_id, revision=self._revision, ordered=unit, me=mine[0], dist_port=self._dist_port
        ), len(ordered)

    # -- Rendezvous protocol ----------------------------------------------------------------------
    async def join(self) -> Membership:
        deadline = time.monotonic() + self._timeout_s
        seen = -1
        while True:
            m, n = await asyncio.to_thread(self.try_form)
            if m is not None:
                log.info(
                    json.dumps(
                        {
                            "event": "rendezvous",
                            "unit": self._unit_id,
                            "rank": m.rank,
                            "world_size": m.world_size,
                            "leader": m.dist_host,
                        }
                    )
                )
                return m
            if n != seen:
                log.info(json.dumps({"event": "rendezvous_wait", "present": n, "world_size": self._world_size}))
                seen = n
            if time.monotonic() >= deadline:
                raise RendezvousTimeout(
                    f"only {n} of {self._world_size} members of service {self.identity().service_name} "
                    f"(deployment {self.identity().started_by}) are RUNNING after {self._timeout_s:.0f}s: "
                    "check the service's events and capacity, or raise FLOTILLA_RENDEZVOUS_TIMEOUT_S"
                )
            await asyncio.sleep(self._poll_s)

    async def changed(self, current: Membership) -> bool:
        m, _ = await asyncio.to_thread(self.try_form)
        if m is None:
            return True
        return [x.task_arn for x in m.members] != [x.task_arn for x in current.members] or m.rank != current.rank
