"""A flotilla deployment on the ECS model (tests/ecs_api.py): units whose ECS services, tasks and
deployments move as ECS moves them, on Auto Scaling groups and EC2 instances in moto, with a real
HTTP server on 127.0.0.1 per RUNNING task answering /health/ready, and Cloud Map registrations made
and removed as ECS makes and removes them. Also CloudFormation's part of a `cdk deploy` of a cell
(register the new task definition, update the services one after another, then delete the replaced
task definitions unless the template retains them) and the capacity side of Auto Scaling
(LaunchInstances, scaling activities, an Availability Zone that has no capacity left).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import botocore.session
from botocore.exceptions import ClientError, ParamValidationError
from botocore.validate import ParamValidator
from ecs_api import EcsModel
from ecs_api_records import Task
from ops_fakes import HealthServer, ready_body

import contract
from ops.aws import Aws
from stacks.config import NodeConfig

REGION = "us-east-1"
_AUTOSCALING_MODEL = botocore.session.get_session().get_service_model("autoscaling")


@dataclass
class WorldUnit:
    cell: int
    index: int
    nodes: int
    cluster: str
    service: str
    asg: str
    family: str
    rollout: str

    @property
    def cell_id(self) -> str:
        return f"cell{self.cell}"

    @property
    def unit_id(self) -> str:
        return f"cell{self.cell}-unit{self.index}"


@dataclass
class _Member:
    server: HealthServer
    registered: bool = True


@dataclass
class World:
    aws: Aws  # ecs = the model, autoscaling = CapacityAutoScaling over moto, the rest moto
    model: EcsModel
    cloudmap_service: str
    deployment: str = "flotilla"
    units: list[WorldUnit] = field(default_factory=list)
    members: dict[str, _Member] = field(default_factory=dict)  # task arn -> its HTTP server
    booting: dict[str, tuple[int, str, str]] = field(default_factory=dict)  # instance -> (ready tick, cluster, asg)
    boot_ticks: int = 3  # an instance registers with ECS this many scheduler ticks after launch
    scale_in_ticks: int = 20  # an instance idle this long is scaled in (down to the ASG's min)
    idle: dict[str, int] = field(default_factory=dict)  # instance -> tick it became idle
    subnet: str = ""
    launch_template: str = ""
    exit_codes: dict[str, int] = field(default_factory=dict)  # task definition -> its node's exit status

    # --- building units ---------------------------------------------------------------------------
    def cluster(self, cell: int) -> str:
        name = f"{self.deployment}-cell{cell}"
        for arn, c in self.model.clusters.items():
            if c["name"] == name:
                return arn
        return self.model.create_cluster(
            clusterName=name,
            tags=[
                {"key": "flotilla:deployment", "value": self.deployment},
                {"key": "flotilla:cell", "value": f"cell{cell}"},
            ],
        )["cluster"]["clusterArn"]

    def add_unit(
        self,
        *,
        cell: int,
        index: int,
        nodes: int = 2,
        revision: str = "1",
        rollout: str = "surge",
        exits: int | None = None,
    ) -> WorldUnit:
        """A unit as the Cell stack builds it (stacks/unit.py): an ASG of `nodes` (max 2x under
        surge), a capacity provider, a task family, an ECS service with the rollout's percentages;
        then ECS starts its tasks and they form. `exits`: its nodes can never serve; each exits with
        this status right after its task is RUNNING, as ECS then reports the container."""
        aws = self.aws
        unit_id = f"cell{cell}-unit{index}"
        cluster = self.cluster(cell)
        asg = f"{self.deployment}-Cell-{cell}-Unit{index}Asg"
        aws.autoscaling.create_auto_scaling_group(
            AutoScalingGroupName=asg,
            MinSize=nodes,
            MaxSize=2 * nodes if rollout == "surge" else nodes,
            DesiredCapacity=nodes,
            LaunchTemplate={"LaunchTemplateId": self.launch_template, "Version": "$Latest"},
            VPCZoneIdentifier=self.subnet,
            NewInstancesProtectedFromScaleIn=True,
            Tags=[
                {
                    "ResourceId": asg,
                    "ResourceType": "auto-scaling-group",
                    "Key": k,
                    "Value": v,
                    "PropagateAtLaunch": True,
                }
                for k, v in (
                    ("flotilla:deployment", self.deployment),
                    ("flotilla:cell", f"cell{cell}"),
                    ("flotilla:unit", unit_id),
                )
            ],
        )
        for iid in self.asg_instances(asg):
            self.model.add_container_instance(cluster, iid, capacity_provider=asg)
        family = f"{self.deployment}-{unit_id}"
        td = self.register(family=family, unit_id=unit_id, cell=cell, nodes=nodes, revision=revision)
        if exits is not None:
            self.model.failing_task_definitions.add(td)
            self.exit_codes[td] = exits
        percent = (100, 200) if rollout == "surge" else (0, 100)
        service = f"{self.deployment}-Cell-{cell}-Unit{index}Service-{index:04d}"
        self.model.create_service(
            cluster=cluster,
            serviceName=service,
            taskDefinition=td,
            desiredCount=nodes,
            capacityProviderStrategy=[{"capacityProvider": asg, "weight": 1}],
            deploymentConfiguration={
                "minimumHealthyPercent": percent[0],
                "maximumPercent": percent[1],
                "deploymentCircuitBreaker": {"enable": True, "rollback": True},
            },
            placementConstraints=[{"type": "distinctInstance"}],
            healthCheckGracePeriodSeconds=NodeConfig().health_check_grace_s,
            tags=[{"key": "flotilla:unit", "value": unit_id}],
        )
        unit = WorldUnit(
            cell=cell,
            index=index,
            nodes=nodes,
            cluster=cluster,
            service=service,
            asg=asg,
            family=family,
            rollout=rollout,
        )
        self.units.append(unit)
        self.model.settle()
        return unit

    def register(self, *, family: str, unit_id: str, cell: int, nodes: int, revision: str) -> str:
        env = {
            contract.ENV_UNIT_ID: unit_id,
            contract.ENV_CELL_ID: f"cell{cell}",
            contract.ENV_REVISION: revision,
            contract.ENV_NODES_PER_UNIT: str(nodes),
            contract.ENV_ROLE: "node",
        }
        return self.model.register_task_definition(
            family=family,
            networkMode="host",
            taskRoleArn="arn:aws:iam::123456789012:role/flotilla-Cell-TaskRole",
            executionRoleArn="arn:aws:iam::123456789012:role/flotilla-Cell-ExecutionRole",
            containerDefinitions=[
                {
                    "name": "node",
                    "image": "flotilla:latest",
                    "memoryReservation": 65536,
                    "environment": [{"name": k, "value": v} for k, v in env.items()],
                    "portMappings": [{"containerPort": contract.NODE_API_PORT, "protocol": "tcp"}],
                    # stacks/unit.py: the cell's log group, one stream per task under the unit's prefix
                    "logConfiguration": {
                        "logDriver": "awslogs",
                        "options": {
                            "awslogs-group": self.log_group(cell),
                            "awslogs-stream-prefix": unit_id,
                            "awslogs-region": REGION,
                        },
                    },
                }
            ],
            tags=[{"key": "flotilla:unit", "value": unit_id}],
        )["taskDefinition"]["taskDefinitionArn"]

    def log_group(self, cell: int) -> str:
        """The Cell stack's log group (CloudFormation names it <stack>-<logical id>-<suffix>)."""
        return f"{self.deployment}-Cell-{cell}-LogsD6E0F1A2-a1b2c3d4e5f6"

    def unit(self, unit_id: str) -> WorldUnit:
        return next(u for u in self.units if u.unit_id == unit_id)

    def service(self, unit: WorldUnit) -> dict[str, Any]:
        s = self.model.services[(unit.cluster, unit.service)]
        return self.model._describe_service(s, tags=True)

    def revision_of(self, unit: WorldUnit) -> str:
        td = self.model.task_defs[self.service(unit)["taskDefinition"]]
        return td.env()[contract.ENV_REVISION]

    def asg_instances(self, asg: str) -> list[str]:
        (group,) = self.aws.autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[asg])["AutoScalingGroups"]
        return sorted(i["InstanceId"] for i in group["Instances"])

    def instance_of(self, task: Task) -> str:
        return self.model.instances[task.container_instance].ec2_instance_id

    def running_instances(self, unit: WorldUnit) -> list[str]:
        return sorted(
            self.instance_of(t)
            for t in self.model.tasks.values()
            if t.group == f"service:{unit.service}" and t.last_status == "RUNNING" and t.live
        )

    # --- CloudFormation: a `cdk deploy` of new revisions ---------------------------------------------
    def cdk_deploy(self, units: list[WorldUnit], *, revision: str, update_replace_policy: str) -> list[str]:
        """What CloudFormation does for a Cell stack whose task definitions changed: a replacement
        task definition per unit, each service updated only after the one it depends on reached a
        steady state (stacks/cell.py orders them), and in the clean-up phase the replaced task
        definitions deleted, which for ECS means deregistered (aws/aws-cdk#24372), unless
        UpdateReplacePolicy is Retain ("CloudFormation keeps the resource without deleting the
        resource or its contents when the resource is replaced" — CloudFormation
        aws-attribute-updatereplacepolicy.html). Returns the replaced task definition ARNs."""
        replaced = []
        for u in units:
            old = self.service(u)["taskDefinition"]
            new = self.register(family=u.family, unit_id=u.unit_id, cell=u.cell, nodes=u.nodes, revision=revision)
            self.model.update_service(cluster=u.cluster, service=u.service, taskDefinition=new)
            self.model.settle()
            replaced.append(old)
        if update_replace_policy == "Delete":
            for arn in replaced:
                self.model.deregister_task_definition(taskDefinition=arn)
        return replaced

    # --- the nodes: one HTTP server per RUNNING task, formation readiness, Cloud Map --------------------
    def task_changed(self, task: Task) -> None:
        if task.last_status == "STOPPED" and task.task_definition in self.exit_codes and not task.containers:
            task.containers = [
                {"name": "node", "lastStatus": "STOPPED", "exitCode": self.exit_codes[task.task_definition]}
            ]
        sd = self.aws.servicediscovery
        member = self.members.get(task.arn)
        if task.live and task.last_status == "RUNNING" and member is None:
            td = self.model.task_defs[task.task_definition]
            env = td.env()
            server = HealthServer(
                ready_body(
                    unit=env[contract.ENV_UNIT_ID],
                    rank=0,
                    world_size=int(env[contract.ENV_NODES_PER_UNIT]),
                    revision=env[contract.ENV_REVISION],
                    ready=False,
                    state="forming",
                    cell=env[contract.ENV_CELL_ID],
                )
            )
            self.members[task.arn] = _Member(server=server)
            service = task.group.split(":", 1)[1]
            sd.register_instance(
                ServiceId=self.cloudmap_service,
                InstanceId=task.id,
                Attributes={
                    contract.CLOUDMAP_ATTR_IPV4: "127.0.0.1",
                    contract.CLOUDMAP_ATTR_PORT: str(server.port),
                    contract.CLOUDMAP_ATTR_ECS_SERVICE: service,
                },
            )
        elif member is not None and not (task.live and task.last_status == "RUNNING"):
            if member.registered:
                # ECS deregisters a stopping task from Cloud Map before it stops (DEACTIVATING).
                sd.deregister_instance(ServiceId=self.cloudmap_service, InstanceId=task.id)
                member.registered = False
            member.server.set(ready=False, state="draining")
            member.server.status = 503
            if task.last_status == "STOPPED":
                member.server.close()
                del self.members[task.arn]
        self._form(task.group)

    def _form(self, group: str) -> None:
        """Readiness as rendezvous gives it: RUNNING members of one task definition and one
        deployment form a unit once there are nodes_per_unit of them; ranks by instance id."""
        running = [
            t
            for t in self.model.tasks.values()
            if t.group == group and t.live and t.last_status == "RUNNING" and t.arn in self.members
        ]
        formations: dict[tuple[str, str], list[Task]] = {}
        for t in running:
            formations.setdefault((t.task_definition, t.started_by), []).append(t)
        for (td_arn, _), members in formations.items():
            want = int(self.model.task_defs[td_arn].env()[contract.ENV_NODES_PER_UNIT])
            members.sort(key=self.instance_of)
            formed = len(members) == want
            for rank, t in enumerate(members):
                server = self.members[t.arn].server
                server.set(
                    rank=rank,
                    role="leader" if rank == 0 else "follower",
                    ready=formed,
                    state="ready" if formed else "forming",
                )
                server.status = 200 if formed else 503

    # --- capacity: managed scaling and instance boot ------------------------------------------------------
    def on_tick(self) -> None:
        now = self.model.ticks
        for iid, (ready_at, cluster, asg) in list(self.booting.items()):
            if now >= ready_at:
                del self.booting[iid]
                self.model.add_container_instance(cluster, iid, capacity_provider=asg)
        for unit in self.units:
            self._managed_scaling(unit)

    def _managed_scaling(self, unit: WorldUnit) -> None:
        """The capacity provider's managed scaling, reduced to what flotilla meets: tasks ECS cannot
        place grow the ASG (up to its max, if EC2 has the capacity); instances left without a task
        for a while (scale-in waits for a run of low datapoints) are removed down to the min, as
        managed termination protection only protects instances that run tasks."""
        s = self.model.services.get((unit.cluster, unit.service))
        if s is None:
            return
        scaling: CapacityAutoScaling = self.aws.autoscaling  # type: ignore[assignment]

        def group() -> dict[str, Any]:
            # Read right before each decision, and only then: this runs every tick for every unit, and
            # moto serializes the whole group per call (the most of an ops test's time when read each tick).
            (g,) = scaling._moto.describe_auto_scaling_groups(AutoScalingGroupNames=[unit.asg])["AutoScalingGroups"]
            return g

        if s.unplaced and not any(a == unit.asg for _, _, a in self.booting.values()):
            now = group()
            want = min(now["MaxSize"], now["DesiredCapacity"] + s.unplaced) - now["DesiredCapacity"]
            if want > 0:
                scaling.scale_out(unit.asg, want)
            return
        if len(s.deployments) != 1 or s.unplaced:
            return
        busy = {
            self.model.instances[t.container_instance].ec2_instance_id
            for t in self.model.tasks.values()
            if t.last_status != "STOPPED"
        }
        for ci in list(self.model.instances.values()):
            if ci.capacity_provider != unit.asg or ci.terminated or ci.ec2_instance_id in busy:
                self.idle.pop(ci.ec2_instance_id, None)
                continue
            since = self.idle.setdefault(ci.ec2_instance_id, self.model.ticks)
            if self.model.ticks - since < self.scale_in_ticks:
                continue
            now = group()
            if now["DesiredCapacity"] > now["MinSize"]:
                scaling._moto.terminate_instance_in_auto_scaling_group(
                    InstanceId=ci.ec2_instance_id, ShouldDecrementDesiredCapacity=True
                )
                self.model.instance_terminated(ci.ec2_instance_id)
                self.idle.pop(ci.ec2_instance_id, None)

    def close(self) -> None:
        for m in self.members.values():
            m.server.close()


class CapacityAutoScaling:
    """moto's Auto Scaling plus what moto lacks: LaunchInstances (synchronous launch into a group,
    with InsufficientInstanceCapacity when the Availability Zone has none left), the scaling
    activity history, and telling ECS when an instance it ran on is terminated.

    LaunchInstances "immediately returns the instance IDs or error information" and returns
    ErrorCode "(e.g., InsufficientInstanceCapacity)" per failed launch — Auto Scaling user guide
    launch-instances-synchronously.html, API_LaunchInstancesError.html. Assumed here, not found in
    AWS's text: a successful launch adds to the group's desired capacity and never exceeds MaxSize.
    """

    def __init__(self, moto_client: Any, world: World) -> None:
        self._moto, self._world = moto_client, world
        self._validator = ParamValidator()
        self.capacity: dict[str, int] = {}  # AZ -> instances EC2 can still launch there (absent: plenty)
        self.activities: list[dict[str, Any]] = []
        self._ids = itertools.count(1)
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._moto, name)

        def call(**kw: Any) -> Any:
            self.calls.append((name, kw))
            return method(**kw)

        return call

    def _validate(self, op: str, params: dict[str, Any]) -> None:
        report = self._validator.validate(params, _AUTOSCALING_MODEL.operation_model(op).input_shape)
        if report.has_errors():
            raise ParamValidationError(report=report.generate_report())
        self.calls.append((op, params))

    def _group(self, name: str) -> dict[str, Any]:
        groups = self._moto.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"]
        if not groups:
            raise ClientError(
                {"Error": {"Code": "ValidationError", "Message": f"Group {name} not found"}}, "LaunchInstances"
            )
        return groups[0]

    def _activity(self, group: str, status: str, description: str, message: str = "") -> None:
        act = {
            "ActivityId": f"act-{next(self._ids):08d}",
            "AutoScalingGroupName": group,
            "Description": description,
            "Cause": "At 2026-12-01T00:00:00Z an instance was started in response to a LaunchInstances request.",
            "StartTime": self._world.model.now,
            "StatusCode": status,
            "Progress": 100,
        }
        if message:
            act["StatusMessage"] = message
        self.activities.insert(0, act)

    def launch_instances(self, **kw: Any) -> dict[str, Any]:
        self._validate("LaunchInstances", kw)
        name, n = kw["AutoScalingGroupName"], kw["RequestedCapacity"]
        group = self._group(name)
        az = (kw.get("AvailabilityZones") or group["AvailabilityZones"])[0]
        itype = "trn1.32xlarge"
        if self.capacity.get(az, 1 << 30) < n:
            # EC2's wording for a launch without capacity (quoted in hashicorp/terraform#8857).
            message = (
                f"We currently do not have sufficient {itype} capacity in the Availability Zone you requested "
                f"({az}). Our system will be working on provisioning additional capacity."
            )
            self._activity(name, "Failed", "Launching a new EC2 instance.  Status Reason: " + message, message)
            return {
                "AutoScalingGroupName": name,
                "ClientToken": kw["ClientToken"],
                "Instances": [],
                "Errors": [
                    {
                        "InstanceType": itype,
                        "MarketType": "on-demand",
                        "AvailabilityZone": az,
                        "ErrorCode": "InsufficientInstanceCapacity",
                        "ErrorMessage": message,
                    }
                ],
            }
        if group["DesiredCapacity"] + n > group["MaxSize"]:
            raise ClientError(
                {
                    "Error": {
                        "Code": "ValidationError",
                        "Message": f"New desired capacity would exceed the group's max size {group['MaxSize']}",
                    }
                },
                "LaunchInstances",
            )
        new = self._launch(name, n, az)
        return {
            "AutoScalingGroupName": name,
            "ClientToken": kw["ClientToken"],
            "Instances": [
                {
                    "InstanceType": itype,
                    "AvailabilityZone": az,
                    "SubnetId": self._world.subnet,
                    "MarketType": "on-demand",
                    "InstanceIds": new,
                }
            ],
            "Errors": [],
        }

    def _launch(self, name: str, n: int, az: str) -> list[str]:
        group = self._group(name)
        before = {i["InstanceId"] for i in group["Instances"]}
        self._moto.set_desired_capacity(AutoScalingGroupName=name, DesiredCapacity=group["DesiredCapacity"] + n)
        new = sorted(set(self._world.asg_instances(name)) - before)
        if az in self.capacity:
            self.capacity[az] -= n
        cluster = next(u.cluster for u in self._world.units if u.asg == name)
        for iid in new:
            self._world.booting[iid] = (self._world.model.ticks + self._world.boot_ticks, cluster, name)
            self._activity(name, "Successful", f"Launching a new EC2 instance: {iid}")
        return new

    def scale_out(self, name: str, n: int) -> None:
        """An asynchronous scale-out (managed scaling raised the desired capacity): launched, or a
        Failed activity when the AZ has no capacity (the group keeps trying)."""
        az = self._group(name)["AvailabilityZones"][0]
        if self.capacity.get(az, 1 << 30) < n:
            message = (
                "We currently do not have sufficient trn1.32xlarge capacity in the Availability Zone you "
                f"requested ({az}). Our system will be working on provisioning additional capacity. "
                "Launching EC2 instance failed."
            )
            if not self.activities or self.activities[0].get("StatusMessage") != message:
                self._activity(name, "Failed", "Launching a new EC2 instance.  Status Reason: " + message, message)
            return
        self._launch(name, n, az)

    def terminate_instance_in_auto_scaling_group(self, **kw: Any) -> dict[str, Any]:
        self._validate("TerminateInstanceInAutoScalingGroup", kw)
        out = self._moto.terminate_instance_in_auto_scaling_group(**kw)
        self._world.model.instance_terminated(kw["InstanceId"])
        self._activity(
            out["Activity"]["AutoScalingGroupName"], "Successful", f"Terminating EC2 instance: {kw['InstanceId']}"
        )
        return out

    def describe_scaling_activities(self, **kw: Any) -> dict[str, Any]:
        self._validate("DescribeScalingActivities", kw)
        acts = [
            a
            for a in self.activities
            if a["AutoScalingGroupName"] == kw.get("AutoScalingGroupName", a["AutoScalingGroupName"])
        ]
        return {"Activities": acts[: kw.get("MaxRecords", 100)]}


def build_world(aws: Aws, *, deployment: str = "flotilla") -> World:
    """Replace the moto ECS and Auto Scaling clients of `aws` with the model and the capacity-aware
    wrapper (in place: the CLI's make_clients returns this same object)."""
    ec2 = aws.ec2
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.0.0/20", AvailabilityZone=f"{REGION}a")["Subnet"]["SubnetId"]
    lt = ec2.create_launch_template(
        LaunchTemplateName="flotilla-node",
        LaunchTemplateData={"ImageId": "ami-12c6146b", "InstanceType": "trn1.32xlarge"},
    )["LaunchTemplate"]["LaunchTemplateId"]
    sd = aws.servicediscovery
    sd.create_http_namespace(Name=f"{deployment}.internal")
    ns = next(n for n in sd.list_namespaces()["Namespaces"] if n["Name"] == f"{deployment}.internal")
    cm = sd.create_service(Name="units", NamespaceId=ns["Id"])["Service"]["Id"]
    model = EcsModel()
    world = World(aws=aws, model=model, cloudmap_service=cm, deployment=deployment, subnet=subnet, launch_template=lt)
    world.aws.autoscaling = CapacityAutoScaling(aws.autoscaling, world)
    world.aws.ecs = model
    model.on_task_change.append(world.task_changed)
    model.on_tick.append(world.on_tick)
    return world
