"""Where Trainium capacity comes from (On-Demand, a Capacity Reservation or group, a Capacity Block),
in which AZs units go, and the adjustable quotas synth reports: refused combinations get the
one-line error, accepted ones reach the templates."""

from __future__ import annotations

import pytest
from synth_helpers import ANY_UNIT_MODEL, LLAMA_405B, config_with, synthesize

from stacks.config import ConfigError, quota_notices

AZS = ["us-east-1a", "us-east-1b", "us-east-1c"]
GROUP = "arn:aws:resource-groups:us-east-1:123456789012:group/trn1-reservations"
RESERVATION = "cr-0123456789abcdef0"

REFUSED = [
    (
        {"capacity": {"availability_zones": ["us-east-1a"]}},
        "capacity.availability_zones=['us-east-1a'] is not allowed: needs availability_zones set "
        "explicitly (units can only be pinned to AZs the VPC names)",
    ),
    (
        {"availability_zones": AZS, "capacity": {"availability_zones": ["us-east-1d"]}},
        "capacity.availability_zones=['us-east-1d'] is not allowed: AZs from availability_zones "
        "['us-east-1a', 'us-east-1b', 'us-east-1c'] (us-east-1d is not one)",
    ),
    (
        {"availability_zones": AZS, "capacity": {"availability_zones": ["us-east-1a", "us-east-1a"]}},
        "capacity.availability_zones=['us-east-1a', 'us-east-1a'] is not allowed: each AZ at most once",
    ),
    (
        {"capacity": {"reservation_id": "cr-XYZ"}},
        "capacity.reservation_id='cr-XYZ' is not allowed: give a Capacity Reservation id like "
        "cr-0123456789abcdef0 (or omit it)",
    ),
    (
        {"capacity": {"market": "spot"}},
        "capacity.market='spot' is not allowed: give one of on-demand, capacity-block",
    ),
    (
        {
            "availability_zones": AZS,
            "capacity": {
                "availability_zones": ["us-east-1a"],
                "reservation_id": RESERVATION,
                "reservation_group_arn": GROUP,
            },
        },
        f"capacity.reservation_group_arn='{GROUP}' is not allowed: unset when capacity.reservation_id is "
        "set (a launch targets one reservation or one group)",
    ),
    (
        {
            "region": "us-west-2",
            "availability_zones": ["us-west-2a", "us-west-2b"],
            "capacity": {"reservation_group_arn": GROUP},
        },
        f"capacity.reservation_group_arn='{GROUP}' is not allowed: a group in region us-west-2",
    ),
    (
        {"capacity": {"market": "capacity-block"}},
        "capacity.market='capacity-block' is not allowed: capacity-block only with "
        "capacity.reservation_id set to the Capacity Block's reservation id",
    ),
    (
        {
            "instance_type": "trn1n.32xlarge",
            "availability_zones": AZS,
            "capacity": {
                "availability_zones": ["us-east-1a"],
                "reservation_id": RESERVATION,
                "market": "capacity-block",
            },
        },
        "instance_type='trn1n.32xlarge' is not allowed: one of trn1.32xlarge with capacity.market "
        "capacity-block (the Trainium types EC2 offers as Capacity Blocks)",
    ),
    (
        {"availability_zones": AZS, "capacity": {"reservation_id": RESERVATION, "placement_group": "none"}},
        "capacity.availability_zones=[] is not allowed: exactly one AZ, the one capacity.reservation_id "
        "holds capacity in (a Capacity Reservation or Capacity Block is in a single AZ)",
    ),
    (
        {"node": {"instance_store": "yes"}},
        "node.instance_store='yes' is not allowed: give true or false",
    ),
]


@pytest.mark.parametrize("overrides,message", REFUSED, ids=[str(i) for i in range(len(REFUSED))])
def test_capacity_settings_ec2_would_refuse_fail_synth_with_one_line(overrides, message):
    with pytest.raises(ConfigError) as err:
        config_with(**overrides)
    assert str(err.value) == message
    assert "\n" not in str(err.value)


def test_units_go_round_robin_over_the_capacity_azs_only():
    config = config_with(units=5, units_per_cell=2, availability_zones=AZS, capacity={"availability_zones": AZS[1:]})
    placements = [p for c in range(config.cells) for p in config.units_in_cell(c)]
    assert [p.az_index for p in placements] == [1, 2, 1, 2, 1]


def test_a_fleet_in_one_az_needs_that_subnet_to_hold_every_efa_address():
    # 3 AZs hold 45 units of 64 trn1n nodes; in one AZ the /18 holds 15 of them.
    with pytest.raises(ConfigError, match=r"units=20 is not allowed: at most 15 over 1 AZs"):
        config_with(
            instance_type="trn1n.32xlarge",
            nodes_per_unit=64,
            units=20,
            unit_rollout="replace",
            availability_zones=AZS,
            capacity={"availability_zones": ["us-east-1a"]},
        )


def test_a_capacity_reservation_group_targets_the_group_in_every_unit_launch_template(tmp_path):
    synth = synthesize(
        config_with(
            units=2, availability_zones=AZS, capacity={"reservation_group_arn": GROUP, "placement_group": "none"}
        ),
        tmp_path,
    )
    templates = synth.resources("Cell-0", "AWS::EC2::LaunchTemplate").values()
    assert len(templates) == 2
    for lt in templates:
        data = lt["Properties"]["LaunchTemplateData"]
        assert data["CapacityReservationSpecification"] == {
            "CapacityReservationTarget": {"CapacityReservationResourceGroupArn": GROUP}
        }
        assert "InstanceMarketOptions" not in data


# --- adjustable quotas ------------------------------------------------------------------------------
def test_the_20480_chip_trn1n_fleet_needs_more_network_interfaces_than_the_default_quota():
    # 1,280 trn1n.32xlarge x 16 EFA interfaces = 20,480 interfaces; with surge up to twice the nodes.
    config = config_with(
        instance_type="trn1n.32xlarge", nodes_per_unit=4, units=320, unit_rollout="surge", model=LLAMA_405B
    )
    enis, vcpus, *_ = quota_notices(config)
    assert enis.quota == "Network interfaces per Region" and enis.default == 5000
    fixed = 2 * 10 + 4 * 3  # router tasks (blue/green) + 3 endpoint services and a NAT gateway per AZ
    assert (enis.needed, enis.peak) == (20480 + fixed, 40960 + fixed)
    assert enis.exceeds_default
    assert f"Request at least {40960 + fixed:,}" in enis.message()
    assert (vcpus.needed, vcpus.peak) == (1280 * 128, 2560 * 128)
    assert vcpus.quota == "Running On-Demand Trn instances" and not vcpus.exceeds_default


def stack_messages(synth, stack) -> list[tuple[str, str]]:
    """(level, text) of the synthesis annotations on one stack."""
    artifact = synth.assembly.get_stack_artifact(stack.artifact_id)
    return [
        (m.level.value.lower() if hasattr(m.level, "value") else str(m.level).lower(), str(m.entry.data))
        for m in artifact.messages
    ]


def test_synth_warns_with_the_quotas_to_request(tmp_path):
    # 40 units x 8 trn1n nodes x 16 EFA interfaces = 5,120 (+32 router/endpoint/NAT) > 5,000.
    config = config_with(
        instance_type="trn1n.32xlarge", units=40, nodes_per_unit=8, unit_rollout="replace", model=ANY_UNIT_MODEL
    )
    synth = synthesize(config, tmp_path)
    warnings = [text for level, text in stack_messages(synth, synth.deployment.network) if level == "warning"]
    (enis,) = [w for w in warnings if "Network interfaces per Region" in w]
    assert "Request at least 5,152" in enis
    # The Trn vCPU quota's default is set per account: synth always says how many the config needs.
    (vcpus,) = [w for w in warnings if "Running On-Demand Trn instances" in w]
    assert "needs 40,960" in vcpus and "covers 40,960" in vcpus


def test_a_small_fleet_is_told_its_trn_vcpus_but_not_warned_about_network_interfaces(default_synth):
    messages = stack_messages(default_synth, default_synth.deployment.network)
    warnings = [text for level, text in messages if level == "warning"]
    assert not [w for w in warnings if "Network interfaces" in w]
    assert any(level == "info" and "Network interfaces per Region" in text for level, text in messages)
    (vcpus,) = [w for w in warnings if "Running On-Demand Trn instances" in w]
    assert "needs 128" in vcpus and "up to 256 while units roll out with surge" in vcpus  # 1 x 128-vCPU node
