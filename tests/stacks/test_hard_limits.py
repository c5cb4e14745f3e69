"""Limits AWS will not raise, refused at synth with one line naming the key and the fix: placement
groups per Region, outputs and resources per template, the placement group a reservation lives in;
and the adjustable quotas synth names (Auto Scaling groups, Elastic IPs, VPCs)."""

from __future__ import annotations

import pytest
from synth_helpers import config_with, synthesize

import stacks.config as config_module
from stacks.config import (
    DISCOVERY_FIXED_OUTPUTS,
    OBSERVABILITY_FIXED_RESOURCES,
    ConfigError,
    quota_notices,
)

AZS = ["us-east-1a", "us-east-1b", "us-east-1c"]
RESERVATION = "cr-0123456789abcdef0"


def refused(**overrides) -> str:
    with pytest.raises(ConfigError) as err:
        config_with(**overrides)
    message = str(err.value)
    assert "\n" not in message
    return message


def test_a_reservation_without_its_placement_group_is_refused_naming_the_fix():
    message = refused(
        availability_zones=AZS, capacity={"availability_zones": ["us-east-1b"], "reservation_id": RESERVATION}
    )
    assert message == (
        "capacity.placement_group=None is not allowed: the name of the cluster placement group the "
        "reservation was created in, or none, when capacity.reservation_id or reservation_group_arn is set (EC2 "
        "launches into a reservation only from its own placement group)"
    )


def test_a_capacity_block_with_a_placement_group_is_refused():
    message = refused(
        availability_zones=AZS,
        capacity={
            "availability_zones": ["us-east-1b"],
            "reservation_id": RESERVATION,
            "market": "capacity-block",
            "placement_group": "my-group",
        },
    )
    assert message.startswith("capacity.placement_group='my-group' is not allowed: none or unset")


def test_units_launch_into_the_reservations_own_placement_group_and_create_none(tmp_path):
    synth = synthesize(
        config_with(
            units=2,
            availability_zones=AZS,
            capacity={"availability_zones": ["us-east-1b"], "reservation_id": RESERVATION, "placement_group": "trn-pg"},
        ),
        tmp_path,
    )
    assert synth.resources("Cell-0", "AWS::EC2::PlacementGroup") == {}
    templates = list(synth.resources("Cell-0", "AWS::EC2::LaunchTemplate").values())
    assert len(templates) == 2
    for lt in templates:
        data = lt["Properties"]["LaunchTemplateData"]
        assert data["Placement"] == {"GroupName": "trn-pg"}
        assert data["CapacityReservationSpecification"] == {
            "CapacityReservationTarget": {"CapacityReservationId": RESERVATION}
        }


def test_a_capacity_block_launches_without_any_placement_group(tmp_path):
    synth = synthesize(
        config_with(
            availability_zones=AZS,
            unit_rollout="replace",
            capacity={"availability_zones": ["us-east-1b"], "reservation_id": RESERVATION, "market": "capacity-block"},
        ),
        tmp_path,
    )
    assert synth.resources("Cell-0", "AWS::EC2::PlacementGroup") == {}
    (lt,) = synth.resources("Cell-0", "AWS::EC2::LaunchTemplate").values()
    assert "Placement" not in lt["Properties"]["LaunchTemplateData"]
    assert lt["Properties"]["LaunchTemplateData"]["InstanceMarketOptions"] == {"MarketType": "capacity-block"}


def test_more_units_than_placement_groups_a_region_allows_are_refused():
    message = refused(units=501, nodes_per_unit=1, unit_rollout="replace")
    assert message == (
        "units=501 is not allowed: at most 500 with a cluster placement group per unit (EC2 allows "
        "500 per Region); or set capacity.placement_group to share one"
    )
    config_with(units=500, nodes_per_unit=1, unit_rollout="replace")  # the limit itself is fine


def test_more_cells_than_discovery_can_export_are_refused():
    # 197 cells + 4 = 201 outputs in the Discovery template.
    message = refused(units=197, units_per_cell=1, nodes_per_unit=1, unit_rollout="replace")
    assert message == (
        "units=197 is not allowed: at most 196 with units_per_cell 1 (the Discovery stack would have "
        "201 outputs, one export per cell; CloudFormation allows 200)"
    )
    config_with(units=196, units_per_cell=1, nodes_per_unit=1, unit_rollout="replace")


def test_more_cells_than_observability_can_alarm_on_are_refused(monkeypatch):
    monkeypatch.setattr(config_module, "MAX_OUTPUTS_PER_STACK", 10_000)  # reach the next limit
    message = refused(units=491, units_per_cell=1, nodes_per_unit=1, unit_rollout="replace")
    assert message == (
        "units=491 is not allowed: at most 490 with units_per_cell 1 (the Observability stack would "
        "hold 501 resources, one alarm per cell; CloudFormation allows 500)"
    )


def test_the_limit_formulas_match_the_synthesized_templates(default_synth, fleet_synth):
    for synth, cells in ((default_synth, 1), (fleet_synth, 16)):
        assert len(synth.template("Discovery")["Outputs"]) == cells + DISCOVERY_FIXED_OUTPUTS
        assert len(synth.resources("Observability")) == cells + OBSERVABILITY_FIXED_RESOURCES


def test_synth_names_auto_scaling_group_elastic_ip_and_vpc_quotas():
    notices = {
        n.key: n
        for n in quota_notices(
            config_with(
                units=600,
                units_per_cell=20,
                nodes_per_unit=1,
                unit_rollout="replace",
                capacity={"placement_group": "none"},
            )
        )
    }
    assert (notices["auto-scaling-groups"].needed, notices["auto-scaling-groups"].default) == (600, 500)
    assert notices["auto-scaling-groups"].exceeds_default
    assert (notices["elastic-ips"].needed, notices["elastic-ips"].default) == (3, 5)
    assert (notices["vpcs"].needed, notices["vpcs"].default) == (1, 5)


def test_synth_warns_when_the_vpc_azs_are_left_to_the_region_default(default_synth, tmp_path):
    def warnings(synth) -> list[str]:
        artifact = synth.assembly.get_stack_artifact(synth.deployment.network.artifact_id)
        texts = [str(m.entry.data) for m in artifact.messages]
        return [t for t in texts if "availability_zones is empty" in t]

    (warning,) = warnings(default_synth)
    assert "whether trn1.32xlarge is offered there" in warning
    assert "aws ec2 describe-instance-type-offerings --location-type availability-zone" in warning
    assert warnings(synthesize(config_with(availability_zones=AZS), tmp_path)) == []


def test_a_trainium_deployment_to_a_named_region_must_name_the_azs_that_offer_its_instance_type():
    message = refused(region="us-west-2")
    assert message == (
        "availability_zones=[] is not allowed: 2 to 6 AZs of us-west-2 that offer trn1.32xlarge when region is "
        "set (else the VPC takes the region's first three whatever they offer); list them with aws ec2 "
        "describe-instance-type-offerings --location-type availability-zone --filters "
        "Name=instance-type,Values=trn1.32xlarge --region us-west-2"
    )
    config_with(region="us-west-2", availability_zones=["us-west-2b", "us-west-2d"])  # named: fine
    # x86 staging types are offered widely; an environment-agnostic synth gets the warning below.
    config_with(region="us-west-2", instance_type="m6i.large", node={"engine": "reference", "instance_store": False})


def test_drained_units_must_name_units_of_the_layout():
    message = refused(units=2, drained_units=["cell0-unit1", "cell3-unit0"])
    assert message == (
        "drained_units=['cell0-unit1', 'cell3-unit0'] is not allowed: unit ids of this layout (cell3-unit0 is not one)"
    )


def test_synth_warns_that_surge_needs_twice_a_fleet_sized_reservation(tmp_path):
    synth = synthesize(
        config_with(
            availability_zones=AZS,
            capacity={"availability_zones": ["us-east-1b"], "reservation_id": RESERVATION, "placement_group": "none"},
        ),
        tmp_path,
    )
    artifact = synth.assembly.get_stack_artifact(synth.deployment.network.artifact_id)
    (warning,) = [
        str(m.entry.data) for m in artifact.messages if "unit_rollout surge with a reservation" in str(m.entry.data)
    ]
    assert "up to 2 trn1.32xlarge instances (1 serving plus as many for the new revision)" in warning
    assert "Use unit_rollout: replace" in warning
