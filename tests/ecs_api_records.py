"""The records the ECS API model (tests/ecs_api.py) keeps for an in-memory account: task definitions,
container instances, tasks, deployments and services, each answering its Describe* shape, and the
task lifecycle they walk (task-lifecycle-explanation.html)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from ops.rehearsal.ecs_scheduler import Phase

ACCOUNT, REGION = "123456789012", "us-east-1"
STARTING = ("PROVISIONING", "PENDING", "ACTIVATING")
STOPPING = ("DEACTIVATING", "STOPPING", "DEPROVISIONING")
LIFECYCLE_UP = (*STARTING, "RUNNING")
LIFECYCLE_DOWN = ("RUNNING", *STOPPING, "STOPPED")
EPOCH = datetime(2026, 12, 1, tzinfo=timezone.utc)


def step_down(last_status: str) -> str:
    """The lastStatus a task ECS is stopping moves to next: RUNNING, DEACTIVATING, STOPPING,
    DEPROVISIONING, STOPPED (task-lifecycle-explanation.html), one state per step."""
    return LIFECYCLE_DOWN[LIFECYCLE_DOWN.index(last_status) + 1]


def arn_of(kind: str, name: str) -> str:
    return f"arn:aws:ecs:{REGION}:{ACCOUNT}:{kind}/{name}"


@dataclass
class TaskDef:
    family: str
    revision: int
    request: dict[str, Any]  # the RegisterTaskDefinition parameters, tags excluded
    tags: list[dict[str, str]]
    status: str = "ACTIVE"

    @property
    def arn(self) -> str:
        return arn_of("task-definition", f"{self.family}:{self.revision}")

    def describe(self) -> dict[str, Any]:
        return {
            **self.request,
            "taskDefinitionArn": self.arn,
            "revision": self.revision,
            "status": self.status,
            "compatibilities": ["EXTERNAL", "EC2"],
            "requiresAttributes": [{"name": "com.amazonaws.ecs.capability.docker-remote-api.1.18"}],
            "registeredAt": EPOCH,
            "registeredBy": f"arn:aws:iam::{ACCOUNT}:role/deployer",
        }

    def env(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for c in self.request.get("containerDefinitions", []):
            out.update({e["name"]: e["value"] for e in c.get("environment", [])})
        return out


@dataclass
class ContainerInstance:
    arn: str
    cluster: str
    ec2_instance_id: str
    capacity_provider: str  # the unit's Auto Scaling group, through its capacity provider
    status: str = "ACTIVE"
    terminated: bool = False


@dataclass
class Task:
    arn: str
    cluster: str
    task_definition: str
    group: str
    started_by: str
    container_instance: str
    last_status: str = "PROVISIONING"
    desired_status: str = "RUNNING"
    health: str = "UNKNOWN"
    stopped_reason: str | None = None
    stop_code: str | None = None
    created_at: datetime = EPOCH
    started_at: datetime | None = None  # when it went from PENDING to RUNNING (DescribeTasks startedAt)
    stopped_at: datetime | None = None
    containers: list[dict[str, Any]] = field(default_factory=list)  # DescribeTasks containers[] (name, exitCode)

    @property
    def id(self) -> str:
        return self.arn.rsplit("/", 1)[-1]

    @property
    def live(self) -> bool:
        return self.desired_status == "RUNNING"

    @property
    def phase(self) -> Phase:
        if not self.live:
            return Phase.STOPPING
        return Phase.STARTING if self.last_status in STARTING else Phase.RUNNING

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "taskArn": self.arn,
            "clusterArn": self.cluster,
            "taskDefinitionArn": self.task_definition,
            "containerInstanceArn": self.container_instance,
            "lastStatus": self.last_status,
            "desiredStatus": self.desired_status,
            "healthStatus": self.health,
            "group": self.group,
            "startedBy": self.started_by,
            "launchType": "EC2",
            "createdAt": self.created_at,
        }
        if self.stopped_reason:
            out["stoppedReason"] = self.stopped_reason
        if self.stop_code:
            out["stopCode"] = self.stop_code
        if self.started_at:
            out["startedAt"] = self.started_at
        if self.stopped_at:
            out["stoppedAt"] = self.stopped_at
        if self.containers:
            out["containers"] = self.containers
        return out


@dataclass
class Deployment:
    id: str
    task_definition: str
    desired: int
    status: str = "PRIMARY"
    rollout_state: str = "IN_PROGRESS"
    reason: str = ""
    failed_tasks: int = 0
    running: int = 0
    pending: int = 0
    created_at: datetime = EPOCH

    def describe(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "status": self.status,
            "taskDefinition": self.task_definition,
            "desiredCount": self.desired,
            "runningCount": self.running,
            "pendingCount": self.pending,
            "failedTasks": self.failed_tasks,
            "rolloutState": self.rollout_state,
            "rolloutStateReason": self.reason or f"ECS deployment {self.id} {self.rollout_state.lower()}.",
            "launchType": "EC2",
            "createdAt": self.created_at,
            "updatedAt": self.created_at,
        }


@dataclass
class Service:
    name: str
    cluster: str
    desired: int
    task_definition: str
    min_percent: int
    max_percent: int
    tags: list[dict[str, str]]
    capacity_provider: str = ""
    circuit_breaker: bool = True
    rollback: bool = True
    grace_s: int = 0  # healthCheckGracePeriodSeconds
    deployments: list[Deployment] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    last_event: dict[str, str] = field(default_factory=dict)  # event kind -> message, to omit repeats
    unplaced: int = 0  # tasks the scheduler could not place on its last pass (capacity wanted)

    @property
    def arn(self) -> str:
        return arn_of("service", f"{self.cluster.rsplit('/', 1)[-1]}/{self.name}")

    @property
    def primary(self) -> Deployment:
        return self.deployments[0]
