"""The default deployment (cdk.json) and every examples/*.yaml synthesize units the node accepts: each
unit's task environment, parsed by the node's own settings parser, planned as the node plans it at
start (runtime/engines/neuron/launch.py plan_member for the neuron engine, the reference engine's
make_plan), on the shape of the model the config names. Synth runs the same check and refuses the
rest in one line (docs/model-layout.md)."""

from __future__ import annotations

import pytest
from synth_helpers import LLAMA_405B, REPO_ROOT, cdk_json_context, config_with, synthesize

import contract
from contract.layout import DEFAULT_BATCH_SIZE
from runtime.engines.layout import make_plan
from runtime.engines.neuron.launch import plan_member
from runtime.membership import Member, Membership
from runtime.node.engine_config import EngineConfig
from runtime.node.settings import load_settings
from stacks.config import ConfigError, load_config
from stacks.model_config import model_shape

EXAMPLES = sorted(p.name for p in (REPO_ROOT / "examples").glob("*.yaml"))
# Examples a session fixture already synthesizes.
SYNTHESIZED = {"default.yaml": "default_synth", "fleet-20k-chips.yaml": "fleet_synth", "staging.yaml": "staging_synth"}


def _first_unit_environment(synth) -> dict[str, str]:
    """The node container's environment in Cell-0's first unit's task definition."""
    tasks = synth.resources("Cell-0", "AWS::ECS::TaskDefinition")
    (container,) = tasks[min(tasks, key=lambda logical: int(logical.split("Unit")[1].split("Task")[0]))]["Properties"][
        "ContainerDefinitions"
    ]
    return {e["Name"]: e["Value"] for e in container["Environment"]}


def _node_accepts(synth) -> str:
    """Plan every member of the first unit as its node would at start; the engine's name."""
    config = synth.deployment.config
    shape, _name = model_shape(config)
    env = _first_unit_environment(synth)
    if config.model.builtin:
        # A baked model's directory exists only inside the image that holds it (stacks/image.py): here the
        # node is given the built-in model by name, which is what that directory was converted from.
        env[contract.ENV_MODEL] = config.model.builtin
    settings = load_settings(argv=[], env=env)  # the node's own parser, on the task's environment
    assert settings.world_size == config.nodes_per_unit
    members = [Member(host=f"10.0.0.{10 + r}", api_port=8000, rank=r) for r in range(settings.world_size)]
    for rank in range(settings.world_size):
        membership = Membership(
            unit_id=settings.unit_id,
            revision=settings.revision,
            rank=rank,
            world_size=settings.world_size,
            dist_host=members[0].host,
            dist_port=29500,
            members=tuple(members),
        )
        engine = EngineConfig.from_settings(settings, membership)
        if settings.engine == "neuron":
            neuron = engine.neuron_settings()
            plan = plan_member(
                membership,
                instance_type=neuron.instance_type,
                model=shape,
                model_dir=neuron.model_dir,
                options=neuron.options,
            )
            assert plan.rank == rank
        else:
            plan = make_plan(shape, settings.world_size)
            assert plan.world_size == config.nodes_per_unit
    return settings.engine


@pytest.mark.parametrize("example", ["cdk.json", *EXAMPLES])
def test_the_default_and_every_example_synthesize_units_the_node_accepts(request, tmp_path, example):
    if example in SYNTHESIZED or example == "cdk.json":
        synth = request.getfixturevalue(SYNTHESIZED.get(example, "default_synth"))
    else:
        config = load_config(cdk_json_context()["flotilla"], str(REPO_ROOT / "examples" / example))
        synth = synthesize(config, tmp_path)
    assert _node_accepts(synth) == synth.deployment.config.node.engine


def test_a_batch_the_config_sets_reaches_the_node_and_its_check(tmp_path):
    # Llama-3.1-405B fits 2 trn1 nodes at 4 sequences of 4,096 tokens (13.66 GiB per NeuronCore), not at the
    # default 8 (14.64 GiB > 14.40 usable): the node must be told the batch synth checked.
    config = config_with(nodes_per_unit=2, model=LLAMA_405B, node={"neuron_batch_size": 4})
    assert _node_accepts(synthesize(config, tmp_path)) == "neuron"
    with pytest.raises(ConfigError, match=r"^nodes_per_unit=2 cannot hold llama-3\.1-405b-instruct on trn1\.32xlarge"):
        config_with(nodes_per_unit=2, model=LLAMA_405B, node={"neuron_batch_size": DEFAULT_BATCH_SIZE})
