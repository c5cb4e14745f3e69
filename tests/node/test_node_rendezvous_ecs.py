"""ECS rendezvous against moto's ECS and EC2, with a botocore Stubber for DescribeInstanceTopology
(moto does not implement it)."""

from __future__ import annotations

import asyncio

import boto3
import pytest
from botocore.stub import Stubber
from moto import mock_aws
from moto.moto_api import state_manager

from runtime.rendezvous import RendezvousError, RendezvousTimeout
from runtime.rendezvous.ecs import EcsRendezvous, InstanceTopology

REGION = "us-east-1"
DEPLOYMENT = "ecs-svc/1111111111111111111"


class World:
    """A cluster with one unit service and a few EC2 container instances."""

    def __init__(self, n_instances: int) -> None:
        self.ec2 = boto3.client("ec2", region_name=REGION)
        self.ecs = boto3.client("ecs", region_name=REGION)
        # An image of our own: listing moto's ~2,600 public AMIs to pick one costs a quarter second a call.
        ami = self.ec2.register_image(Name="unit-node", RootDeviceName="/dev/xvda", BlockDeviceMappings=[])["ImageId"]
        res = self.ec2.run_instances(
            ImageId=ami, MinCount=n_instances, MaxCount=n_instances, InstanceType="trn1.32xlarge"
        )
        self.instances = [i["InstanceId"] for i in res["Instances"]]
        self.ip = {i["InstanceId"]: i["PrivateIpAddress"] for i in res["Instances"]}
        self.cluster = self.ecs.create_cluster(clusterName="cell0")["cluster"]["clusterArn"]
        self.taskdef = self.register("unit0")
        self.ecs.create_service(cluster="cell0", serviceName="unit0", taskDefinition=self.taskdef, desiredCount=0)
        self.ci = {}
        for iid in self.instances:
            ci = self.ecs.register_container_instance(
                cluster="cell0", instanceIdentityDocument=f'{{"instanceId": "{iid}"}}'
            )["containerInstance"]
            self.ci[iid] = ci["containerInstanceArn"]

    def register(self, family: str) -> str:
        return self.ecs.register_task_definition(
            family=family,
            networkMode="host",
            containerDefinitions=[{"name": "node", "image": "flotilla", "memory": 512}],
        )["taskDefinition"]["taskDefinitionArn"]

    def start(
        self, iid: str, *, started_by: str = DEPLOYMENT, group: str = "service:unit0", taskdef: str | None = None
    ) -> str:
        t = self.ecs.start_task(
            cluster="cell0",
            taskDefinition=taskdef or self.taskdef,
            containerInstances=[self.ci[iid]],
            startedBy=started_by,
            group=group,
        )
        return t["tasks"][0]["taskArn"]

    def stop(self, task_arn: str) -> None:
        self.ecs.stop_task(cluster="cell0", task=task_arn, reason="test: the node died")


def topology_client(paths: dict[str, list[str]], calls: int) -> InstanceTopology:
    """DescribeInstanceTopology answers for `calls` calls (Stubber checks each request too)."""
    client = boto3.client("ec2", region_name=REGION)
    stub = Stubber(client)
    for _ in range(calls):
        stub.add_response(
            "describe_instance_topology",
            {
                "Instances": [
                    {"InstanceId": iid, "NetworkNodes": nodes, "InstanceType": "trn1.32xlarge"}
                    for iid, nodes in sorted(paths.items())
                ]
            },
        )
    stub.activate()
    return InstanceTopology(client)


def rendezvous(
    w: World, task_arn: str, topology: InstanceTopology, *, world_size: int, timeout_s: float = 5.0
) -> EcsRendezvous:
    return EcsRendezvous(
        unit_id="cell0-unit0",
        revision="r1",
        world_size=world_size,
        api_port=8000,
        dist_port=29500,
        ecs_client=w.ecs,
        ec2_client=w.ec2,
        topology=topology,
        metadata=lambda: {"Cluster": w.cluster, "TaskARN": task_arn, "AvailabilityZone": "us-east-1a"},
        timeout_s=timeout_s,
        poll_s=0.05,
    )


@pytest.fixture
def aws(monkeypatch):
    for k, v in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": REGION,
    }.items():
        monkeypatch.setenv(k, v)
    with mock_aws():
        # moto advances a task from RUNNING on every read; keep tasks RUNNING until stop_task.
        state_manager.set_transition(model_name="ecs::task", transition={"progression": "manual", "times": 10**9})
        try:
            yield
        finally:
            state_manager.unset_transition(model_name="ecs::task")


def test_ranks_follow_topology_network_nodes_then_instance_id_on_every_member(aws):
    w = World(4)
    a, b, c, d = w.instances
    # c and b sit under spine-1; a and d under spine-2 on the same lower nodes (tie on the path)
    paths = {
        a: ["spine-2", "l2-b", "l3-x"],
        b: ["spine-1", "l2-a", "l3-z"],
        c: ["spine-1", "l2-a", "l3-y"],
        d: ["spine-2", "l2-b", "l3-x"],
    }
    tasks = {iid: w.start(iid) for iid in w.instances}
    expected_order = [c, b] + sorted([a, d])  # by path, then instance id for the a/d tie
    seen = []
    for iid, arn in tasks.items():
        m = asyncio.run(rendezvous(w, arn, topology_client(paths, 1), world_size=4).join())
        assert [x.instance_id for x in m.members] == expected_order
        assert m.members[m.rank].task_arn == arn
        assert m.dist_host == w.ip[expected_order[0]]
        assert [x.host for x in m.members] == [w.ip[i] for i in expected_order]
        seen.append(m.rank)
    assert sorted(seen) == [0, 1, 2, 3]


def test_instances_without_topology_are_ordered_by_instance_id(aws):
    w = World(2)
    tasks = [w.start(iid) for iid in w.instances]
    m = asyncio.run(rendezvous(w, tasks[0], topology_client({}, 1), world_size=2).join())
    assert [x.instance_id for x in m.members] == sorted(w.instances)


def test_other_deployments_task_definitions_services_and_stopped_tasks_are_not_members(aws):
    w = World(6)
    i0, i1, i2, i3, i4, i5 = w.instances
    mine = [w.start(i0), w.start(i1)]
    w.start(i2, started_by="ecs-svc/2222222222222222222")  # the previous deployment
    w.start(i3, taskdef=w.register("unit0"))  # another revision of the task def
    w.start(i4, group="service:unit1")  # another unit's service
    w.stop(w.start(i5))  # a dead member
    r = rendezvous(w, mine[0], topology_client({}, 1), world_size=2)
    m = asyncio.run(r.join())
    assert sorted(x.task_arn for x in m.members) == sorted(mine)


def test_join_waits_for_world_size_members_then_times_out_with_a_clear_error(aws):
    w = World(2)
    arn = w.start(w.instances[0])
    r = rendezvous(w, arn, topology_client({}, 200), world_size=2, timeout_s=0.3)
    with pytest.raises(RendezvousTimeout, match=r"only 1 of 2 members of service unit0 .*RUNNING"):
        asyncio.run(r.join())


def test_join_returns_once_the_missing_member_arrives(aws):
    w = World(2)
    arn = w.start(w.instances[0])
    r = rendezvous(w, arn, topology_client({}, 500), world_size=2, timeout_s=10)

    async def scenario():
        joining = asyncio.ensure_future(r.join())
        await asyncio.sleep(0.2)
        assert not joining.done()
        w.start(w.instances[1])
        return await asyncio.wait_for(joining, 5)

    m = asyncio.run(scenario())
    assert m.world_size == 2 and len({x.task_arn for x in m.members}) == 2


def test_a_dead_member_and_its_replacement_are_each_a_membership_change(aws):
    w = World(3)
    i0, i1, i2 = w.instances
    t0, t1 = w.start(i0), w.start(i1)
    r = rendezvous(w, t0, topology_client({}, 10), world_size=2)
    m = asyncio.run(r.join())
    assert asyncio.run(r.changed(m)) is False
    w.stop(t1)
    assert asyncio.run(r.changed(m)) is True
    t2 = w.start(i2)
    assert asyncio.run(r.changed(m)) is True
    m2 = asyncio.run(r.join())
    assert sorted(x.task_arn for x in m2.members) == sorted([t0, t2])


def test_a_surplus_member_waits_as_a_spare(aws):
    w = World(3)
    arns = {iid: w.start(iid) for iid in w.instances}
    spare = arns[sorted(w.instances)[-1]]  # last in rank order
    r = rendezvous(w, spare, topology_client({}, 1), world_size=2)
    member, present = r.try_form()
    assert member is None and present == 3


def test_a_task_outside_a_service_is_refused_with_the_fix(aws):
    w = World(1)
    arn = w.start(w.instances[0], group="family:unit0")
    r = rendezvous(w, arn, topology_client({}, 1), world_size=1)
    with pytest.raises(RendezvousError, match="run unit members as a service"):
        asyncio.run(r.join())


def test_topology_lookups_are_batched_by_100_instances():
    client = boto3.client("ec2", region_name=REGION, aws_access_key_id="x", aws_secret_access_key="x")
    ids = [f"i-{n:017x}" for n in range(150)]
    stub = Stubber(client)
    stub.add_response(
        "describe_instance_topology",
        {"Instances": [{"InstanceId": ids[0], "NetworkNodes": ["s1", "s2", "s3"]}]},
        expected_params={"InstanceIds": sorted(ids)[:100]},
    )
    stub.add_response(
        "describe_instance_topology", {"Instances": []}, expected_params={"InstanceIds": sorted(ids)[100:]}
    )
    with stub:
        paths = InstanceTopology(client).network_nodes(ids)
    stub.assert_no_pending_responses()
    assert paths[ids[0]] == ("s1", "s2", "s3") and paths[ids[1]] == ()


def test_topology_and_addresses_are_looked_up_once_per_instance(aws):
    w = World(2)
    tasks = [w.start(iid) for iid in w.instances]
    r = rendezvous(w, tasks[0], topology_client({}, 1), world_size=2)  # a second lookup would fail
    first, _ = r.try_form()
    again, _ = r.try_form()
    assert first == again
