"""Config validation: each rejected input fails with one line naming key, value and what is allowed."""

from __future__ import annotations

import subprocess
import sys

import pytest
from synth_helpers import ANY_UNIT_MODEL, LLAMA_70B, REPO_ROOT, cdk_json_context, config_with

from stacks.config import ConfigError, FlotillaConfig, load_config, parse_config

REJECTED = [
    (
        {"instance_type": "trn2u.48xlarge"},
        "instance_type='trn2u.48xlarge' is not allowed: give one of trn1.32xlarge, trn1n.32xlarge, "
        "trn2.48xlarge, m6i.large, m6i.xlarge",
    ),
    ({"nodes_per_unit": 0}, "nodes_per_unit=0 is out of range: give an integer from 1 to 64"),
    ({"nodes_per_unit": "2"}, "nodes_per_unit='2' is not an integer: give an integer from 1 to 64"),
    ({"units": 0}, "units=0 is out of range: give an integer from 1 to 10000"),
    (
        {"units_per_cell": 21},
        "units_per_cell=21 is out of range: give an integer from 1 to 20 (ECS allows 20 "
        "capacity providers per cluster, one per unit)",
    ),
    (
        {"availability_zones": ["us-east-1a"]},
        "availability_zones=['us-east-1a'] is not allowed: give a list of 2 to 6 AZ names like "
        "[us-east-1a, us-east-1b], or [] for the region's first three",
    ),
    (
        {"availability_zones": ["us-east-1a", "use1-az6"]},
        "availability_zones='use1-az6' is not allowed: give AZ names like us-east-1a",
    ),
    (
        {"availability_zones": ["us-east-1a", "us-east-1a"]},
        "availability_zones=['us-east-1a', 'us-east-1a'] is not allowed: each AZ at most once",
    ),
    (
        {"availability_zones": ["us-east-1a", "us-west-2a"]},
        "availability_zones=['us-east-1a', 'us-west-2a'] is not allowed: AZs of one region",
    ),
    (
        {"region": "us-west-2", "availability_zones": ["us-east-1a", "us-east-1b"]},
        "availability_zones=['us-east-1a', 'us-east-1b'] is not allowed: AZs of region us-west-2",
    ),
    ({"region": "mars-1"}, "region='mars-1' is not allowed: give a region like us-east-1 (or omit it)"),
    ({"account": "1234"}, "account='1234' is not allowed: give a 12-digit account id (or omit it)"),
    (
        {"model": {"s3_uri": "https://example.com/model"}},
        "model.s3_uri='https://example.com/model' is not allowed: give an S3 URI like s3://bucket/prefix/",
    ),
    ({"model": {"name": ""}}, "model.name='' is not allowed: give 1-128 characters: letters, digits, . _ : / -"),
    (
        {"model": {"weights": "x"}},
        "model.weights='x' is not a known key: use one of s3_uri, name, shape, config_json, compile_cache_uri, builtin",
    ),
    (
        {"image": "flotilla"},
        "image='flotilla' is not allowed: give an image URI with a tag or digest, like "
        "123456789012.dkr.ecr.us-east-1.amazonaws.com/flotilla:1.0 (or omit it)",
    ),
    (
        {"certificate_arn": "arn:aws:iam::123456789012:server-certificate/x"},
        "certificate_arn='arn:aws:iam::123456789012:server-certificate/x' is not allowed: give "
        "an ACM certificate ARN (or omit it)",
    ),
    ({"alarm_email": "oncall"}, "alarm_email='oncall' is not allowed: give an e-mail address (or omit it)"),
    ({"unit_rollout": "bluegreen"}, "unit_rollout='bluegreen' is not allowed: give one of replace, surge"),
    ({"node": {"engine": "cuda"}}, "node.engine='cuda' is not allowed: give one of reference, echo, neuron"),
    (
        {"node": {"decode_strategy": "expert"}},
        "node.decode_strategy='expert' is not allowed: give one of auto, pipeline, tensor",
    ),
    (
        {"node": {"drain_timeout_s": 300}},
        "node.drain_timeout_s=300 is out of range: give an integer from 1 to 115 "
        "(ECS sends SIGKILL 120 s after SIGTERM)",
    ),
    (
        {"node": {"log_retention_days": 10}},
        "node.log_retention_days=10 is not allowed: give one of 1, 3, 5, 7, 14, 30, 60, 90, 120, "
        "150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653",
    ),
    ({"router": {"cpu": 300}}, "router.cpu=300 is not allowed: give one of 256, 512, 1024, 2048, 4096"),
    (
        {"scaling": {"scheduled": "prime-day"}},
        "scaling.scheduled='prime-day' is not allowed: give "
        "a list of booked peaks: [{name, start, end, units, reservation}]",
    ),
    (
        {"router": {"balance": "round_robin"}},
        "router.balance='round_robin' is not allowed: give one of cache_aware, least_work, least_requests",
    ),
    (
        {"nodes_per_units": 2},
        "nodes_per_units=2 is not a known key: use one of deployment_name, "
        "instance_type, nodes_per_unit, units, units_per_cell, availability_zones, account, region, "
        "model, image, certificate_arn, alarm_email, revision, unit_rollout, units_per_wave, node, router, "
        "capacity, drained_units, front, speculation, scaling",
    ),
    (
        {"node": {"neuron_prefix_caching_block": 48}},
        "node.neuron_prefix_caching_block=48 is not allowed: give one of 0, 1, 8, 16, 32, 64, 128, 256",
    ),
    (
        {"nodes_per_unit": 2, "model": LLAMA_70B, "node": {"neuron_prefix_caching_block": 32}},
        "node.neuron_prefix_caching_block=32 is not allowed: 0 with node.engine neuron and nodes_per_unit 2 "
        "(prefix caching runs on one-node neuron units only: set nodes_per_unit 1 and node.engine neuron, or 0)",
    ),
    (
        {"deployment_name": "9lives"},
        "deployment_name='9lives' is not allowed: give 1-24 characters: a letter, then letters, digits or -",
    ),
]


@pytest.mark.parametrize(
    "overrides,message", REJECTED, ids=[next(iter(o)) + "-" + str(i) for i, (o, _) in enumerate(REJECTED)]
)
def test_invalid_value_is_rejected_with_one_line_naming_key_value_and_allowed(overrides, message):
    with pytest.raises(ConfigError) as err:
        config_with(**overrides)
    assert str(err.value) == message
    assert "\n" not in str(err.value)


def test_one_node_neuron_units_may_opt_in_to_prefix_caching():
    cfg = config_with(nodes_per_unit=1, node={"neuron_prefix_caching_block": 32})
    assert cfg.node.neuron_prefix_caching_block == 32
    assert config_with().node.neuron_prefix_caching_block == 0  # off unless opted in


def test_container_instance_limit_per_cluster_counts_surge_instances(monkeypatch):
    import stacks.config as config_module

    # With today's ranges a cell holds at most 20 x 64 x 2 = 2,560 instances (limit 5,000); a
    # lower limit shows the check and its message.
    monkeypatch.setattr(config_module, "MAX_CONTAINER_INSTANCES_PER_CLUSTER", 2000)
    # (20 x 64 members would also overfill a cell's Cloud Map service: not what this test is about.)
    monkeypatch.setattr(config_module, "CLOUDMAP_INSTANCES_PER_SERVICE", 10_000)
    config_with(nodes_per_unit=64, units=40, units_per_cell=20, unit_rollout="replace", model=ANY_UNIT_MODEL)
    with pytest.raises(ConfigError) as err:
        config_with(nodes_per_unit=64, units=40, units_per_cell=20, unit_rollout="surge", model=ANY_UNIT_MODEL)
    assert str(err.value) == (
        "units_per_cell=20 is not allowed: at most 15 with 128 instances per unit "
        "(ECS allows 2000 container instances per cluster)"
    )


def test_more_efa_addresses_than_a_private_subnet_holds_is_rejected():
    # 3 AZs x /18: 16,379 usable addresses each; trn1n uses 16 per node.
    with pytest.raises(ConfigError) as err:
        config_with(instance_type="trn1n.32xlarge", nodes_per_unit=64, units=60, unit_rollout="replace")
    assert str(err.value) == (
        "units=60 is not allowed: at most 45 over 3 AZs (20480 EFA addresses would be "
        "needed in one /18 private subnet; add AZs or reduce units)"
    )


def test_resource_estimate_guards_the_500_resource_stack_limit(monkeypatch):
    import stacks.config as config_module

    # If a unit ever grew to 30 resources, 20 units per cell would no longer fit in one stack.
    monkeypatch.setattr(config_module, "UNIT_RESOURCES", 30)
    with pytest.raises(ConfigError) as err:
        config_with(units=40, units_per_cell=20)
    assert str(err.value) == (
        "units_per_cell=20 is not allowed: at most 16 (a cell stack would hold 610 "
        "resources; CloudFormation allows 500)"
    )


def test_defaults_are_one_cell_with_one_unit_of_one_trn1_node():
    # Llama-3.1-8B's 32 query heads split over one trn1.32xlarge's 32 NeuronCores, not over 2 nodes' 64.
    config = load_config(cdk_json_context()["flotilla"], None)
    assert (config.instance_type, config.nodes_per_unit, config.units, config.cells) == ("trn1.32xlarge", 1, 1, 1)
    assert parse_config({}) == FlotillaConfig()


def test_yaml_file_overrides_cdk_json_context_key_by_key(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("units: 45\nmodel:\n  name: m\n  shape: llama-3.1-8b\n")
    config = load_config(cdk_json_context()["flotilla"], str(path))
    assert (config.units, config.cells, config.model.name, config.model.shape) == (45, 3, "m", "llama-3.1-8b")
    assert config.model.s3_uri == cdk_json_context()["flotilla"]["model"]["s3_uri"]
    assert [len(config.units_in_cell(c)) for c in range(3)] == [20, 20, 5]


def test_units_are_spread_round_robin_over_the_availability_zones():
    config = config_with(units=5, units_per_cell=2, availability_zones=["us-east-1a", "us-east-1b"])
    placements = [p for c in range(config.cells) for p in config.units_in_cell(c)]
    assert [(p.cell, p.index, p.az_index) for p in placements] == [
        (0, 0, 0),
        (0, 1, 1),
        (1, 0, 0),
        (1, 1, 1),
        (2, 0, 0),
    ]


def test_missing_config_file_is_rejected(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config({}, str(tmp_path / "nope.yaml"))
    assert str(err.value) == (f"config='{tmp_path / 'nope.yaml'}' is not allowed: path to an existing YAML file")


def test_config_file_that_is_not_a_mapping_is_rejected(tmp_path):
    path = tmp_path / "list.yaml"
    path.write_text("- units: 3\n")
    with pytest.raises(ConfigError) as err:
        load_config({}, str(path))
    assert str(err.value).endswith("a YAML mapping of flotilla settings at top level")


def test_synth_with_invalid_config_exits_nonzero_with_one_error_line(tmp_path):
    """app.py prints the ConfigError alone (no traceback) and exits 2."""
    path = tmp_path / "bad.yaml"
    path.write_text("units_per_cell: 25\n")
    proc = subprocess.run(
        [sys.executable, "app.py"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={
            "CDK_CONTEXT_JSON": '{"config": "%s"}' % path,
            "PATH": "/usr/bin:/bin",
            "CDK_OUTDIR": str(tmp_path / "out"),
            "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20",
        },
    )
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: units_per_cell=25 is out of range: give an integer from 1 to 20 "
        "(ECS allows 20 capacity providers per cluster, one per unit)"
    ]
    assert "Traceback" not in proc.stderr


from hypothesis import assume, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=200, deadline=None)
@given(units=st.integers(1, 400), per_cell=st.integers(1, 20), azs=st.integers(2, 6))
def test_layout_partitions_units_into_cells_and_rotates_azs(units, per_cell, azs):
    assume(-(-units // per_cell) <= 196)  # more cells than Discovery can export is refused (test_hard_limits.py)
    zones = [f"us-east-1{chr(ord('a') + i)}" for i in range(azs)]
    config = config_with(units=units, units_per_cell=per_cell, availability_zones=zones, nodes_per_unit=1)
    placements = [p for c in range(config.cells) for p in config.units_in_cell(c)]
    assert [p.global_index for p in placements] == list(range(units))
    assert all(len(config.units_in_cell(c)) <= per_cell for c in range(config.cells))
    assert len(config.units_in_cell(config.cells - 1)) >= 1
    assert all(p.az_index == p.global_index % azs for p in placements)
    assert len({p.unit_id for p in placements}) == units


def test_examples_load_and_default_yaml_spells_out_the_cdk_json_defaults():
    examples = sorted((REPO_ROOT / "examples").glob("*.yaml"))
    assert {p.name for p in examples} >= {"default.yaml", "fleet-20k-chips.yaml"}
    for path in examples:
        load_config(cdk_json_context()["flotilla"], str(path))
    # examples/default.yaml claims to be the cdk.json defaults, every key written out.
    assert load_config({}, str(REPO_ROOT / "examples" / "default.yaml")) == load_config(
        cdk_json_context()["flotilla"], None
    )


def test_default_yaml_and_the_reference_document_every_config_key():
    from contract.speculation import Speculation
    from stacks.config import CapacityConfig, FrontConfig, ModelConfig, NodeConfig, RouterConfig
    from stacks.scaling_config import ScalingConfig

    text = (REPO_ROOT / "examples" / "default.yaml").read_text()
    # The configuration reference, generated from the config (tests/stacks/test_config_doc.py holds it so).
    reference = (REPO_ROOT / "docs" / "configuration.md").read_text()
    sections = ("model", "node", "router", "capacity", "front", "speculation", "scaling")
    for name in ["scaling", *(f"scaling.{f}" for f in ScalingConfig.model_fields)]:
        assert f"{name.split('.')[-1]}:" in text, f"examples/default.yaml lacks {name}"
        assert f"`{name}`" in reference, f"docs/configuration.md lacks {name}"
    keys = [name for name in FlotillaConfig.model_fields if name not in sections]
    for section, cls in (
        ("model", ModelConfig),
        ("node", NodeConfig),
        ("router", RouterConfig),
        ("capacity", CapacityConfig),
        ("front", FrontConfig),
        ("speculation", Speculation),
    ):
        keys += [f"{section}.{name}" for name in cls.model_fields]
    for key in keys:
        assert f"{key.split('.')[-1]}:" in text, f"examples/default.yaml lacks {key}"
        assert f"`{key}`" in reference, f"docs/configuration.md lacks {key}"


@pytest.mark.parametrize(
    "value,message",
    [
        (0, "units_per_wave=0 is out of range: give an integer from 1 to 10000 (units that roll at once) (or omit it)"),
        (True, "units_per_wave=True is not an integer: give an integer from 1 to 10000"),
        ("4", "units_per_wave='4' is not an integer: give an integer from 1 to 10000"),
        (4, "units_per_wave=4 is not allowed: at most units (3)"),
    ],
)
def test_units_per_wave_is_refused_outside_1_to_units(value, message):
    with pytest.raises(ConfigError) as err:
        parse_config({"units": 3, "units_per_wave": value})
    assert message in str(err.value)


def test_units_per_wave_defaults_to_about_ten_percent_laid_out_on_cells():
    plan = parse_config({"units": 160, "units_per_cell": 20}).wave_plan
    assert (plan.units_per_wave, plan.wave_in_cell, plan.parallel_cells, plan.sequential_waves) == (16, 4, 4, 10)
    assert parse_config({"units": 160, "units_per_cell": 20, "units_per_wave": 1}).wave_plan.sequential_waves == 160
