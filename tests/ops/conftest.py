"""A fake flotilla deployment for the CLI tests: moto-backed ECS clusters (one per cell), one ECS
service per unit, Auto Scaling groups of instances, Cloud Map registrations, and a real HTTP server
on 127.0.0.1 (port chosen at run time) for each node's /health/ready."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import boto3
import botocore.session
import pytest
from botocore.stub import Stubber
from moto import mock_aws
from moto.moto_api import state_manager
from ops_fakes import HealthServer, ready_body

import contract
import ops.aws
from ops.aws import Aws

REGION = "us-east-1"
# One botocore session for every test: it caches the parsed service models (~0.2 s per client).
_BOTOCORE = botocore.session.get_session()


@dataclass
class FakeNode:
    instance_id: str
    task_arn: str
    container_instance_arn: str
    server: HealthServer | None  # None when a real node process answers instead


@dataclass
class FakeUnit:
    cell_id: str
    unit_id: str
    cluster_arn: str
    service_name: str
    service_arn: str
    asg_name: str
    family: str
    task_definition_arn: str
    nodes: list[FakeNode] = field(default_factory=list)  # in rank order


class FakeDeployment:
    def __init__(self, aws: Aws, *, deployment: str = "flotilla") -> None:
        self.aws, self.deployment = aws, deployment
        self.units: list[FakeUnit] = []
        self.servers: list[HealthServer] = []
        vpc = aws.ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
        self.subnet = aws.ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.0.0/20", AvailabilityZone=f"{REGION}a")[
            "Subnet"
        ]["SubnetId"]
        self.launch_template = aws.ec2.create_launch_template(
            LaunchTemplateName="flotilla-node",
            LaunchTemplateData={"ImageId": "ami-12c6146b", "InstanceType": "trn1.32xlarge"},
        )["LaunchTemplate"]["LaunchTemplateId"]
        sd = aws.servicediscovery
        sd.create_http_namespace(Name=f"{deployment}.internal")
        ns = next(n for n in sd.list_namespaces()["Namespaces"] if n["Name"] == f"{deployment}.internal")
        self.cloudmap_service = sd.create_service(Name="units", NamespaceId=ns["Id"])["Service"]["Id"]
        self.clusters: dict[str, str] = {}

    def cluster(self, cell: int) -> str:
        if cell not in self.clusters:
            # stacks/cell.py: cluster <deployment>-cell<n>, tagged with the deployment and the cell
            self.clusters[cell] = self.aws.ecs.create_cluster(
                clusterName=f"{self.deployment}-cell{cell}",
                tags=[
                    {"key": "flotilla:deployment", "value": self.deployment},
                    {"key": "flotilla:cell", "value": f"cell{cell}"},
                ],
            )["cluster"]["clusterArn"]
        return self.clusters[cell]

    def add_unit(
        self,
        *,
        cell: int,
        index: int,
        nodes: int = 2,
        revision: str = "1",
        register: bool = True,
        ports: list[int] | None = None,
    ) -> FakeUnit:
        """A unit of `nodes` members in rank order. Each gets a HealthServer, unless `ports` names
        real node processes on 127.0.0.1 to register in Cloud Map instead."""
        aws = self.aws
        cell_id, unit_id = f"cell{cell}", f"cell{cell}-unit{index}"
        cluster = self.cluster(cell)
        asg_name = f"{self.deployment}-Cell-{cell}-Unit{index}Asg"
        aws.autoscaling.create_auto_scaling_group(
            AutoScalingGroupName=asg_name,
            MinSize=nodes,
            MaxSize=nodes,
            DesiredCapacity=nodes,
            LaunchTemplate={"LaunchTemplateId": self.launch_template, "Version": "$Latest"},
            VPCZoneIdentifier=self.subnet,
        )
        instances = sorted(
            i["InstanceId"]
            for i in aws.autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[asg_name])[
                "AutoScalingGroups"
            ][0]["Instances"]
        )
        family = f"{self.deployment}-{unit_id}"  # stacks/cell.py's task family
        td = self.register_revision(family=family, unit_id=unit_id, cell_id=cell_id, nodes=nodes, revision=revision)
        service = f"{self.deployment}-Cell-{cell}-Unit{index}Service-{index:04d}"
        svc = aws.ecs.create_service(
            cluster=cluster,
            serviceName=service,
            taskDefinition=td,
            desiredCount=nodes,
            tags=[{"key": "flotilla:unit", "value": unit_id}],
        )["service"]
        unit = FakeUnit(
            cell_id=cell_id,
            unit_id=unit_id,
            cluster_arn=cluster,
            service_name=service,
            service_arn=svc["serviceArn"],
            asg_name=asg_name,
            family=family,
            task_definition_arn=td,
        )
        for rank, iid in enumerate(instances):
            doc = json.dumps({"instanceId": iid, "region": REGION, "availabilityZone": f"{REGION}a"})
            ci = aws.ecs.register_container_instance(cluster=cluster, instanceIdentityDocument=doc)[
                "containerInstance"
            ]["containerInstanceArn"]
            task = aws.ecs.start_task(
                cluster=cluster,
                taskDefinition=td,
                containerInstances=[ci],
                startedBy="ecs-svc/1234",
                group=f"service:{service}",
            )["tasks"][0]
            server = None
            if ports is None:
                server = HealthServer(ready_body(unit=unit_id, rank=rank, world_size=nodes, revision=revision))
                self.servers.append(server)
            port = ports[rank] if ports is not None else server.port
            if register:
                aws.servicediscovery.register_instance(
                    ServiceId=self.cloudmap_service,
                    InstanceId=task["taskArn"].rsplit("/", 1)[-1],
                    Attributes={
                        "AWS_INSTANCE_IPV4": "127.0.0.1",
                        "AWS_INSTANCE_PORT": str(port),
                        "ECS_SERVICE_NAME": service,
                    },
                )
            unit.nodes.append(
                FakeNode(instance_id=iid, task_arn=task["taskArn"], container_instance_arn=ci, server=server)
            )
        self.units.append(unit)
        self.set_deployment(unit, "COMPLETED")
        return unit

    def add_formation(
        self, unit: FakeUnit, *, task_definition: str, started_by: str, revision: str, ready: bool
    ) -> list[FakeNode]:
        """Start a second formation of the unit on fresh instances, as a surge rollout does."""
        aws, n = self.aws, len(unit.nodes)
        ids = [
            i["InstanceId"]
            for i in aws.ec2.run_instances(
                ImageId="ami-12c6146b", MinCount=n, MaxCount=n, InstanceType="trn1.32xlarge", SubnetId=self.subnet
            )["Instances"]
        ]
        out = []
        for rank, iid in enumerate(sorted(ids)):
            doc = json.dumps({"instanceId": iid, "region": REGION, "availabilityZone": f"{REGION}a"})
            ci = aws.ecs.register_container_instance(cluster=unit.cluster_arn, instanceIdentityDocument=doc)[
                "containerInstance"
            ]["containerInstanceArn"]
            task = aws.ecs.start_task(
                cluster=unit.cluster_arn,
                taskDefinition=task_definition,
                containerInstances=[ci],
                startedBy=started_by,
                group=f"service:{unit.service_name}",
            )["tasks"][0]
            server = HealthServer(
                ready_body(
                    unit=unit.unit_id,
                    rank=rank,
                    world_size=n,
                    revision=revision,
                    ready=ready,
                    state="ready" if ready else "forming",
                )
            )
            self.servers.append(server)
            aws.servicediscovery.register_instance(
                ServiceId=self.cloudmap_service,
                InstanceId=task["taskArn"].rsplit("/", 1)[-1],
                Attributes={
                    "AWS_INSTANCE_IPV4": "127.0.0.1",
                    "AWS_INSTANCE_PORT": str(server.port),
                    "ECS_SERVICE_NAME": unit.service_name,
                },
            )
            out.append(FakeNode(instance_id=iid, task_arn=task["taskArn"], container_instance_arn=ci, server=server))
        return out

    def set_deployment(self, unit: FakeUnit, rollout_state: str, reason: str = "") -> None:
        """Put the service's ECS deployments where real ECS would be: moto keeps a new service's
        deployment IN_PROGRESS forever because it never counts the tasks we start ourselves."""
        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.ecs.models import ecs_backends

        cluster_name = unit.cluster_arn.rsplit("/", 1)[-1]
        service = ecs_backends[DEFAULT_ACCOUNT_ID][REGION].services[f"{cluster_name}:{unit.service_name}"]
        running = len(unit.nodes) if rollout_state == "COMPLETED" else 0
        service.running_count, service.pending_count = running, 0
        for d in service.deployments:
            d.update(
                rolloutState=rollout_state,
                runningCount=running,
                pendingCount=0,
                rolloutStateReason=reason or f"ECS deployment {d['id']} {rollout_state.lower()}.",
                taskDefinition=service.task_definition,
            )

    def register_revision(self, *, family: str, unit_id: str, cell_id: str, nodes: int, revision: str) -> str:
        env = {
            contract.ENV_UNIT_ID: unit_id,
            contract.ENV_CELL_ID: cell_id,
            contract.ENV_REVISION: revision,
            contract.ENV_NODES_PER_UNIT: str(nodes),
            contract.ENV_ROLE: "node",
        }
        return self.aws.ecs.register_task_definition(
            family=family,
            networkMode="host",
            containerDefinitions=[
                {
                    "name": "node",
                    "image": "flotilla:latest",
                    "memory": 1024,
                    "environment": [{"name": k, "value": v} for k, v in env.items()],
                }
            ],
        )["taskDefinition"]["taskDefinitionArn"]

    def close(self) -> None:
        for s in self.servers:
            s.close()


@pytest.fixture(scope="module", autouse=True)
def moto_without_public_amis():
    """moto loads ~2,600 public AMIs into every new EC2 backend (~0.75 s, twice per test); these
    tests need none. moto rebuilds the backends a mock touched when it stops, under the setting then
    in force, and keeps them for the next mock (Auto Scaling backends hold EC2 ones), so after the
    module one mock cycle under the default setting hands later tests (other suites' too) backends
    with their AMIs again."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")
        yield
    with mock_aws():
        session = boto3.Session(region_name=REGION, botocore_session=_BOTOCORE)
        session.client("ec2").describe_images(Owners=["self"])
        session.client("autoscaling").describe_auto_scaling_groups()


@pytest.fixture
def aws(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    with mock_aws():
        # Tasks stay RUNNING (by default moto walks them towards STOPPED a step per describe call).
        state_manager.set_transition(model_name="ecs::task", transition={"progression": "manual", "times": 10**9})
        session = boto3.Session(region_name=REGION, botocore_session=_BOTOCORE)
        clients = Aws(
            ecs=session.client("ecs"),
            ec2=session.client("ec2"),
            autoscaling=session.client("autoscaling"),
            servicediscovery=session.client("servicediscovery"),
            # moto has no DescribeInstanceTopology: tests queue its answers on this Stubber
            topology=session.client("ec2"),
            cloudwatch=session.client("cloudwatch"),
            ssm=session.client("ssm"),
            logs=session.client("logs"),
            secretsmanager=session.client("secretsmanager"),
            cloudformation=session.client("cloudformation"),
            acm=session.client("acm"),
            ecr=session.client("ecr"),
            # moto has no EC2 quotas, no DescribeCapacityReservations and not the pinned AMI's public
            # parameter: tests queue those answers on Stubbers over these three clients
            servicequotas=session.client("service-quotas"),
            capacity=session.client("ec2"),
            ami=session.client("ssm"),
            sts=session.client("sts"),
        )
        monkeypatch.setattr(ops.aws, "make_clients", lambda **_: clients)
        try:
            yield clients
        finally:
            state_manager.unset_transition(model_name="ecs::task")  # global in moto: leave it as found


@pytest.fixture
def s3(aws):
    """moto's S3 on aws.s3. Its own boto3 session: boto3 adds upload_file to the S3 client class once
    per boto3 session, and a second session over the shared botocore session fails to add it again."""
    aws.s3 = boto3.client("s3", region_name=REGION)
    return aws.s3


@pytest.fixture
def topology_stub(aws):
    with Stubber(aws.topology) as stub:
        yield stub
        stub.assert_no_pending_responses()


@pytest.fixture
def fleet(aws):
    d = FakeDeployment(aws)
    yield d
    d.close()


@pytest.fixture
def run_cli(capsys):
    """Run `flotilla ARGS...` in-process; returns (exit status, stdout)."""
    from ops.cli import main

    def run(*argv: str) -> tuple[int, str]:
        code = main(list(argv))
        return code, capsys.readouterr().out

    return run


@pytest.fixture
def run_cli_err(capsys):
    """Run `flotilla ARGS...` in-process; returns (exit status, stdout, stderr)."""
    from ops.cli import main

    def run(*argv: str) -> tuple[int, str, str]:
        code = main(list(argv))
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


@pytest.fixture
def world(aws, monkeypatch):
    """A deployment on the ECS model (ecs_world.py): deployments, task lifecycles and capacity as ECS
    and Auto Scaling have them, instead of moto's instant counts. Waits poll without sleeping."""
    from ecs_world import build_world

    import ops.commands.common as common

    monkeypatch.setattr(common, "pause", lambda s: None)
    w = build_world(aws)
    yield w
    w.close()
