"""The Cloud Map layout at fleet scale: one service per cell, each cell's units registering in their own
cell's service, the router told every service, and the synth-time checks of Cloud Map's quotas.

Quotas (https://docs.aws.amazon.com/cloud-map/latest/dg/cloud-map-limits.html): instances per service
1,000 (not adjustable); instances per namespace 2,000 (adjustable); DiscoverInstances 1,000/s and
DiscoverInstancesRevision 3,000/s per account (adjustable). DiscoverInstances returns at most 1,000
instances and has no pagination (Cloud Map API reference, DiscoverInstances).
"""

from __future__ import annotations

import pytest
from synth_helpers import ANY_UNIT_MODEL, REPO_ROOT, cdk_json_context, config_with

import contract
from stacks.config import (
    CLOUDMAP_INSTANCES_PER_SERVICE,
    DISCOVERY_FIXED_RESOURCES,
    ConfigError,
    cloudmap_quota_warnings,
    estimate_discovery_resources,
    load_config,
)


def _registry_service(service: dict) -> str:
    """The Discovery stack's logical id of the Cloud Map service an ECS service registers in."""
    (registry,) = service["Properties"]["ServiceRegistries"]
    return registry["RegistryArn"]["Fn::ImportValue"]


def test_every_cell_of_the_example_fleet_registers_in_its_own_service_well_under_the_quota(fleet_synth):
    config = fleet_synth.deployment.config
    services = fleet_synth.resources("Discovery", "AWS::ServiceDiscovery::Service")
    names = sorted(s["Properties"]["Name"] for s in services.values())
    assert names == sorted(f"{contract.CLOUDMAP_UNITS_SERVICE_PREFIX}cell{c}" for c in range(16))
    logical = {s["Properties"]["Name"]: lid for lid, s in services.items()}
    for cell in range(config.cells):
        units = fleet_synth.resources(f"Cell-{cell}", "AWS::ECS::Service")
        assert len(units) == 20
        exports = {_registry_service(u) for u in units.values()}
        (export,) = exports  # every unit of the cell in one service ...
        assert logical[f"units-cell{cell}"] in export  # ... its own cell's
        # 20 units x 4 nodes (x 1: replace rollout) per service
        assert len(config.units_in_cell(cell)) * config.max_nodes_per_unit == 80 < CLOUDMAP_INSTANCES_PER_SERVICE
    discovery = len(fleet_synth.resources("Discovery"))
    assert discovery == estimate_discovery_resources(16) == DISCOVERY_FIXED_RESOURCES + 16


def test_the_router_is_told_every_cell_service(fleet_synth):
    (task,) = fleet_synth.resources("Router", "AWS::ECS::TaskDefinition").values()
    (container,) = task["Properties"]["ContainerDefinitions"]
    env = {e["Name"]: e["Value"] for e in container["Environment"]}
    assert env[contract.ENV_CLOUDMAP_SERVICE].split(",") == [f"units-cell{c}" for c in range(16)]


def test_the_example_fleet_needs_no_quota_raised():
    config = load_config(cdk_json_context()["flotilla"], str(REPO_ROOT / "examples" / "fleet-20k-chips.yaml"))
    assert config.units * config.max_nodes_per_unit == 1280  # members, in 16 services of 80
    assert cloudmap_quota_warnings(config) == []


def test_a_cell_whose_members_overfill_its_service_during_a_surge_is_refused():
    unit = dict(units=40, units_per_cell=20, model=ANY_UNIT_MODEL)
    config_with(nodes_per_unit=25, unit_rollout="surge", **unit)  # 20 x 50 = 1,000
    config_with(nodes_per_unit=32, unit_rollout="replace", **unit)  # 20 x 32 = 640
    with pytest.raises(ConfigError) as err:
        config_with(nodes_per_unit=32, unit_rollout="surge", **unit)
    assert str(err.value) == (
        "units_per_cell=20 is not allowed: at most 15 with 64 members per unit during a surge "
        "rollout (a cell's Cloud Map service would hold 1,280 instances; Cloud Map allows 1,000 per "
        "service, not adjustable)"
    )


# Past 500 units a fleet cannot give each unit its own cluster placement group (EC2 allows 500 per
# Region; synth refuses it), so these Cloud Map-scale fleets launch without one.
NO_GROUPS = {"placement_group": "none"}


def test_more_cells_than_the_discovery_stack_can_hold_services_for_are_refused():
    with pytest.raises(ConfigError) as err:
        config_with(nodes_per_unit=1, units=600, units_per_cell=1, unit_rollout="replace", capacity=NO_GROUPS)
    assert str(err.value) == (
        # CloudFormation's 200 outputs per template bind before its 500 resources: Discovery exports
        # one service per cell beside 4 fixed outputs, so 197 cells is the first that cannot deploy.
        "units=600 is not allowed: at most 196 with units_per_cell 1 (the Discovery stack "
        "would have 604 outputs, one export per cell; CloudFormation allows 200)"
    )


def test_a_fleet_past_the_default_namespace_quota_warns_with_the_number_to_request():
    # 625 units x 8 nodes = 5,000 members: past the 2,000 default of the adjustable namespace quota.
    eight = dict(nodes_per_unit=8, units_per_cell=20, model=ANY_UNIT_MODEL)
    config = config_with(units=625, unit_rollout="replace", capacity=NO_GROUPS, **eight)
    (warning,) = cloudmap_quota_warnings(config)
    assert "'Instances per namespace'" in warning and "request at least 5,000" in warning
    surge = config_with(units=200, unit_rollout="surge", **eight)
    (warning,) = cloudmap_quota_warnings(surge)
    assert "3,200 unit members during a surge rollout" in warning


def test_many_routers_over_many_cells_warn_about_the_discovery_call_rates():
    config = config_with(nodes_per_unit=1, units=2000, units_per_cell=20, router={"max_count": 200}, capacity=NO_GROUPS)
    # 200 routers / 5 s x 100 cells = 4,000 calls/s: past both account rates
    warnings = cloudmap_quota_warnings(config)
    assert any("4,000 DiscoverInstancesRevision calls/s" in w for w in warnings)
    assert any("4,000 DiscoverInstances calls/s" in w for w in warnings)
    fewer = config_with(nodes_per_unit=1, units=2000, units_per_cell=20, router={"max_count": 100}, capacity=NO_GROUPS)
    # 2,000 calls/s: past DiscoverInstances' 1,000 (if every cell changed at once), not the revisions' 3,000
    assert [w for w in cloudmap_quota_warnings(fewer) if "calls/s" in w and "Revision" in w] == []


def test_synth_prints_the_quota_warnings_on_the_discovery_stack(tmp_path, monkeypatch):
    import aws_cdk as cdk
    from aws_cdk.assertions import Annotations, Match

    import stacks.config as config_module
    from stacks.deployment import build_deployment

    # A quota of 1 makes the default deployment (1 unit x 1 node, 2 members during a surge) warn
    # without synthesizing a 5,000-member fleet.
    monkeypatch.setattr(config_module, "CLOUDMAP_INSTANCES_PER_NAMESPACE", 1)
    app = cdk.App(builtin_cloud_formation_validation=False, context=cdk_json_context(), outdir=str(tmp_path))
    deployment = build_deployment(app, config_with())
    Annotations.from_stack(deployment.discovery).has_warning(
        "/Discovery", Match.string_like_regexp("'Instances per namespace'.*request at least 2 ")
    )
