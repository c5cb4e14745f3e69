"""A boto-level model of the ECS API for the CLI's tests: UpdateService creates a deployment, the
service scheduler starts and stops tasks within minimumHealthyPercent / maximumPercent, and each
task walks the documented lifecycle one state per scheduler tick, so a command that waits has to
wait for what ECS would make it wait for. moto answers the same calls with instant counts. The
records it keeps (tasks, services, deployments...) are in ecs_api_records.py.

Every request is validated against botocore's own ECS service model (a parameter the real API
rejects is rejected here too). Behaviour and its source, rule by rule:

- Task lifecycle: PROVISIONING, PENDING, ACTIVATING, RUNNING, then DEACTIVATING, STOPPING,
  DEPROVISIONING, STOPPED; SIGTERM is sent in STOPPING ("the container agent will send the SIGTERM
  signal ... and then send a SIGKILL after waiting the StopTimeout") —
  https://docs.aws.amazon.com/AmazonECS/latest/developerguide/task-lifecycle-explanation.html
- ListTasks lists tasks whose *desired* status is RUNNING unless asked for STOPPED ("The default
  status filter is RUNNING"); DescribeTasks shows stopped tasks "for at least one hour" — botocore
  ecs ListTasksRequest.desiredStatus / DescribeTasks operation docs.
- Deployments: "PRIMARY The most recent deployment", "ACTIVE ... still has running tasks, but are in
  the process of being replaced", rolloutState IN_PROGRESS -> COMPLETED at steady state, FAILED when
  the circuit breaker trips — botocore ecs Deployment.status / Deployment.rolloutState.
- runningCount counts tasks "in the RUNNING status", pendingCount "in the PENDING status" — botocore
  ecs Deployment.runningCount / pendingCount. A task that is stopping no longer counts as running.
- The scheduler's decisions in each pass (unhealthy tasks stopped, the circuit breaker and its
  rollback, tasks started within maximumPercent and the free instances, old tasks stopped within
  minimumHealthyPercent, steady state) are ecs_scheduler.decide's, the same the rehearsal's
  scheduler takes; the rules and their sources are there.
- healthCheckGracePeriodSeconds (default 0): the scheduler ignores a task's unhealthy status until
  that long after the task's startedAt (PENDING to RUNNING); changing it in UpdateService starts no
  deployment — botocore ecs CreateService / UpdateService healthCheckGracePeriodSeconds docs.
- Desired-count changes resize the PRIMARY deployment; a new task definition (or
  forceNewDeployment) starts a new deployment — botocore ecs UpdateService operation doc.
- "you can't update an existing service to reference an INACTIVE task definition" — botocore ecs
  DeregisterTaskDefinition doc; the error ECS returns: "TaskDefinition is inactive" (ClientException,
  aws/aws-cdk#33195). DescribeTaskDefinition still returns INACTIVE revisions; ListTaskDefinitions
  lists INACTIVE ones only "as long as an active task or service still references them" — botocore
  ecs ListTaskDefinitionsRequest.status.
- Circuit breaker: failedTasks counts tasks that exit before they are healthy ("A task is
  considered a failure if ... the task doesn't transition to a RUNNING state, or if it fails any of
  its defined health checks and is stopped", botocore ecs Deployment.failedTasks) and a task that
  turns healthy resets it ("resetOnHealthyTask ... The default is true", botocore ecs
  DeploymentCircuitBreaker).
- DRAINING container instances: "new tasks aren't placed on the container instance and any service
  tasks running on the container instance are removed if possible" — botocore ecs
  ContainerInstance.status; they are replaced within the same min/max percent as a deployment.
- Host networking on one fixed port plus distinctInstance: at most one of a unit's tasks per
  instance, and an instance is free only once its previous task is STOPPED.
- Paging: ListServices answers 10 ARNs a page and ListTasks / ListContainerInstances 100 unless
  asked for maxResults (1-100), with a nextToken for the rest; DescribeServices takes at most 10
  services and DescribeTasks 100 (the limits and their sources are in ecs_rules.py).
- Service events: "service <name> was unable to place a task because no container instance met all
  of its requirements", "has started N tasks", "has reached a steady state", newest first, at most
  100 — https://docs.aws.amazon.com/AmazonECS/latest/developerguide/service-event-messages.html and
  botocore ecs Service.events.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import botocore.session
from botocore.exceptions import ClientError, ParamValidationError
from botocore.validate import ParamValidator
from ecs_api_records import (
    EPOCH,
    LIFECYCLE_UP,
    STARTING,
    STOPPING,
    ContainerInstance,
    Deployment,
    Service,
    Task,
    TaskDef,
    arn_of,
    step_down,
)

from ops.rehearsal import ecs_rules
from ops.rehearsal.ecs_scheduler import DeploymentView, Rollout, ServiceView, TaskView, decide

_ECS_MODEL = botocore.session.get_session().get_service_model("ecs")


def client_error(op: str, code: str, message: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": message}}, op)


def _page(op: str, kw: dict[str, Any], items: list[str], default: int) -> tuple[list[str], dict[str, Any]]:
    """One page of a List* answer and the nextToken for the rest: "When the results of a ListTasks
    request exceed maxResults, this value can be used to retrieve the next page of results. This
    value is null when there are no more results to return." (API_ListTasks.html; the same for
    ListServices and ListContainerInstances). The token is opaque to callers; here it is an offset."""
    size = kw.get("maxResults", default)
    if not 1 <= size <= ecs_rules.LIST_MAX_RESULTS:
        raise client_error(op, "InvalidParameterException", "maxResults must be between 1 and 100.")
    start = int(kw.get("nextToken", "0"))
    page = items[start : start + size]
    more = {"nextToken": str(start + size)} if start + size < len(items) else {}
    return page, more


def _grace_period(op: str, kw: dict[str, Any]) -> int:
    """healthCheckGracePeriodSeconds: "If you don't specify a health check grace period value, the
    default value of 0 is used." and "you can specify a health check grace period of up to
    2,147,483,647 seconds" (API_CreateService.html, API_UpdateService.html)."""
    value = kw.get("healthCheckGracePeriodSeconds", 0)
    if not isinstance(value, int) or not 0 <= value <= 2_147_483_647:
        raise client_error(op, "InvalidParameterException", "healthCheckGracePeriodSeconds must be 0 to 2147483647")
    return value


def _at_most(op: str, what: str, refs: list[str], limit: int) -> None:
    if len(refs) > limit:
        raise client_error(op, "InvalidParameterException", f"{what} cannot have more than {limit} entries.")


class EcsModel:
    """The ECS API (the calls flotilla makes) over an in-memory account. `tick()` is one step of the
    service scheduler and of every task's lifecycle. ECS moves on whether or not anyone looks; here
    time passes when a wait loop looks (each call in `TICK_ON`), and tests may tick or settle() it."""

    TICK_ON = frozenset({"DescribeServices", "DescribeTasks", "ListContainerInstances"})

    def __init__(self) -> None:
        self.clusters: dict[str, dict[str, Any]] = {}  # arn -> {name, tags}
        self.task_defs: dict[str, TaskDef] = {}  # arn -> TaskDef
        self.deleted_task_defs: set[str] = set()
        self.services: dict[tuple[str, str], Service] = {}  # (cluster arn, name)
        self.tasks: dict[str, Task] = {}
        self.instances: dict[str, ContainerInstance] = {}
        self.now = EPOCH
        self.ticks = 0
        self.failing_task_definitions: set[str] = set()  # their tasks exit right after RUNNING
        self.calls: list[tuple[str, dict[str, Any]]] = []  # every request, in order
        self.log: list[tuple[int, str, str]] = []  # (tick, what, service): starts, completions
        self.on_task_change: list[Callable[[Task], None]] = []
        self.on_deployment_completed: list[Callable[[Service, Deployment], None]] = []
        self.on_tick: list[Callable[[], None]] = []
        self._ids = itertools.count(1)
        self._validator = ParamValidator()

    # --- plumbing ---------------------------------------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        raise NotImplementedError(
            f"the ECS model does not implement {name}: add it (with its source) if flotilla calls it"
        )

    def _request(self, op: str, params: dict[str, Any]) -> None:
        shape = _ECS_MODEL.operation_model(op).input_shape
        report = self._validator.validate(params, shape)
        if report.has_errors():
            raise ParamValidationError(report=report.generate_report())
        self.calls.append((op, params))
        if op in self.TICK_ON:
            self.tick()

    def _next_id(self) -> str:
        return f"{next(self._ids):032x}"

    def _event(self, service: Service, kind: str, message: str) -> None:
        # Duplicate messages are omitted "until either the cause is resolved or six hours passes".
        if service.last_event.get(kind) == message:
            return
        service.last_event[kind] = message
        service.events.insert(0, {"id": self._next_id(), "createdAt": self.now, "message": message})
        del service.events[100:]

    def _clusterarn_of(self, cluster: str | None) -> str:
        name = (cluster or "default").rsplit("/", 1)[-1]
        arn = arn_of("cluster", name)
        if arn not in self.clusters:
            raise client_error("Unknown", "ClusterNotFoundException", "Cluster not found.")
        return arn

    def _service(self, cluster: str, service: str) -> Service:
        key = (self._clusterarn_of(cluster), service.rsplit("/", 1)[-1])
        if key not in self.services:
            raise client_error("UpdateService", "ServiceNotFoundException", "Service not found.")
        return self.services[key]

    def _task_def(self, ref: str, op: str) -> TaskDef:
        name = ref.rsplit("/", 1)[-1]
        if name in self.deleted_task_defs or ref in self.deleted_task_defs:
            raise client_error(op, "ClientException", "Unable to describe task definition.")
        if ":" not in name:  # a family: its latest ACTIVE revision
            revs = [t for t in self.task_defs.values() if t.family == name and t.status == "ACTIVE"]
            if not revs:
                raise client_error(op, "ClientException", "Unable to describe task definition.")
            return max(revs, key=lambda t: t.revision)
        td = self.task_defs.get(arn_of("task-definition", name))
        if td is None:
            raise client_error(op, "ClientException", "Unable to describe task definition.")
        return td

    def get_paginator(self, name: str) -> _Paginator:
        return _Paginator(getattr(self, name), name)

    # --- clusters and container instances -----------------------------------------------------------
    def create_cluster(self, **kw: Any) -> dict[str, Any]:
        self._request("CreateCluster", kw)
        arn = arn_of("cluster", kw["clusterName"])
        self.clusters[arn] = {"name": kw["clusterName"], "tags": kw.get("tags", [])}
        return {"cluster": self._describe_cluster(arn)}

    def _describe_cluster(self, arn: str) -> dict[str, Any]:
        c = self.clusters[arn]
        return {"clusterArn": arn, "clusterName": c["name"], "status": "ACTIVE", "tags": c["tags"]}

    def list_clusters(self, **kw: Any) -> dict[str, Any]:
        self._request("ListClusters", kw)
        return {"clusterArns": list(self.clusters)}

    def describe_clusters(self, **kw: Any) -> dict[str, Any]:
        self._request("DescribeClusters", kw)
        arns = [self._clusterarn_of(c) for c in kw.get("clusters", [])]
        return {"clusters": [self._describe_cluster(a) for a in arns], "failures": []}

    def add_container_instance(self, cluster: str, ec2_instance_id: str, *, capacity_provider: str) -> str:
        """What the ECS agent does once an instance has booted: RegisterContainerInstance. A service
        with a capacity provider strategy places tasks only on its provider's instances."""
        arn = arn_of("container-instance", f"{cluster.rsplit('/', 1)[-1]}/{self._next_id()}")
        self.instances[arn] = ContainerInstance(
            arn=arn, cluster=cluster, ec2_instance_id=ec2_instance_id, capacity_provider=capacity_provider
        )
        return arn

    def instance_terminated(self, ec2_instance_id: str) -> None:
        """EC2 terminated the instance: its tasks stop and the container instance goes INACTIVE."""
        for ci in self.instances.values():
            if ci.ec2_instance_id == ec2_instance_id and not ci.terminated:
                ci.terminated, ci.status = True, "INACTIVE"
                for t in self.tasks.values():
                    if t.container_instance == ci.arn and t.last_status != "STOPPED":
                        t.desired_status = "STOPPED"
                        t.last_status = "STOPPED"
                        t.stopped_at = self.now
                        t.stop_code = "TerminationNotice"
                        t.stopped_reason = f"Host EC2 (instance {ec2_instance_id}) terminated."
                        self._changed(t)

    def list_container_instances(self, **kw: Any) -> dict[str, Any]:
        self._request("ListContainerInstances", kw)
        cluster = self._clusterarn_of(kw.get("cluster"))
        # "The default is to include container instances set to all states other than INACTIVE."
        wanted = [kw["status"]] if "status" in kw else ["ACTIVE", "DRAINING"]
        arns = [ci.arn for ci in self.instances.values() if ci.cluster == cluster and ci.status in wanted]
        page, more = _page("ListContainerInstances", kw, arns, ecs_rules.LIST_CONTAINER_INSTANCES_PAGE)
        return {"containerInstanceArns": page, **more}

    def describe_container_instances(self, **kw: Any) -> dict[str, Any]:
        self._request("DescribeContainerInstances", kw)
        out = []
        for arn in kw["containerInstances"]:
            ci = self.instances[arn]
            running = sum(1 for t in self.tasks.values() if t.container_instance == arn and t.last_status == "RUNNING")
            out.append(
                {
                    "containerInstanceArn": arn,
                    "ec2InstanceId": ci.ec2_instance_id,
                    "status": ci.status,
                    "agentConnected": not ci.terminated,
                    "runningTasksCount": running,
                }
            )
        return {"containerInstances": out, "failures": []}

    def update_container_instances_state(self, **kw: Any) -> dict[str, Any]:
        self._request("UpdateContainerInstancesState", kw)
        for arn in kw["containerInstances"]:
            ci = self.instances[arn]
            if ci.status not in ("ACTIVE", "DRAINING"):
                raise client_error(
                    "UpdateContainerInstancesState",
                    "InvalidParameterException",
                    f"Container instance {arn} is {ci.status}: only ACTIVE or DRAINING instances can change state.",
                )
            ci.status = kw["status"]
        return self.describe_container_instances(
            cluster=kw.get("cluster", "default"), containerInstances=kw["containerInstances"]
        )

    # --- task definitions -----------------------------------------------------------------------------
    def register_task_definition(self, **kw: Any) -> dict[str, Any]:
        self._request("RegisterTaskDefinition", kw)
        request = {k: v for k, v in kw.items() if k != "tags"}
        family = kw["family"]
        revision = 1 + max((t.revision for t in self.task_defs.values() if t.family == family), default=0)
        revision = max(
            revision,
            1
            + max((int(a.rsplit(":", 1)[1]) for a in self.deleted_task_defs if a.startswith(f"{family}:")), default=0),
        )
        td = TaskDef(family=family, revision=revision, request=request, tags=kw.get("tags", []))
        self.task_defs[td.arn] = td
        return {"taskDefinition": td.describe(), "tags": td.tags}

    def deregister_task_definition(self, **kw: Any) -> dict[str, Any]:
        self._request("DeregisterTaskDefinition", kw)
        td = self._task_def(kw["taskDefinition"], "DeregisterTaskDefinition")
        td.status = "INACTIVE"
        return {"taskDefinition": td.describe()}

    def delete_task_definition(self, arn: str) -> None:
        """DeleteTaskDefinitions of an INACTIVE revision (the clean-up the docs describe)."""
        td = self.task_defs.pop(arn)
        assert td.status == "INACTIVE", "ECS deletes only INACTIVE revisions"
        self.deleted_task_defs.add(f"{td.family}:{td.revision}")

    def describe_task_definition(self, **kw: Any) -> dict[str, Any]:
        self._request("DescribeTaskDefinition", kw)
        td = self._task_def(kw["taskDefinition"], "DescribeTaskDefinition")
        out: dict[str, Any] = {"taskDefinition": td.describe()}
        if "TAGS" in kw.get("include", []):
            out["tags"] = td.tags
        return out

    def list_task_definitions(self, **kw: Any) -> dict[str, Any]:
        self._request("ListTaskDefinitions", kw)
        status = kw.get("status", "ACTIVE")
        referenced = (
            {s.task_definition for s in self.services.values()}
            | {d.task_definition for s in self.services.values() for d in s.deployments}
            | {t.task_definition for t in self.tasks.values() if t.last_status != "STOPPED"}
        )
        arns = [
            td
            for td in self.task_defs.values()
            if td.family.startswith(kw.get("familyPrefix", ""))
            and td.status == status
            and (status == "ACTIVE" or td.arn in referenced)
        ]
        arns.sort(key=lambda t: (t.family, t.revision), reverse=kw.get("sort") == "DESC")
        return {"taskDefinitionArns": [t.arn for t in arns]}

    # --- services --------------------------------------------------------------------------------------
    def create_service(self, **kw: Any) -> dict[str, Any]:
        self._request("CreateService", kw)
        cluster = self._clusterarn_of(kw.get("cluster"))
        td = self._task_def(kw["taskDefinition"], "CreateService")
        if td.status != "ACTIVE":
            raise client_error("CreateService", "ClientException", "TaskDefinition is inactive")
        cfg = kw.get("deploymentConfiguration", {})
        breaker = cfg.get("deploymentCircuitBreaker", {"enable": True, "rollback": True})
        svc = Service(
            name=kw["serviceName"],
            cluster=cluster,
            desired=kw.get("desiredCount", 0),
            task_definition=td.arn,
            min_percent=cfg.get("minimumHealthyPercent", 100),
            max_percent=cfg.get("maximumPercent", 200),
            tags=kw.get("tags", []),
            capacity_provider=(kw.get("capacityProviderStrategy") or [{}])[0].get("capacityProvider", ""),
            circuit_breaker=breaker.get("enable", False),
            rollback=breaker.get("rollback", False),
            grace_s=_grace_period("CreateService", kw),
        )
        svc.deployments.append(Deployment(id=f"ecs-svc/{next(self._ids)}", task_definition=td.arn, desired=svc.desired))
        self.services[(cluster, svc.name)] = svc
        return {"service": self._describe_service(svc, tags=True)}

    def _describe_service(self, s: Service, *, tags: bool) -> dict[str, Any]:
        out: dict[str, Any] = {
            "serviceArn": s.arn,
            "serviceName": s.name,
            "clusterArn": s.cluster,
            "status": "ACTIVE",
            "desiredCount": s.desired,
            "runningCount": sum(d.running for d in s.deployments),
            "pendingCount": sum(d.pending for d in s.deployments),
            "taskDefinition": s.task_definition,
            "deploymentConfiguration": {
                "minimumHealthyPercent": s.min_percent,
                "maximumPercent": s.max_percent,
                "deploymentCircuitBreaker": {"enable": s.circuit_breaker, "rollback": s.rollback},
            },
            "deployments": [d.describe() for d in s.deployments],
            "healthCheckGracePeriodSeconds": s.grace_s,
            "events": list(s.events),
            "launchType": "EC2",
            "placementConstraints": [{"type": "distinctInstance"}],
        }
        if tags:
            out["tags"] = list(s.tags)
        return out

    def list_services(self, **kw: Any) -> dict[str, Any]:
        self._request("ListServices", kw)
        cluster = self._clusterarn_of(kw.get("cluster"))
        arns = [s.arn for (c, _), s in self.services.items() if c == cluster]
        page, more = _page("ListServices", kw, arns, ecs_rules.LIST_SERVICES_PAGE)
        return {"serviceArns": page, **more}

    def describe_services(self, **kw: Any) -> dict[str, Any]:
        self._request("DescribeServices", kw)
        _at_most("DescribeServices", "services", kw["services"], ecs_rules.DESCRIBE_SERVICES_MAX)
        cluster = self._clusterarn_of(kw.get("cluster"))
        out = []
        for ref in kw["services"]:
            s = self.services.get((cluster, ref.rsplit("/", 1)[-1]))
            if s is not None:
                out.append(self._describe_service(s, tags="TAGS" in kw.get("include", [])))
        return {"services": out, "failures": []}

    def update_service(self, **kw: Any) -> dict[str, Any]:
        self._request("UpdateService", kw)
        s = self._service(kw.get("cluster", "default"), kw["service"])
        if "desiredCount" in kw:
            s.desired = kw["desiredCount"]
            s.primary.desired = s.desired
        if "healthCheckGracePeriodSeconds" in kw:
            # "This parameter doesn't trigger a new service deployment." (UpdateService API reference)
            s.grace_s = _grace_period("UpdateService", kw)
        new_td = None
        if "taskDefinition" in kw:
            td = self._task_def(kw["taskDefinition"], "UpdateService")
            if td.status != "ACTIVE":
                raise client_error("UpdateService", "ClientException", "TaskDefinition is inactive")
            if td.arn != s.task_definition:
                new_td = td.arn
        if new_td is not None or kw.get("forceNewDeployment"):
            self._start_deployment(s, new_td or s.task_definition)
        return {"service": self._describe_service(s, tags=False)}

    def _start_deployment(self, s: Service, td_arn: str) -> None:
        for d in s.deployments:
            d.status = "ACTIVE"
        s.task_definition = td_arn
        s.deployments.insert(
            0,
            Deployment(id=f"ecs-svc/{next(self._ids)}", task_definition=td_arn, desired=s.desired, created_at=self.now),
        )
        self.log.append((self.ticks, "deployment", s.name))

    def tag_resource(self, **kw: Any) -> dict[str, Any]:
        self._request("TagResource", kw)
        s = self._byarn_of(kw["resourceArn"])
        keys = {t["key"] for t in kw["tags"]}
        s.tags = [t for t in s.tags if t["key"] not in keys] + list(kw["tags"])
        return {}

    def untag_resource(self, **kw: Any) -> dict[str, Any]:
        self._request("UntagResource", kw)
        s = self._byarn_of(kw["resourceArn"])
        s.tags = [t for t in s.tags if t["key"] not in kw["tagKeys"]]
        return {}

    def _byarn_of(self, arn: str) -> Service:
        for s in self.services.values():
            if s.arn == arn:
                return s
        raise client_error("TagResource", "InvalidParameterException", f"The specified resource {arn} is not found.")

    # --- tasks -------------------------------------------------------------------------------------------
    def list_tasks(self, **kw: Any) -> dict[str, Any]:
        self._request("ListTasks", kw)
        cluster = self._clusterarn_of(kw.get("cluster"))
        desired = kw.get("desiredStatus", "RUNNING")
        group = f"service:{kw['serviceName']}" if "serviceName" in kw else None
        on = kw.get("containerInstance")
        arns = [
            t.arn
            for t in self.tasks.values()
            if t.cluster == cluster
            and t.desired_status == desired
            and (group is None or t.group == group)
            and (on is None or t.container_instance == on)
        ]
        page, more = _page("ListTasks", kw, arns, ecs_rules.LIST_TASKS_PAGE)
        return {"taskArns": page, **more}

    def describe_tasks(self, **kw: Any) -> dict[str, Any]:
        self._request("DescribeTasks", kw)
        _at_most("DescribeTasks", "tasks", kw["tasks"], ecs_rules.DESCRIBE_TASKS_MAX)
        return {"tasks": [self.tasks[a].describe() for a in kw["tasks"] if a in self.tasks], "failures": []}

    # --- the service scheduler --------------------------------------------------------------------------
    def _changed(self, t: Task) -> None:
        for hook in self.on_task_change:
            hook(t)

    def _service_tasks(self, s: Service) -> list[Task]:
        return [t for t in self.tasks.values() if t.cluster == s.cluster and t.group == f"service:{s.name}"]

    def _stop(self, s: Service, t: Task, reason: str, code: str = "ServiceSchedulerInitiated") -> None:
        if not t.live:
            return
        t.desired_status = "STOPPED"
        t.stopped_reason, t.stop_code = reason, code
        if t.last_status in STARTING:
            t.last_status = "STOPPED"
            t.stopped_at = self.now
        self._changed(t)

    def _free_instances(self, s: Service) -> list[ContainerInstance]:
        busy = {t.container_instance for t in self.tasks.values() if t.last_status != "STOPPED"}
        return [
            ci
            for ci in self.instances.values()
            if ci.cluster == s.cluster
            and ci.capacity_provider == s.capacity_provider
            and ci.status == "ACTIVE"
            and not ci.terminated
            and ci.arn not in busy
        ]

    def tick(self) -> None:
        self.ticks += 1
        self.now = EPOCH + timedelta(seconds=15 * self.ticks)
        for t in list(self.tasks.values()):
            self._advance(t)
        for s in list(self.services.values()):
            self._schedule(s)
        for hook in self.on_tick:
            hook()

    def settle(self, *, max_ticks: int = 200) -> None:
        """Tick until every service's PRIMARY deployment is COMPLETED or FAILED (bounded)."""
        for _ in range(max_ticks):
            if all(
                s.primary.rollout_state != "IN_PROGRESS" and len(s.deployments) == 1 for s in self.services.values()
            ):
                if not any(t.last_status in (*STARTING, *STOPPING) for t in self.tasks.values()):
                    return
            self.tick()
        raise AssertionError(f"ECS model did not settle in {max_ticks} ticks")

    def _advance(self, t: Task) -> None:
        if t.last_status == "STOPPED":
            return
        if t.live:
            if t.last_status in STARTING:
                t.last_status = LIFECYCLE_UP[LIFECYCLE_UP.index(t.last_status) + 1]
                if t.last_status == "RUNNING":
                    t.started_at = self.now
                self._changed(t)
            elif t.last_status == "RUNNING" and t.health == "UNKNOWN":
                deployments = [d for s in self.services.values() for d in s.deployments if d.id == t.started_by]
                if t.task_definition in self.failing_task_definitions:
                    t.desired_status, t.last_status, t.stopped_at = "STOPPED", "STOPPED", self.now
                    t.stop_code, t.stopped_reason = "EssentialContainerExited", "Essential container in task exited"
                    for d in deployments:
                        d.failed_tasks += 1
                else:
                    t.health = "HEALTHY"  # the container health check passed
                    # resetOnHealthyTask: "When set to true, a task that reaches a healthy state resets
                    # the failure count to 0 ... The default is true." (API_DeploymentCircuitBreaker.html)
                    for d in deployments:
                        d.failed_tasks = 0
                self._changed(t)
            return
        t.last_status = step_down(t.last_status)
        if t.last_status == "STOPPED":
            t.stopped_at = self.now
        self._changed(t)

    def _in_grace(self, s: Service, t: Task) -> bool:
        """Whether the scheduler still ignores the task's health: "The period of time, in seconds, that
        the Amazon ECS service scheduler ignores unhealthy Elastic Load Balancing, VPC Lattice, and
        container health checks after a task has first started." (API_CreateService.html,
        healthCheckGracePeriodSeconds), counted from the task's startedAt."""
        return t.started_at is not None and (self.now - t.started_at).total_seconds() < s.grace_s

    def _schedule(self, s: Service) -> None:
        """One scheduler pass: the decisions are ecs_scheduler.decide's (the same the rehearsal's
        scheduler takes); this applies them to the task records."""
        draining = {ci.arn for ci in self.instances.values() if ci.status == "DRAINING"}
        primary = s.primary
        new = [
            t
            for t in self._service_tasks(s)
            if t.live and t.started_by == primary.id and t.container_instance not in draining
        ]
        # Desired count went down (a drain): stop the newest surplus tasks of the primary deployment.
        for t in sorted(new, key=lambda t: t.created_at, reverse=True)[: max(0, len(new) - s.desired)]:
            self._stop(s, t, "Scaling activity initiated by (deployment %s)" % primary.id)
        free = self._free_instances(s)
        decided = decide(
            ServiceView(s.desired, s.min_percent, s.max_percent, s.circuit_breaker, s.rollback),
            [DeploymentView(d.id, Rollout(d.rollout_state), d.failed_tasks) for d in s.deployments],
            [
                TaskView(
                    key=t,
                    deployment=t.started_by,
                    phase=t.phase,
                    health=t.health,
                    rank=rank,
                    leaving=t.container_instance in draining,
                    in_grace=self._in_grace(s, t),
                )
                for rank, t in enumerate(self._service_tasks(s))
                if t.last_status != "STOPPED"
            ],
            placeable=len(free),
        )
        for t in decided.stop_unhealthy:
            self._stop(s, t, "Task failed container health checks")
        primary.failed_tasks = decided.failures
        if decided.failed:
            primary.rollout_state, primary.reason = "FAILED", "ECS deployment circuit breaker: tasks failed to start."
            self._event(
                s,
                "deployment",
                f"(service {s.name}) (deployment {primary.id}) deployment failed: tasks failed to start.",
            )
            self.log.append((self.ticks, "failed", s.name))
            target = next((d for d in s.deployments if d.id == decided.roll_back_to), None)
            if target is not None:
                s.deployments.remove(target)
                s.deployments.insert(0, target)
                primary.status, target.status, target.rollout_state = "ACTIVE", "PRIMARY", "IN_PROGRESS"
                target.desired, s.task_definition = s.desired, target.task_definition
                self.log.append((self.ticks, "rollback", s.name))
            primary = s.primary
        for t in decided.stop_replaced:
            reason = (
                "Task stopped because the container instance is draining"
                if t.container_instance in draining
                else f"Scaling activity initiated by (deployment {primary.id})"
            )
            self._stop(s, t, reason)
        started = [self._place(s, primary, ci) for ci in free[: decided.start]]
        s.unplaced = decided.unplaced
        if decided.unplaced:
            self._event(
                s,
                "placement",
                f"service {s.name} was unable to place a task because no container instance met all "
                "of its requirements. The closest matching container-instance is already using a "
                "port required by your task.",
            )
        if started:
            s.last_event.pop("placement", None)
            self._event(
                s,
                "started",
                f"service {s.name} has started {len(started)} tasks: "
                + ", ".join(f"(task {t.id})" for t in started)
                + ".",
            )
        # Counts and completion.
        all_tasks = self._service_tasks(s)
        for d in s.deployments:
            mine = [t for t in all_tasks if t.started_by == d.id]
            d.running = sum(1 for t in mine if t.last_status == "RUNNING")
            d.pending = sum(1 for t in mine if t.last_status in STARTING)
        if decided.steady:
            if primary.rollout_state == "IN_PROGRESS":
                primary.rollout_state = "COMPLETED"
                self._event(s, "deployment", f"(service {s.name}) (deployment {primary.id}) deployment completed.")
                self.log.append((self.ticks, "completed", s.name))
                for hook in self.on_deployment_completed:
                    hook(s, primary)
            del s.deployments[1:]
            self._event(s, "steady", f"service {s.name} has reached a steady state.")
        else:
            s.last_event.pop("steady", None)

    def _place(self, s: Service, d: Deployment, ci: ContainerInstance) -> Task:
        t = Task(
            arn=arn_of("task", f"{s.cluster.rsplit('/', 1)[-1]}/{self._next_id()}"),
            cluster=s.cluster,
            task_definition=d.task_definition,
            group=f"service:{s.name}",
            started_by=d.id,
            container_instance=ci.arn,
            created_at=self.now,
        )
        self.tasks[t.arn] = t
        self._changed(t)
        return t


class _Paginator:
    """botocore's paginator for the List* calls: it sends each answer's nextToken back until an
    answer has none (botocore's ecs paginators-1.json: input_token and output_token nextToken)."""

    def __init__(self, method: Callable[..., dict[str, Any]], name: str) -> None:
        self._method, self._name = method, name

    def paginate(self, **kw: Any) -> Iterator[dict[str, Any]]:
        token: dict[str, Any] = {}
        while True:
            page = self._method(**kw, **token)
            yield page
            if "nextToken" not in page:
                return
            token = {"nextToken": page["nextToken"]}
