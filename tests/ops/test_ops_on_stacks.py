"""The CLI against the real stacks: the default deployment synthesized by the CDK app and created in
moto's CloudFormation (the stack tests' harness), then members started the way ECS would start them.
This is what keeps `flotilla`'s discovery (cluster, service, task definition, Auto Scaling group)
aligned with what stacks/ actually deploys."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from moto.moto_api import state_manager
from ops_fakes import HealthServer, ready_body

import ops.aws
from ops.aws import Aws

STACK_TESTS = Path(__file__).resolve().parents[1] / "stacks"


@pytest.fixture(scope="module")
def default_synth(tmp_path_factory):
    # The stack tests' helpers: the same synth (cdk.json context) and moto stand-ins they use.
    sys.path.insert(0, str(STACK_TESTS))
    try:
        from synth_helpers import LLAMA_70B, config_with, synthesize
    finally:
        sys.path.remove(str(STACK_TESTS))
    # A unit of two members (leader and follower): Llama-3.1-70B, whose heads split over 2 trn1 nodes.
    return synthesize(config_with(nodes_per_unit=2, model=LLAMA_70B), tmp_path_factory.mktemp("cdk-ops"))


@pytest.fixture
def deployed(default_synth, monkeypatch):
    sys.path.insert(0, str(STACK_TESTS))
    try:
        from moto_cfn import MotoCloudFormation
    finally:
        sys.path.remove(str(STACK_TESTS))
    servers: list[HealthServer] = []
    with MotoCloudFormation() as cfn:
        cfn.deploy(default_synth)
        state_manager.set_transition(model_name="ecs::task", transition={"progression": "manual", "times": 10**9})
        aws = Aws(
            ecs=cfn.client("ecs"),
            ec2=cfn.client("ec2"),
            autoscaling=cfn.client("autoscaling"),
            servicediscovery=cfn.client("servicediscovery"),
            topology=cfn.client("ec2"),
            cloudwatch=cfn.client("cloudwatch"),
            ssm=cfn.client("ssm"),
        )
        monkeypatch.setattr(ops.aws, "make_clients", lambda **_: aws)
        try:
            yield aws, default_synth, servers
        finally:
            state_manager.unset_transition(model_name="ecs::task")  # global in moto: leave it as found
            for s in servers:
                s.close()


def units_cloudmap_service(aws: Aws) -> str:
    """The Discovery stack's `units` service in flotilla.internal (created here when the deployment
    has no Discovery stack yet)."""
    sd = aws.servicediscovery
    if not any(n["Name"] == "flotilla.internal" for n in sd.list_namespaces()["Namespaces"]):
        sd.create_http_namespace(Name="flotilla.internal")
    ns = next(n for n in sd.list_namespaces()["Namespaces"] if n["Name"] == "flotilla.internal")
    for summary in sd.list_services()["Services"]:
        if summary["Name"] == "units" and sd.get_service(Id=summary["Id"])["Service"]["NamespaceId"] == ns["Id"]:
            return summary["Id"]
    return sd.create_service(Name="units", NamespaceId=ns["Id"])["Service"]["Id"]


def start_members(aws: Aws, servers: list[HealthServer]) -> tuple[str, list[str]]:
    """What ECS does for the unit's service: one task per ASG instance; what the Discovery stack's
    Cloud Map service holds: one instance per task (moto creates neither from the templates)."""
    (cluster,) = [c for c in aws.ecs.list_clusters()["clusterArns"] if c.endswith("/flotilla-cell0")]
    (service_arn,) = aws.ecs.list_services(cluster=cluster)["serviceArns"]
    service = aws.ecs.describe_services(cluster=cluster, services=[service_arn])["services"][0]
    (asg,) = [
        g
        for g in aws.autoscaling.describe_auto_scaling_groups()["AutoScalingGroups"]
        if g["AutoScalingGroupName"].startswith("flotilla-Cell-0-")
    ]
    # The unit's group is created empty; the capacity provider's managed scaling raises it to what the
    # service's tasks need ("Amazon ECS managed scaling ... scale-out", ECS developer guide,
    # "Managing Auto Scaling group scaling with Amazon ECS cluster auto scaling").
    aws.autoscaling.set_desired_capacity(
        AutoScalingGroupName=asg["AutoScalingGroupName"], DesiredCapacity=service["desiredCount"]
    )
    (asg,) = aws.autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[asg["AutoScalingGroupName"]])[
        "AutoScalingGroups"
    ]
    instances = sorted(i["InstanceId"] for i in asg["Instances"])
    assert len(instances) == service["desiredCount"], "the group did not launch the unit's nodes"
    cm_service = units_cloudmap_service(aws)
    for rank, iid in enumerate(instances):
        doc = json.dumps({"instanceId": iid, "region": "us-east-1", "availabilityZone": "us-east-1a"})
        ci = aws.ecs.register_container_instance(cluster=cluster, instanceIdentityDocument=doc)["containerInstance"]
        task = aws.ecs.start_task(
            cluster=cluster,
            taskDefinition=service["taskDefinition"],
            containerInstances=[ci["containerInstanceArn"]],
            startedBy="ecs-svc/1",
            group=f"service:{service['serviceName']}",
        )["tasks"][0]
        server = HealthServer(ready_body(unit="cell0-unit0", rank=rank, world_size=len(instances)))
        servers.append(server)
        aws.servicediscovery.register_instance(
            ServiceId=cm_service,
            InstanceId=task["taskArn"].rsplit("/", 1)[-1],
            Attributes={"AWS_INSTANCE_IPV4": "127.0.0.1", "AWS_INSTANCE_PORT": str(server.port)},
        )
    return cluster, instances


def test_status_finds_the_deployed_cell_unit_and_members(deployed, run_cli):
    aws, synth, servers = deployed
    code, out = run_cli("status", "--json")
    (unit,) = json.loads(out)
    # before ECS has started anything the unit exists but is not ready: no ready unit is critical
    assert (unit["cell"], unit["unit"], unit["state"], code) == ("cell0", "cell0-unit0", "NOT READY", 3)
    _, instances = start_members(aws, servers)
    code, out = run_cli("status", "--json")
    assert code == 0, out
    (unit,) = json.loads(out)
    assert unit["revision"] == synth.deployment.config.revision
    assert [(n["rank"], n["instance_id"]) for n in unit["nodes"]] == list(enumerate(instances))


def test_replace_node_finds_the_units_auto_scaling_group_from_the_stack(deployed, run_cli):
    aws, synth, servers = deployed
    _, instances = start_members(aws, servers)
    code, out = run_cli("replace-node", instances[1], "--dry-run", "--force")
    assert code == 0, out
    (asg,) = aws.autoscaling.describe_auto_scaling_instances(InstanceIds=[instances[1]])["AutoScalingInstances"]
    assert asg["AutoScalingGroupName"].startswith("flotilla-Cell-0-")
    assert f"Auto Scaling group {asg['AutoScalingGroupName']}" in out
    assert "rank 1 (follower) of cell0-unit0" in out


def test_rollback_works_after_a_cdk_deploy_of_the_cell_template_as_synthesized(default_synth, world, run_cli):
    """The update-replace policy the Cell stack really carries, applied by the CloudFormation part of
    the ECS model to a deploy of a new revision: the rollback then goes back to the very revision
    that ran before (still registered), with no re-registration."""
    (task,) = default_synth.resources("Cell-0", "AWS::ECS::TaskDefinition").values()
    policy = task.get("UpdateReplacePolicy", "Delete")
    unit = world.add_unit(cell=0, index=0)
    world.add_unit(cell=0, index=1)
    (old,) = world.cdk_deploy([unit], revision="2", update_replace_policy=policy)
    assert world.model.task_defs[old].status == "ACTIVE"
    code, out = run_cli("rollback", "--unit", unit.unit_id, "--yes", "--wait", "600")
    assert code == 0, out
    assert world.service(unit)["taskDefinition"] == old
    assert "registered again" not in out
