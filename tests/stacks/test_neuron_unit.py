"""Trainium units on the neuron engine: the Neuron image asset, Neuron and EFA devices
beside each other, host networking, engine ports reachable only inside the unit's own security
group, and a compile cache nodes may write (and nothing else)."""

from __future__ import annotations

import json

import pytest
from synth_helpers import PREBUILT_IMAGE, config_with, synthesize

import contract


def _docker_images(synth, stack_id="Cell-0") -> dict:
    manifest = json.loads((synth.outdir / f"{stack_id}.assets.json").read_text())
    return manifest.get("dockerImages", {})


def _task(synth) -> dict:
    (task,) = synth.resources("Cell-0", "AWS::ECS::TaskDefinition").values()
    return task["Properties"]


def _node_container(synth) -> dict:
    (container,) = _task(synth)["ContainerDefinitions"]
    return container


@pytest.fixture(scope="module")
def reference_synth(tmp_path_factory):
    return synthesize(
        config_with(instance_type="m6i.large", node={"engine": "reference"}), tmp_path_factory.mktemp("cdk-reference")
    )


@pytest.fixture(scope="module")
def trn2_single_node_synth(tmp_path_factory):
    """One unit of one trn2.48xlarge: the single-node image, 16 Neuron devices, 16 EFA interfaces."""
    return synthesize(config_with(instance_type="trn2.48xlarge", nodes_per_unit=1), tmp_path_factory.mktemp("cdk-trn2"))


@pytest.mark.parametrize(
    "synth_name, dockerfile",
    [
        # nodes_per_unit 2: the multi-node image (NxD Inference split over the unit).
        ("trn1n_synth", "runtime/Dockerfile.neuron-multinode"),
        # one node (the default on trn1, and on trn2): the supported V1 plugin image.
        ("default_synth", "runtime/Dockerfile.neuron"),
        ("trn2_single_node_synth", "runtime/Dockerfile.neuron"),
    ],
)
def test_neuron_units_build_the_image_of_their_size(request, synth_name, dockerfile):
    synth = request.getfixturevalue(synth_name)
    images = _docker_images(synth)
    assert [img["source"]["dockerFile"] for img in images.values()] == [dockerfile]
    (asset_hash,) = images
    image = json.dumps(_node_container(synth)["Image"])
    assert asset_hash in image


def test_the_multi_node_image_is_built_with_the_efa_installer_the_nodes_boot_installs(trn1n_synth):
    from contract.node_boot import EFA_INSTALLER

    (image,) = _docker_images(trn1n_synth).values()  # a unit of 2 nodes: the multi-node image
    assert image["source"]["dockerBuildArgs"] == {
        "EFA_INSTALLER_VERSION": EFA_INSTALLER.version,
        "EFA_INSTALLER_SHA256": EFA_INSTALLER.sha256,
    }


def test_reference_engine_units_keep_the_cpu_runtime_image(reference_synth):
    images = _docker_images(reference_synth)
    assert [img["source"]["dockerFile"] for img in images.values()] == ["runtime/Dockerfile"]


def test_a_configured_image_uri_wins_over_both_assets(https_front_door_synth):
    # That deployment configures `image` (and a front door, which has no image of its own).
    synth = https_front_door_synth
    assert _docker_images(synth) == {}
    assert _node_container(synth)["Image"] == PREBUILT_IMAGE


@pytest.mark.parametrize("synth_name, efa", [("default_synth", 8), ("trn1n_synth", 16), ("trn2_single_node_synth", 16)])
def test_efa_verbs_devices_sit_beside_every_neuron_device_on_host_networking(request, synth_name, efa):
    synth = request.getfixturevalue(synth_name)
    assert _task(synth)["NetworkMode"] == "host"
    linux = _node_container(synth)["LinuxParameters"]
    paths = [d["HostPath"] for d in linux["Devices"]]
    assert sorted(p for p in paths if p.startswith("/dev/neuron")) == sorted(f"/dev/neuron{i}" for i in range(16))
    assert sorted(p for p in paths if p.startswith("/dev/infiniband/")) == sorted(
        f"/dev/infiniband/uverbs{i}" for i in range(efa)
    )
    assert linux["Capabilities"] == {"Add": ["IPC_LOCK"]}
    assert {"Name": "memlock", "SoftLimit": -1, "HardLimit": -1} in _node_container(synth)["Ulimits"]


def _ingress_rules(synth) -> list[dict]:
    template = synth.template("Cell-0")
    rules = [r["Properties"] for r in template["Resources"].values() if r["Type"] == "AWS::EC2::SecurityGroupIngress"]
    for res in template["Resources"].values():
        if res["Type"] == "AWS::EC2::SecurityGroup":
            rules += res["Properties"].get("SecurityGroupIngress", [])
    return rules


def _covers(rule: dict, port: int) -> bool:
    if rule["IpProtocol"] == "-1":
        return True
    return rule.get("FromPort", 0) <= port <= rule.get("ToPort", 65535)


def _unit_sg(synth) -> str:
    (sg_id,) = [
        k
        for k, v in synth.resources("Cell-0", "AWS::EC2::SecurityGroup").items()
        if "EFA" in v["Properties"]["GroupDescription"]
    ]
    return sg_id


@pytest.mark.parametrize("port", [contract.DIST_PORT, contract.NEURON_RT_ROOT_COMM_PORT, contract.NEURON_ENGINE_PORT])
def test_engine_ports_are_reachable_only_from_the_units_own_security_group(default_synth, port):
    unit_sg = _unit_sg(default_synth)
    covering = [r for r in _ingress_rules(default_synth) if _covers(r, port)]
    assert covering, f"nothing lets unit members reach port {port}"
    for rule in covering:
        assert "CidrIp" not in rule and "CidrIpv6" not in rule, rule
        assert rule["SourceSecurityGroupId"] == {"Fn::GetAtt": [unit_sg, "GroupId"]}, rule


def test_the_gloo_port_sits_in_the_internal_range_and_the_forks_fixed_port_is_admitted_too(default_synth):
    low, high = contract.UNIT_INTERNAL_PORT_RANGE
    assert low <= contract.DIST_PORT <= high
    # NxD Inference's multi-node example uses port 63423 for the Neuron runtime, outside the range: only an
    # all-traffic self-referencing rule admits it, and that rule must stay (EFA needs it too).
    assert contract.NEURON_RT_ROOT_COMM_PORT == 63423 and not low <= 63423 <= high
    unit_sg = _unit_sg(default_synth)
    self_rules = [
        r
        for r in _ingress_rules(default_synth)
        if r.get("SourceSecurityGroupId") == {"Fn::GetAtt": [unit_sg, "GroupId"]}
    ]
    assert [r["IpProtocol"] for r in self_rules] == ["-1"]


def _task_policy_statements(synth) -> list[dict]:
    return [
        s
        for p in synth.resources("Cell-0", "AWS::IAM::Policy").values()
        for s in p["Properties"]["PolicyDocument"]["Statement"]
        if s.get("Sid") in ("ReadModelArtifacts", "ReadWriteCompileCache", "ListCompileCache")
    ]


def test_nodes_write_only_the_compile_cache_and_only_read_the_model(default_synth):
    by_sid = {s["Sid"]: s for s in _task_policy_statements(default_synth)}
    assert by_sid["ReadModelArtifacts"]["Action"] == "s3:GetObject"
    cache = by_sid["ReadWriteCompileCache"]
    assert cache["Action"] == ["s3:GetObject", "s3:PutObject"]
    assert cache["Resource"] == {
        "Fn::Join": ["", ["arn:", {"Ref": "AWS::Partition"}, ":s3:::flotilla-models-example/neuron-compile-cache/*"]]
    }
    assert by_sid["ListCompileCache"]["Condition"] == {"StringLike": {"s3:prefix": ["neuron-compile-cache/*"]}}


def test_nodes_are_told_where_the_compile_cache_is(default_synth):
    env = {e["Name"]: e["Value"] for e in _node_container(default_synth)["Environment"]}
    assert env[contract.ENV_COMPILE_CACHE_URI] == "s3://flotilla-models-example/neuron-compile-cache/"
    assert env[contract.ENV_ENGINE] == "neuron"
    assert env[contract.ENV_INSTANCE_TYPE] == "trn1.32xlarge"  # the node plans its layout for it
    assert env[contract.ENV_NEURON_SAMPLING] == "cpu"  # node.neuron_sampling's default
    assert env[contract.ENV_NEURON_PREFIX_CACHING_BLOCK] == "0"  # prefix caching off unless opted in


def test_reference_engine_units_get_no_compile_cache_access(reference_synth):
    assert {s["Sid"] for s in _task_policy_statements(reference_synth)} == {"ReadModelArtifacts"}
    env = {e["Name"] for e in _node_container(reference_synth)["Environment"]}
    assert contract.ENV_COMPILE_CACHE_URI not in env


def test_a_configured_compile_cache_uri_is_validated_and_used(tmp_path):
    from stacks.config import ConfigError

    with pytest.raises(ConfigError, match="model.compile_cache_uri"):
        config_with(model={"compile_cache_uri": "not-s3"})
    config = config_with(model={"compile_cache_uri": "s3://my-cache/neuron/"})
    assert (config.model.compile_cache_bucket, config.model.compile_cache_prefix) == ("my-cache", "neuron/")
