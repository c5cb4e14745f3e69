"""What the fleet looks like right now: cells, units and nodes from ECS, EC2 and Cloud Map, and
each node's own word on readiness and load from its /health/ready endpoint.

A cell is an ECS cluster tagged flotilla:deployment=<deployment> and flotilla:cell (stacks/cell.py
names it <deployment>-cell<n>); a unit is a service in it whose task definition sets
FLOTILLA_UNIT_ID. Nothing here changes anything.
"""

from __future__ import annotations

import fnmatch
import json
import re
import urllib.error
import urllib.request
from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import contract
from contract.ready import Loading, ReadyReport, read_ready
from ops.aws import Aws, chunks
from ops.errors import OpsError

# The service tag drain-unit leaves: the unit is drained on purpose (value: its desired count before),
# so status does not count it as failing and restore-unit knows to bring it back.
DRAINED_TAG = contract.TAG_DRAINED_DESIRED_COUNT
DRAINED_IN_CONFIG_TAG = contract.TAG_DRAINED_IN_CONFIG
# The units' Cloud Map services: one per cell, units-cell<n> (stacks/discovery.py); the pattern also
# matches the single `units` service of deployments made before the per-cell layout.
UNITS_CLOUDMAP_SERVICE = "units*"
# Tags the stacks put on every resource (stacks/deployment.py, stacks/cell.py, stacks/unit.py).
DEPLOYMENT_TAG, CELL_TAG, UNIT_TAG = "flotilla:deployment", "flotilla:cell", "flotilla:unit"
STACK_NAME_TAG = "aws:cloudformation:stack-name"


def arn_name(arn: str) -> str:
    """The part of an ARN after its last "/": a task's id, a task definition's family:revision."""
    return arn.rsplit("/", 1)[-1]


def _cell_sort_key(cell_id: str) -> tuple[int, str]:
    m = re.search(r"(\d+)$", cell_id)
    return (int(m.group(1)) if m else 1 << 30, cell_id)


def _unit_sort_key(unit_id: str) -> tuple[int | str, ...]:
    return tuple(int(n) if n.isdigit() else n for n in re.split(r"(\d+)", unit_id))


@dataclass
class Node:
    task_arn: str
    last_status: str
    task_definition_arn: str
    started_by: str = ""
    instance_id: str | None = None
    container_instance_arn: str | None = None
    private_ip: str | None = None
    availability_zone: str | None = None
    registered: bool = False  # listed in Cloud Map, so the router can find it
    address: str | None = None  # host:port of its HTTP server
    health: dict[str, Any] | None = None
    health_error: str | None = None
    reported_by: str | None = None  # host:port of the leader whose ready body gave `health`
    ecs_health: str = "UNKNOWN"  # the container health check (alive): HEALTHY | UNHEALTHY | UNKNOWN
    desired_status: str = "RUNNING"  # STOPPED: ECS is stopping it (it may still finish in-flight requests)

    @property
    def stopping(self) -> bool:
        return self.desired_status == "STOPPED"

    def _read(self) -> tuple[ReadyReport | None, str | None]:
        if self.health is None:
            return None, None
        try:
            return read_ready(self.health), None
        except ValueError as err:
            return None, str(err)

    @property
    def report(self) -> ReadyReport | None:
        """Its ready body as read_ready takes it; None when it has none or one read_ready refuses
        (fetch_health keeps only bodies it can read; `unreadable` says what is wrong with another)."""
        return self._read()[0]

    @property
    def unreadable(self) -> str | None:
        """What read_ready says is wrong with its ready body, or None (no body, or a usable one)."""
        return self._read()[1]

    @property
    def task_id(self) -> str:
        return arn_name(self.task_arn)

    @property
    def rank(self) -> int | None:
        r = self.report
        return r.rank if r is not None and r.rank >= 0 else None

    @property
    def role(self) -> str:
        if self.rank is None:
            return "?"
        return "leader" if self.rank == 0 else "follower"

    @property
    def ready(self) -> bool:
        r = self.report
        return r is not None and r.ready

    @property
    def state(self) -> str:
        if (r := self.report) is not None:
            return r.state or "?"
        if self.unreadable:
            return "unreadable"
        if self.stopping:
            return "stopping"
        return "unreachable" if self.health_error else "unknown"


@dataclass
class Unit:
    cell_id: str
    unit_id: str
    cluster_arn: str
    service_name: str
    service_arn: str
    desired: int
    task_definition_arn: str
    revision: str  # FLOTILLA_REVISION of the service's task definition
    nodes_per_unit: int
    deployments: list[dict[str, Any]] = field(default_factory=list)
    tags: dict[str, str] = field(default_factory=dict)
    nodes: list[Node] = field(default_factory=list)
    probed: bool = True  # False: nobody asked the nodes (--no-health); judge by ECS only
    router_view: dict[str, Any] | None = None  # the routers' latest report on it (status --health-via router-logs)

    @property
    def drained(self) -> bool:
        return self.desired == 0 and DRAINED_TAG in self.tags

    def formations(self) -> list[list[Node]]:
        """RUNNING members grouped the way rendezvous groups them (same task definition and same
        deployment, `startedBy`): during a surge rollout the old and the new formation run side by
        side. The service's current task definition comes first. A member ECS is stopping belongs
        to none: it only finishes what it has."""
        groups: dict[tuple[str, str], list[Node]] = {}
        for n in self.nodes:
            if n.last_status == "RUNNING" and not n.stopping:
                groups.setdefault((n.task_definition_arn, n.started_by), []).append(n)
        return sorted(groups.values(), key=lambda g: (g[0].task_definition_arn != self.task_definition_arn, -len(g)))

    def _formation_problems(self, members: list[Node]) -> list[str]:
        n_want = self.nodes_per_unit
        out: list[str] = []
        if len(members) < n_want:
            out.append(f"{len(members)} of {n_want} nodes RUNNING")
        for n in members:
            if n.ecs_health == "UNHEALTHY":
                out.append(f"node {n.instance_id or n.task_id}: ECS container health check UNHEALTHY (not alive)")
        if not self.probed:
            # Without /health/ready only ECS and Cloud Map speak: alive and registered is all we know.
            unregistered = [n.instance_id or n.task_id for n in members if not n.registered]
            if unregistered:
                out.append(f"not registered in Cloud Map: {', '.join(unregistered)}")
            return out
        for n in members:
            r = n.report
            if r is None and n.unreadable:
                out.append(f"node {n.instance_id or n.task_id}: its ready body cannot be read: {n.unreadable}")
            elif r is None:
                out.append(f"node {n.instance_id or n.task_id} unreachable: {n.health_error}")
            elif not r.ready:
                loading = describe_loading(r.loading)
                out.append(
                    f"node {n.instance_id or n.task_id} (rank {n.rank}) is {n.state}, not ready"
                    + (f" ({loading})" if loading else "")
                )
        answered = [n for n in members if n.report is not None]
        reports = [r for n in answered if (r := n.report) is not None]
        revisions = sorted({r.revision for r in reports})
        if len(revisions) > 1:
            out.append(f"members report different revisions {', '.join(revisions)} (a unit must not mix them)")
        ranks = sorted(n.rank for n in answered if n.rank is not None)
        if answered and len(answered) == len(members) and ranks != list(range(len(members))):
            out.append(f"ranks {ranks} are not 0..{len(members) - 1}")
        sizes = {r.world_size for r in reports}
        if any(s != n_want for s in sizes):
            out.append(f"world_size {sorted(sizes)} != nodes_per_unit {n_want}")
        units = {r.unit for r in reports}
        if any(u != self.unit_id for u in units):
            out.append(f"members report unit {sorted(units)}, expected {self.unit_id}")
        leader = next((n for n in members if n.rank == 0), None)
        if leader is not None and not leader.registered:
            out.append("the leader is not registered in Cloud Map: the router cannot reach this unit")
        return out

    def serving_formation(self) -> list[Node] | None:
        """The formation that can serve: every member ready, ranks 0..n-1, leader reachable."""
        return next((f for f in self.formations() if not self._formation_problems(f)), None)

    @property
    def ready(self) -> bool:
        return not self.problems() and not self.drained

    def problems(self) -> list[str]:
        """Why this unit cannot serve (empty when it can, or when it was drained on purpose)."""
        if self.drained:
            return []
        out: list[str] = []
        if self.desired != self.nodes_per_unit:
            out.append(f"desired count {self.desired} != nodes_per_unit {self.nodes_per_unit}")
        for d in self.deployments:
            if d.get("rolloutState") == "FAILED":
                out.append(f"deployment {d.get('id')} FAILED: {d.get('rolloutStateReason', '')}".rstrip(": "))
        formations = self.formations()
        if not formations:
            out.append(f"0 of {self.nodes_per_unit} nodes RUNNING")
        elif self.serving_formation() is None:
            # Explain the formation ECS is converging to; the others are leftovers of a rollout.
            out.extend(self._formation_problems(formations[0]))
        return out


def describe_loading(loading: Loading | None) -> str:
    """A member's ready-body `loading` in a few words (docs/node.md), "" when it is not loading:
    "loading fetch_model 412.0/810.0 GB, 95 s in phase"."""
    if loading is None or not loading.phase:
        return ""
    done, total = loading.done_bytes, loading.total_bytes
    amount = f" {done / 1e9:.1f}/{total / 1e9:.1f} GB" if total else ""
    return f"loading {loading.phase}{amount}, {loading.phase_s:.0f} s in phase"


@dataclass
class Fleet:
    deployment: str
    units: list[Unit]

    @property
    def cells(self) -> list[str]:
        return sorted({u.cell_id for u in self.units}, key=_cell_sort_key)

    def unit(self, unit_id: str) -> Unit:
        for u in self.units:
            if u.unit_id == unit_id:
                return u
        known = ", ".join(u.unit_id for u in self.units) or "none"
        raise OpsError(f"unit {unit_id!r} not found in deployment {self.deployment!r} (units: {known})")

    def node(self, instance_id: str) -> tuple[Unit, Node]:
        for u in self.units:
            for n in u.nodes:
                if n.instance_id == instance_id:
                    return u, n
        raise OpsError(
            f"instance {instance_id!r} runs no member of any unit of deployment {self.deployment!r}: "
            "check the id with `flotilla status`"
        )


# --- discovery ----------------------------------------------------------------------------------
def _all_clusters(aws: Aws) -> list[dict[str, Any]]:
    arns: list[str] = []
    for page in aws.ecs.get_paginator("list_clusters").paginate():
        arns.extend(page.get("clusterArns", []))
    out: list[dict[str, Any]] = []
    for batch in chunks(arns, 100):
        out.extend(aws.ecs.describe_clusters(clusters=batch, include=["TAGS"])["clusters"])
    return out


def _tags(resource: dict[str, Any]) -> dict[str, str]:
    return {t["key"]: t["value"] for t in resource.get("tags", [])}


def _cell_clusters(aws: Aws, deployment: str) -> list[dict[str, Any]]:
    """The deployment's cell clusters: tagged flotilla:deployment + flotilla:cell (stacks/cell.py),
    or, untagged, named <deployment>-cell<n> or made by a <deployment>-Cell-<n> stack."""
    out: list[dict[str, Any]] = []
    for c in _all_clusters(aws):
        tags = _tags(c)
        stack = tags.get(STACK_NAME_TAG, "")
        if (
            (tags.get(DEPLOYMENT_TAG) == deployment and CELL_TAG in tags)
            or re.fullmatch(rf"{re.escape(deployment)}-{contract.CELL_ID_PATTERN}", c["clusterName"])
            or re.fullmatch(rf"{re.escape(deployment)}-Cell-\d+", stack)
        ):
            out.append(c)
    return out


def _active_services(aws: Aws, cluster_arn: str, *, tags: bool = False) -> list[dict[str, Any]]:
    """The cluster's ACTIVE ECS services (DescribeServices takes 10 at a time), with their tags if asked."""
    arns: list[str] = []
    for page in aws.ecs.get_paginator("list_services").paginate(cluster=cluster_arn):
        arns.extend(page.get("serviceArns", []))
    include = {"include": ["TAGS"]} if tags else {}
    out: list[dict[str, Any]] = []
    for batch in chunks(arns, 10):
        out.extend(
            s
            for s in aws.ecs.describe_services(cluster=cluster_arn, services=batch, **include)["services"]
            if s.get("status") == "ACTIVE"
        )
    return out


def router_services(aws: Aws, deployment: str) -> list[dict[str, Any]]:
    """The router's ECS service(s): clusters of the `<deployment>-Router` stack (front door)."""
    out: list[dict[str, Any]] = []
    for cluster in _all_clusters(aws):
        stack = _tags(cluster).get(STACK_NAME_TAG, "")
        if stack != f"{deployment}-Router" and not cluster["clusterName"].startswith(f"{deployment}-Router-"):
            continue
        out.extend(_active_services(aws, cluster["clusterArn"]))
    return out


def container_env(task_definition: dict[str, Any]) -> dict[str, str]:
    env: dict[str, str] = {}
    for c in task_definition.get("containerDefinitions", []):
        env.update({e["name"]: e["value"] for e in c.get("environment", [])})
    return env


def _units_of_cluster(aws: Aws, cluster: dict[str, Any], taskdefs: dict[str, dict[str, Any]]) -> list[Unit]:
    cluster_arn = cluster["clusterArn"]
    units = []
    for s in _active_services(aws, cluster_arn, tags=True):
        td_arn = s["taskDefinition"]
        if td_arn not in taskdefs:
            taskdefs[td_arn] = aws.ecs.describe_task_definition(taskDefinition=td_arn)["taskDefinition"]
        env = container_env(taskdefs[td_arn])
        tags = _tags(s)
        unit_id = env.get(contract.ENV_UNIT_ID) or tags.get(UNIT_TAG)
        if not unit_id:
            continue  # not a unit (e.g. a helper service in the cluster)
        try:
            nodes_per_unit = int(env.get(contract.ENV_NODES_PER_UNIT, s["desiredCount"]))
        except ValueError:
            nodes_per_unit = s["desiredCount"]
        units.append(
            Unit(
                cell_id=env.get(contract.ENV_CELL_ID) or _tags(cluster).get(CELL_TAG, cluster["clusterName"]),
                unit_id=unit_id,
                cluster_arn=cluster_arn,
                service_name=s["serviceName"],
                service_arn=s["serviceArn"],
                desired=s.get("desiredCount", 0),
                task_definition_arn=td_arn,
                revision=env.get(contract.ENV_REVISION, "?"),
                nodes_per_unit=nodes_per_unit,
                deployments=s.get("deployments", []),
                tags=tags,
            )
        )
    return units


def live_tasks(aws: Aws, cluster: str, **list_filter: str) -> list[dict[str, Any]]:
    """Tasks of a cluster (optionally of one service or container instance: ListTasks' serviceName,
    containerInstance) that have not STOPPED yet, draining ones included.

    Both desired statuses: ListTasks lists only desiredStatus RUNNING unless asked for STOPPED, and a
    task ECS is stopping already has desiredStatus STOPPED. ECS sends SIGTERM in the STOPPING state
    and counts only RUNNING tasks in runningCount, so runningCount reaches 0 while the members are
    still finishing their in-flight requests (ECS task lifecycle,
    https://docs.aws.amazon.com/AmazonECS/latest/developerguide/task-lifecycle-explanation.html).
    """
    arns: set[str] = set()
    for desired in ("RUNNING", "STOPPED"):
        for page in aws.ecs.get_paginator("list_tasks").paginate(cluster=cluster, desiredStatus=desired, **list_filter):
            arns.update(page.get("taskArns", []))
    tasks: list[dict[str, Any]] = []
    for batch in chunks(sorted(arns), 100):
        tasks.extend(aws.ecs.describe_tasks(cluster=cluster, tasks=list(batch))["tasks"])
    return [t for t in tasks if t.get("lastStatus") != "STOPPED"]


def container_instances(aws: Aws, cluster: str, **list_filter: str) -> list[dict[str, Any]]:
    """The cluster's container instances, described (ListContainerInstances' filters, e.g. status)."""
    arns: list[str] = []
    for page in aws.ecs.get_paginator("list_container_instances").paginate(cluster=cluster, **list_filter):
        arns.extend(page.get("containerInstanceArns", []))
    out: list[dict[str, Any]] = []
    for batch in chunks(arns, 100):
        out.extend(
            aws.ecs.describe_container_instances(cluster=cluster, containerInstances=list(batch))["containerInstances"]
        )
    return out


def _attach_nodes(aws: Aws, cluster_arn: str, units: list[Unit]) -> None:
    # Members still stopping too: they finish their in-flight requests after SIGTERM, and status
    # must show them rather than a unit that seems to have lost its nodes.
    tasks = live_tasks(aws, cluster_arn)
    by_group = {f"service:{u.service_name}": u for u in units}
    ci_arns = sorted({t["containerInstanceArn"] for t in tasks if t.get("containerInstanceArn")})
    instance_of: dict[str, str] = {}
    for batch in chunks(ci_arns, 100):
        for ci in aws.ecs.describe_container_instances(cluster=cluster_arn, containerInstances=batch)[
            "containerInstances"
        ]:
            instance_of[ci["containerInstanceArn"]] = ci["ec2InstanceId"]
    ec2_info: dict[str, dict[str, Any]] = {}
    ids = sorted(set(instance_of.values()))
    for batch in chunks(ids, 200):
        for r in aws.ec2.describe_instances(InstanceIds=batch)["Reservations"]:
            for i in r["Instances"]:
                ec2_info[i["InstanceId"]] = i
    for t in tasks:
        unit = by_group.get(t.get("group", ""))
        if unit is None:
            continue
        iid = instance_of.get(t.get("containerInstanceArn", ""))
        info = ec2_info.get(iid or "", {})
        unit.nodes.append(
            Node(
                task_arn=t["taskArn"],
                last_status=t.get("lastStatus", "?"),
                ecs_health=t.get("healthStatus", "UNKNOWN"),
                desired_status=t.get("desiredStatus", "RUNNING"),
                task_definition_arn=t.get("taskDefinitionArn", ""),
                started_by=t.get("startedBy", ""),
                instance_id=iid,
                container_instance_arn=t.get("containerInstanceArn"),
                private_ip=info.get("PrivateIpAddress"),
                availability_zone=info.get("Placement", {}).get("AvailabilityZone"),
            )
        )


def _cloudmap_instances(aws: Aws, deployment: str, namespace: str | None, service: str) -> list[dict[str, Any]] | None:
    """Instances of the units' Cloud Map services (`service` is a name or a pattern like units*),
    or None when there is no such service."""
    namespaces: dict[str, str] = {}
    for page in aws.servicediscovery.get_paginator("list_namespaces").paginate():
        for ns in page.get("Namespaces", []):
            namespaces[ns["Id"]] = ns["Name"]
    candidates = []
    for page in aws.servicediscovery.get_paginator("list_services").paginate():
        for s in page.get("Services", []):
            if not fnmatch.fnmatchcase(s["Name"], service):
                continue
            # ListServices summaries carry no namespace id; GetService does.
            ns_id = aws.servicediscovery.get_service(Id=s["Id"])["Service"].get("NamespaceId", "")
            ns_name = namespaces.get(ns_id, ns_id)
            if namespace is None or ns_name == namespace:
                candidates.append((ns_name, s))
    if not candidates:
        return None
    if len({n for n, _ in candidates}) > 1 and namespace is None:
        # The Discovery stack names the namespace <deployment_name>.internal.
        ours = [c for c in candidates if c[0] == f"{deployment}.internal"]
        candidates = ours or candidates
    if len({n for n, _ in candidates}) > 1:
        names = ", ".join(sorted({n for n, _ in candidates}))
        raise OpsError(
            f"Cloud Map service {service!r} exists in several namespaces ({names}): pass --cloudmap-namespace"
        )
    out: list[dict[str, Any]] = []
    for _, svc in candidates:
        for page in aws.servicediscovery.get_paginator("list_instances").paginate(ServiceId=svc["Id"]):
            out.extend(page.get("Instances", []))
    return out


def _attach_cloudmap(units: list[Unit], instances: list[dict[str, Any]] | None) -> None:
    by_id = {i["Id"]: i for i in instances or []}
    by_ip = {i.get("Attributes", {}).get(contract.CLOUDMAP_ATTR_IPV4): i for i in instances or []}
    for u in units:
        for n in u.nodes:
            inst = by_id.get(n.task_id) or (by_ip.get(n.private_ip) if n.private_ip else None)
            port = contract.NODE_API_PORT
            host = n.private_ip
            if inst is not None:
                n.registered = True
                attrs = inst.get("Attributes", {})
                host = attrs.get(contract.CLOUDMAP_ATTR_IPV4, host)
                port = int(attrs.get(contract.CLOUDMAP_ATTR_PORT, port))
            n.address = f"{host}:{port}" if host else None


def fetch_health(address: str, *, timeout_s: float) -> tuple[dict[str, Any] | None, str | None]:
    """GET /health/ready; a 503 still carries the JSON body that says why the node is not ready."""
    url = f"http://{address}{contract.NODE_READY_PATH}"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 (plain http inside the VPC)
            body = resp.read()
    except urllib.error.HTTPError as err:
        body = err.read()
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        return None, f"{url}: {reason}"
    try:
        doc = json.loads(body)
    except ValueError:
        return None, f"{url}: answered with something that is not JSON"
    try:
        read_ready(doc)  # the one reader of ready bodies (the router's too): lenient across revisions
    except ValueError as err:
        return None, f"{url}: {err}"
    return doc, None


def _ask(nodes: list[Node], *, timeout_s: float) -> None:
    if not nodes:
        return
    with ThreadPoolExecutor(max_workers=min(32, len(nodes))) as pool:
        results = list(pool.map(lambda n: fetch_health(n.address or "", timeout_s=timeout_s), nodes))
    for n, (doc, err) in zip(nodes, results):
        n.health, n.health_error = doc, err


def _through_leader(leader: Node, by_address: dict[str, Node]) -> list[Node]:
    """Fill in the followers a leader's ready body reports (contract.ATTR_MEMBERS) as if they had
    answered themselves; the leader asks them every quarter second anyway. Returns the ones to ask
    directly: those it could not reach, and all of them when the leader is not ready (its last word
    on a follower may predate what broke the unit, and the operator needs each member's own)."""
    report = leader.report
    if report is None:
        return []
    direct: list[Node] = []
    for m in report.members or []:
        n = by_address.get(str(m.get("address"))) if isinstance(m, dict) else None
        if n is None or n is leader or n.health is not None:
            continue
        if m.get("state") == "unreachable" or not report.ready:
            direct.append(n)
            continue
        n.health = {
            "ready": bool(m.get("ready")),
            "state": m.get("state"),
            contract.ATTR_UNIT: report.unit,
            contract.ATTR_REVISION: m.get("revision"),
            "rank": m.get("rank"),
            "world_size": report.world_size,
            contract.ATTR_ROLE: "follower",
            contract.ATTR_CELL: report.cell,
            "load": report.load.model_dump(exclude_unset=True),  # its leader's load, as far as it was given
            contract.ATTR_LEADER: leader.address,
        }
        n.health_error, n.reported_by = None, leader.address
    return direct


def probe_health(units: list[Unit], *, timeout_s: float) -> None:
    """Each formation's leader answers for its followers: ask one member of each formation, then its
    leader if that member was a follower (its body names the leader), take the followers from the
    leader's body, and ask directly only the members no leader reported (members of an older
    revision, a leader that is down, a follower its leader cannot reach)."""
    nodes = [n for u in units for n in u.nodes if n.address and n.last_status == "RUNNING"]
    by_address = {n.address: n for n in nodes if n.address}
    first = [f[0] for u in units for f in u.formations() if f[0].address]
    _ask(first, timeout_s=timeout_s)
    leaders = [by_address[str(r.leader)] for n in first if (r := n.report) is not None and r.leader in by_address]
    _ask([n for n in dict.fromkeys(leaders) if n.health is None and n.health_error is None], timeout_s=timeout_s)
    again: list[Node] = []
    for n in nodes:
        if (r := n.report) is not None and r.role == "leader" and n.reported_by is None:
            again.extend(_through_leader(n, by_address))
    _ask(
        again + [n for n in nodes if n.health is None and n.health_error is None and n not in again],
        timeout_s=timeout_s,
    )
    for u in units:
        for n in u.nodes:
            if n.last_status == "RUNNING" and not n.address:
                n.health_error = "no address (no Cloud Map entry and no private IP)"


def discover(
    aws: Aws,
    *,
    deployment: str,
    cloudmap_namespace: str | None = None,
    cloudmap_service: str = UNITS_CLOUDMAP_SERVICE,
    health: bool = True,
    health_timeout_s: float = 2.0,
    clusters: Collection[str] | None = None,
) -> Fleet:
    """The deployment's fleet; with `clusters` (cell cluster ARNs) only the units of those cells, for a
    wait that watches a few units and need not probe every node of the deployment each poll."""
    units: list[Unit] = []
    taskdefs: dict[str, dict[str, Any]] = {}
    for cluster in _cell_clusters(aws, deployment):
        if clusters is not None and cluster["clusterArn"] not in clusters:
            continue
        cluster_units = _units_of_cluster(aws, cluster, taskdefs)
        if cluster_units:
            _attach_nodes(aws, cluster["clusterArn"], cluster_units)
        units.extend(cluster_units)
    instances = _cloudmap_instances(aws, deployment, cloudmap_namespace, cloudmap_service) if units else None
    _attach_cloudmap(units, instances)
    if health:
        probe_health(units, timeout_s=health_timeout_s)
    else:
        for u in units:
            u.probed = False
    for u in units:
        u.nodes.sort(key=lambda n: (n.rank if isinstance(n.rank, int) else 1 << 30, n.instance_id or "", n.task_id))
    units.sort(key=lambda u: (_cell_sort_key(u.cell_id), _unit_sort_key(u.unit_id)))
    return Fleet(deployment=deployment, units=units)
