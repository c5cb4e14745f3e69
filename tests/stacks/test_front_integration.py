"""The front door wired into the real deployment (app.py's build_deployment): stack set and order,
unit rollout settings and update ordering, discovery registration.

cfn-lint, cdk-nag and moto cover the wired stacks through test_cfn_lint.py, test_cdk_nag.py and
test_moto_deploy.py, which check every stack of the deployment.
"""

from __future__ import annotations

import json

import pytest
from synth_helpers import PREBUILT_IMAGE, config_with, synthesize

import contract


@pytest.fixture(scope="module")
def two_cells(tmp_path_factory):
    """3 units, 2 per cell: Cell-0 holds two units (ordering inside a cell), Cell-1 one."""
    return synthesize(config_with(units=3, units_per_cell=2), tmp_path_factory.mktemp("two-cells"))


def unit_services(synth, cell: str) -> list[tuple[str, dict]]:
    services = synth.resources(cell, "AWS::ECS::Service")
    return sorted(services.items(), key=lambda kv: int(kv[0].split("Unit")[1].split("Service")[0]))


def test_synth_emits_network_discovery_cells_front_observability_and_router(two_cells):
    ids = [s.node.id for s in two_cells.stacks]
    assert ids == ["Network", "Discovery", "Cell-0", "Cell-1", "Front", "Observability", "Router"]
    deps = {s.node.id: {d.node.id for d in s.dependencies} for s in two_cells.stacks}
    assert deps["Discovery"] == {"Network"}
    assert deps["Cell-1"] == {"Network", "Discovery", "Cell-0"}
    assert deps["Front"] == {"Network", "Discovery"}
    assert "Front" not in deps["Cell-0"] and "Router" not in deps["Cell-0"]
    assert deps["Observability"] == {"Front"}
    # The router SG lives in Network (the cells admit it), the ALB SG's rules in Discovery.
    assert deps["Router"] == {"Network", "Front", "Observability"}


def test_units_in_a_cell_update_one_after_another(two_cells):
    (first_id, first), (second_id, second) = unit_services(two_cells, "Cell-0")
    assert first_id in second["DependsOn"]
    assert second_id not in first.get("DependsOn", [])


def test_unit_services_roll_with_surge_circuit_breaker_and_a_model_loading_grace_period(two_cells):
    for cell in ("Cell-0", "Cell-1"):
        for _, service in unit_services(two_cells, cell):
            props = service["Properties"]
            config = props["DeploymentConfiguration"]
            assert (config["MinimumHealthyPercent"], config["MaximumPercent"]) == (100, 200)
            assert config["DeploymentCircuitBreaker"] == {"Enable": True, "Rollback": True}
            assert props["HealthCheckGracePeriodSeconds"] == 1800


def test_node_stop_timeout_leaves_room_for_the_drain_timeout(two_cells):
    for task in two_cells.resources("Cell-0", "AWS::ECS::TaskDefinition").values():
        (container,) = task["Properties"]["ContainerDefinitions"]
        env = {e["Name"]: e["Value"] for e in container["Environment"]}
        assert int(env[contract.ENV_DRAIN_TIMEOUT]) < container["StopTimeout"] <= 120


def test_unit_tasks_register_in_their_own_cells_cloud_map_service(two_cells):
    services = two_cells.resources("Discovery", "AWS::ServiceDiscovery::Service")
    logical = {s["Properties"]["Name"]: lid for lid, s in services.items()}
    assert set(logical) == {
        f"{contract.CLOUDMAP_UNITS_SERVICE_PREFIX}cell0",
        f"{contract.CLOUDMAP_UNITS_SERVICE_PREFIX}cell1",
    }
    for n, cell in enumerate(("Cell-0", "Cell-1")):
        for _, service in unit_services(two_cells, cell):
            (registry,) = service["Properties"]["ServiceRegistries"]
            assert f"GetAtt{logical[f'units-cell{n}']}Arn" in registry["RegistryArn"]["Fn::ImportValue"]


def container_image(synth, stack: str) -> str:
    task = next(iter(synth.resources(stack, "AWS::ECS::TaskDefinition").values()))
    return json.dumps(task["Properties"]["ContainerDefinitions"][0]["Image"])


def test_router_runs_the_runtime_image_and_neuron_units_the_neuron_image(two_cells):
    # The router needs no Neuron SDK: it runs runtime/Dockerfile. Units of 1 node on the neuron
    # engine run runtime/Dockerfile.neuron (vLLM's Neuron plugin on the SDK 2.28 image), so the two differ.
    assets = json.loads((two_cells.outdir / "Router.assets.json").read_text())["dockerImages"]
    cell_assets = json.loads((two_cells.outdir / "Cell-0.assets.json").read_text())["dockerImages"]
    assert [a["source"]["dockerFile"] for a in assets.values()] == ["runtime/Dockerfile"]
    assert [a["source"]["dockerFile"] for a in cell_assets.values()] == ["runtime/Dockerfile.neuron"]
    assert container_image(two_cells, "Router") != container_image(two_cells, "Cell-0")


def test_a_configured_image_uri_is_what_router_and_units_both_run(https_front_door_synth):
    # That deployment configures `image` (and a front door, which has no image of its own).
    synth = https_front_door_synth
    assert json.loads(container_image(synth, "Router")) == PREBUILT_IMAGE
    assert json.loads(container_image(synth, "Cell-0")) == PREBUILT_IMAGE


def test_router_and_cpu_engine_nodes_run_the_same_image(tmp_path):
    # trn1 units on the default `neuron` engine run the Neuron image (stacks/image.py); units on
    # a CPU engine (x86 hosts) share the router's image.
    synth = synthesize(config_with(instance_type="m6i.large", node={"engine": "reference"}), tmp_path)
    (router_task,) = synth.resources("Router", "AWS::ECS::TaskDefinition").values()
    node_task = next(iter(synth.resources("Cell-0", "AWS::ECS::TaskDefinition").values()))
    router_image = router_task["Properties"]["ContainerDefinitions"][0]["Image"]
    node_image = node_task["Properties"]["ContainerDefinitions"][0]["Image"]
    assert json.dumps(router_image) == json.dumps(node_image)


def test_ready_unit_alarms_cover_every_cell_at_its_units_less_one_recovering_unit(two_cells):
    # surge (the default) takes no unit out of rotation while it rolls; one unit may be re-forming
    # after a node failure without paging; a cell never alarms below 1 ready unit.
    alarms = two_cells.resources("Observability", "AWS::CloudWatch::Alarm").values()
    per_cell = {
        d["Value"]: a["Properties"]["Threshold"]
        for a in alarms
        for d in a["Properties"].get("Dimensions", [])
        if d["Name"] == contract.METRIC_DIM_CELL
    }
    assert per_cell == {"cell0": 2 - 1, "cell1": 1}


def test_router_settings_come_from_the_config(tmp_path):
    synth = synthesize(
        config_with(router={"desired_count": 3, "max_count": 7, "bake_time_minutes": 20, "live_target_group": "green"}),
        tmp_path,
    )
    (service,) = synth.resources("Router", "AWS::ECS::Service").values()
    # router.desired_count is the autoscaling minimum, not a DesiredCount CloudFormation would write
    # back on every update (tests/stacks/test_updates.py).
    assert "DesiredCount" not in service["Properties"]
    assert service["Properties"]["DeploymentConfiguration"]["BakeTimeInMinutes"] == 20
    (target,) = synth.resources("Router", "AWS::ApplicationAutoScaling::ScalableTarget").values()
    assert (target["Properties"]["MinCapacity"], target["Properties"]["MaxCapacity"]) == (3, 7)
    for rule in synth.resources("Front", "AWS::ElasticLoadBalancingV2::ListenerRule").values():
        weights = {
            tg["TargetGroupArn"]["Ref"][:4]: tg["Weight"]
            for tg in rule["Properties"]["Actions"][0]["ForwardConfig"]["TargetGroups"]
        }
        assert weights == {"Blue": 0, "Gree": 100}
