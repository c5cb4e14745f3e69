"""What ECS, Auto Scaling, Cloud Map and CloudFormation do that moto 5.2.5 does not, modelled on the
boto3 clients the CLI uses (botocore event hooks), for the teardown and shrink tests.

moto scales a service to 0 by setting its runningCount to 0 at once and leaves its tasks RUNNING
(moto/ecs/models.py update_service); it deletes a stack whatever imports its exports, whatever
protects its instances and whatever its cluster or Cloud Map service still holds
(moto/cloudformation/models.py delete_stack). The real services, and their sources:
- ECS stops a service's surplus tasks: desiredStatus STOPPED at once ("The task desired status ...
  STOPPED", ECS ListTasks), then the stopping lifecycle the API model walks (ecs_api_records.step_down:
  DEACTIVATING, STOPPING, DEPROVISIONING, STOPPED), SIGTERM in STOPPING, where the node drains until
  it exits (StopTask: "a default 30-second timeout, after which the SIGKILL value is sent").
  Modelled: one lifecycle state per ListTasks call, `drain_polls` calls in STOPPING, and
  DescribeServices counts only tasks still RUNNING with desiredStatus RUNNING.
- ECS deregisters a stopped task from the service's Cloud Map registry (docs/discovery.md;
  https://docs.aws.amazon.com/AmazonECS/latest/developerguide/service-discovery.html).
- CloudFormation refuses to delete a stack whose export another stack imports ("you can't delete
  the stack that is exporting the output value", Fn::ImportValue user guide).
- Deleting an Auto Scaling group whose instances are protected from scale-in hangs the stack
  deletion (aws/aws-cdk#18179); ECS refuses to delete a cluster with registered container
  instances ("You must deregister all container instances from this cluster before you may
  delete it.", ECS DeleteCluster); Cloud Map refuses to delete a service with registered instances
  (aws/aws-cdk#14732 shows the same class of teardown failure).
And the invariant the commands promise: no EC2 instance is terminated while a task that is not
STOPPED runs on it. Every breach raises AssertionError inside the call that caused it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from ecs_api_records import step_down
from moto.autoscaling.models import autoscaling_backends
from moto.cloudformation.models import cloudformation_backends
from moto.core import DEFAULT_ACCOUNT_ID
from moto.ec2.models import ec2_backends
from moto.ecs.models import ecs_backends
from moto.servicediscovery.models import servicediscovery_backends

REGION = "us-east-1"


def _imports(template) -> set[str]:
    found: set[str] = set()

    def visit(node) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("Fn::ImportValue"), str):
                found.add(node["Fn::ImportValue"])
            for v in node.values():
                visit(v)
        elif isinstance(node, list):
            for v in node:
                visit(v)

    visit(json.loads(template) if isinstance(template, str) else template)
    return found


@dataclass
class EcsRules:
    aws: object
    drain_polls: int = 3
    cloudmap_service_of_stack: dict[str, str] = field(default_factory=dict)  # stack name -> Cloud Map service id
    cluster_of_stack: dict[str, str] = field(default_factory=dict)  # stack name -> cluster name
    deleted: list[str] = field(default_factory=list)  # stack names, in deletion order
    terminated: list[str] = field(default_factory=list)  # instance ids, in termination order
    _draining: dict[str, int] = field(default_factory=dict)  # task arn -> ListTasks calls left in STOPPING

    def __post_init__(self) -> None:
        ecs = self.aws.ecs.meta.events
        # before-parameter-build handlers see the API parameters (before-call ones the HTTP body).
        ecs.register("before-parameter-build.ecs.UpdateService", self._scaled)
        ecs.register("before-call.ecs.ListTasks", self._advance)
        ecs.register("after-call.ecs.DescribeServices", self._running_count)
        for client in (self.aws.autoscaling, self.aws.ec2, self.aws.ecs, self.aws.cloudformation):
            client.meta.events.register("after-call", self._no_task_on_a_terminated_instance)
        self.aws.cloudformation.meta.events.register(
            "before-parameter-build.cloudformation.DeleteStack", self._may_delete
        )

    # --- backends ---------------------------------------------------------------------------------
    @property
    def ecs(self):
        return ecs_backends[DEFAULT_ACCOUNT_ID][REGION]

    def tasks(self):
        return [t for tasks in self.ecs.tasks.values() for t in tasks.values()]

    def live_tasks_on(self, instance_id: str) -> list:
        arns = {
            ci.container_instance_arn
            for cis in self.ecs.container_instances.values()
            for ci in cis.values()
            if ci.ec2_instance_id == instance_id
        }
        return [t for t in self.tasks() if t.container_instance_arn in arns and t.last_status != "STOPPED"]

    # --- ECS: scaling a service down drains its tasks ----------------------------------------------
    def _scaled(self, params, **_) -> None:
        if params.get("desiredCount") != 0:
            return
        group = f"service:{params['service'].rsplit('/', 1)[-1]}"
        for task in self.tasks():
            if task.group == group and task.last_status != "STOPPED" and task.task_arn not in self._draining:
                task.desired_status = "STOPPED"
                self._draining[task.task_arn] = self.drain_polls

    def _advance(self, **_) -> None:
        for task in self.tasks():
            left = self._draining.get(task.task_arn)
            if left is None or task.last_status == "STOPPED":
                continue
            if task.last_status == "STOPPING" and left > 0:
                self._draining[task.task_arn] = left - 1  # SIGTERM sent: the node drains
            elif step_down(task.last_status) == "STOPPED":
                self.ecs.stop_task(task.cluster_arn, task.task_arn, "Scaling activity initiated by deployment")
                self._deregister_from_cloudmap(task.task_arn.rsplit("/", 1)[-1])
            else:
                task.last_status = step_down(task.last_status)

    def _deregister_from_cloudmap(self, instance_id: str) -> None:
        backend = servicediscovery_backends[DEFAULT_ACCOUNT_ID][REGION]
        for service in list(backend.services.values()):
            if any(i.instance_id == instance_id for i in service.instances):
                backend.deregister_instance(service.id, instance_id)

    def _running_count(self, parsed, **_) -> None:
        running = {}
        for task in self.tasks():
            if task.last_status == "RUNNING" and task.desired_status == "RUNNING":
                running[task.group] = running.get(task.group, 0) + 1
        for service in parsed.get("services", []):
            service["runningCount"] = running.get(f"service:{service['serviceName']}", 0)

    # --- the invariant ------------------------------------------------------------------------------
    def _no_task_on_a_terminated_instance(self, **_) -> None:
        for reservation in ec2_backends[DEFAULT_ACCOUNT_ID][REGION].reservations.values():
            for instance in reservation.instances:
                if instance.state in ("shutting-down", "terminated") and instance.id not in self.terminated:
                    live = self.live_tasks_on(instance.id)
                    assert not live, f"instance {instance.id} terminated while {[t.task_arn for t in live]} ran on it"
                    self.terminated.append(instance.id)

    # --- CloudFormation deletion rules --------------------------------------------------------------
    def _may_delete(self, params, **_) -> None:
        cfn = cloudformation_backends[DEFAULT_ACCOUNT_ID][REGION]
        stack = cfn.get_stack(params["StackName"])
        exports = {e.name for e in stack.exports}
        for other in cfn.stacks.values():
            if other.stack_id != stack.stack_id and other.status != "DELETE_COMPLETE":
                in_use = exports & _imports(other.template)
                assert not in_use, f"CloudFormation refuses to delete {stack.name}: {in_use} in use by {other.name}"
        groups = autoscaling_backends[DEFAULT_ACCOUNT_ID][REGION].autoscaling_groups.values()
        for group in groups:
            tags = {t["Key"]: t["Value"] for t in group.tags}
            if tags.get("aws:cloudformation:stack-name") != stack.name:
                continue
            protected = [s.instance.id for s in group.instance_states if s.protected_from_scale_in]
            assert not protected, (
                f"deleting {stack.name} hangs: {protected} protected from scale-in (aws/aws-cdk#18179)"
            )
        cluster = self.cluster_of_stack.get(stack.name)
        if cluster:
            registered = [
                ci.ec2_instance_id
                for ci in self.ecs.container_instances.get(cluster, {}).values()
                if ci.status != "INACTIVE"
            ]
            assert not registered, f"ECS refuses to delete cluster {cluster}: container instances {registered}"
        service_id = self.cloudmap_service_of_stack.get(stack.name)
        if service_id:
            backend = servicediscovery_backends[DEFAULT_ACCOUNT_ID][REGION]
            listed = backend.list_instances(service_id)
            assert not listed, f"Cloud Map refuses to delete service {service_id}: {len(listed)} instance(s) registered"
        self.deleted.append(stack.name)
