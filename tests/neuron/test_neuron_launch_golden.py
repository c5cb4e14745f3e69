"""Golden tests: every rank's environment and command, with expected values transcribed from the files
AWS publishes for each pinned image, not from our planner's rules.

Multi-node (NxD Inference at SDK 2.28): aws-neuron/neuronx-distributed-inference@cd3abf30,
examples/multi_node.md, "two process with tp=64 on two Trn1 nodes" (lines 106-145). Single-node (V1 plugin
image): aws-neuron/aws-neuron-sdk@v2.28.0 libraries/nxd-inference/vllm/quickstart-vllm-online-serving.rst
and vllm-project/vllm-neuron@release-0.4.1 README.md. Each value below names its line.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from memberships import membership

from contract.llama import load_config_json
from contract.neuron import MULTI_NODE_IMAGE, SINGLE_NODE_IMAGE
from runtime.engines.neuron import NeuronOptions, plan_member, plan_unit
from runtime.membership import Membership

LEADER = "10.1.0.10"
REPO = Path(__file__).resolve().parents[2]
SPMD = str(REPO / "runtime" / "engines" / "neuron" / "spmd.py")


def _multi_node_md_rank(*, nodes: int, rank: int, cores: int = 32) -> dict:
    """What examples/multi_node.md gives the process on node `rank`, for `nodes` trn1 nodes."""
    return {
        "tp_degree": cores * nodes,  # :118,141 --tp-degree 64 for two nodes
        "start_rank_id": cores * rank,  # :116,139 --start_rank_id 0 / 32
        "local_ranks_size": cores,  # :117,140 --local_ranks 32
        "NEURON_RT_ROOT_COMM_ID": f"{LEADER}:63423",  # :109,132, the rank-0 host on every node
    }


@pytest.mark.parametrize("instance_type", ["trn1.32xlarge", "trn1n.32xlarge"])
# 405B holds 14.64 GiB per NeuronCore on 2 trn1 nodes at batch 8 x 4096 (more than the 14.40 usable), 13.66 at
# batch 4: the layout check refuses the first, so the 2-node 405B case decodes 4 sequences.
@pytest.mark.parametrize(
    "config, nodes, batch_size", [("llama-3.1-70b", 2, 8), ("llama-3.1-405b", 2, 4), ("llama-3.1-405b", 4, 8)]
)
def test_multi_node_ranks_get_what_nxd_inferences_multi_node_example_runs(
    unit_plan, config, nodes, batch_size, instance_type
):
    plan = unit_plan(config, nodes=nodes, instance_type=instance_type, seq_len=4096, batch_size=batch_size)
    assert plan.mode == "multi-node" and plan.image is MULTI_NODE_IMAGE
    assert [r.role for r in plan.ranks] == ["leader"] + ["follower"] * (nodes - 1)
    for rank, got in enumerate(plan.ranks):
        want = _multi_node_md_rank(nodes=nodes, rank=rank)
        assert got.env["NEURON_RT_ROOT_COMM_ID"] == want.pop("NEURON_RT_ROOT_COMM_ID")
        assert dict(got.override_neuron_config) == want
        assert got.start_rank_id == want["start_rank_id"]
        # The launch carries exactly the NeuronConfig fields the plan prints, on this node's rank.
        assert list(got.command[:2]) == ["python3", SPMD]
        assert f"--node-rank={rank}" in got.command and f"--nodes={nodes}" in got.command
        flag = next(a for a in got.command if a.startswith("--neuron-config="))
        assert json.loads(flag.split("=", 1)[1]) == dict(got.nxdi_config)
        assert {k: got.nxdi_config[k] for k in want} == want
        assert got.nxdi_config["world_size"] == want["tp_degree"]  # config.py:381-383: tp x pp x ep


def test_a_4_node_trn1_plan_for_405b_names_the_multi_node_image_on_sdk_2_28(unit_plan):
    doc = unit_plan("llama-3.1-405b", nodes=4).to_dict()
    assert doc["mode"] == "multi-node"
    # aws-neuron/deep-learning-containers@2.28.0:README.md:78; vllm/inference/0.13.0/Dockerfile.neuronx:166
    assert doc["image"]["base_image"] == (
        "public.ecr.aws/neuron/pytorch-inference-vllm-neuronx:0.13.0-neuronx-py312-sdk2.28.0-ubuntu24.04"
    )
    assert doc["image"]["dockerfile"] == "runtime/Dockerfile.neuron-multinode"
    assert doc["image"]["neuron_sdk"] == "2.28.0" and doc["image"]["api"] == "spmd"
    assert doc["parallelism"]["tp_degree"] == 128 and doc["parallelism"]["world_size"] == 128


@pytest.mark.parametrize(
    "instance_type, cores",
    # quickstart-vllm-online-serving.rst:74 "--tensor-parallel-size: Matches the number of Neuron cores";
    # trn1: 16 chips x 2 NeuronCore-v2; trn2: 64 NeuronCores at LNC=2 (logical-neuroncore-config.rst:53-56).
    [("trn1.32xlarge", 32), ("trn1n.32xlarge", 32), ("trn2.48xlarge", 64)],
)
def test_a_single_node_rank_is_started_as_the_plugins_online_serving_quickstart_does(
    checkpoint, unit_plan, instance_type, cores
):
    model_dir = str(checkpoint("llama-3.1-70b"))
    # The quickstart samples on the device; flotilla's default (host sampling) adds one override, below.
    plan = unit_plan(
        Path(model_dir),
        nodes=1,
        instance_type=instance_type,
        seq_len=4096,
        batch_size=8,
        served_model_name="llama",
        sampling="device",
    )
    assert plan.mode == "single-node" and plan.image is SINGLE_NODE_IMAGE
    (leader,) = plan.ranks
    assert leader.role == "leader" and leader.start_rank_id == 0
    assert dict(leader.env) == {
        "VLLM_NEURON_FRAMEWORK": "neuronx-distributed-inference",  # quickstart :57
        "NEURON_COMPILED_ARTIFACTS": "/var/cache/flotilla/neuron-compiled",  # quickstart :156
    }
    assert list(leader.command) == [
        "python3",  # vllm-neuron release-0.4.1 README.md:226
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",  # quickstart :60
        model_dir,
        "--tensor-parallel-size",  # :61
        str(cores),
        "--max-model-len",  # :62
        "4096",
        "--max-num-seqs",  # :63
        "8",
        "--no-enable-prefix-caching",  # :64
        "--num-gpu-blocks-override",  # README.md:288-291: exactly max_num_seqs without prefix caching
        "8",
        "--served-model-name",
        "llama",
        "--host",
        "127.0.0.1",
        "--port",
        "8001",
    ]
    assert dict(leader.override_neuron_config) == {}  # 64 heads split over 32 or 64 cores as they are


def test_single_node_units_sample_on_the_host_unless_told_otherwise(unit_plan):
    # vllm-neuron samples on the host only when on_device_sampling_config is None (release-0.4.1
    # neuronx_distributed_model_runner.py:229-268); on the device it can use another request's row
    # (tests/neuron/test_neuron_sampling_rows.py), so host sampling is the default.
    (leader,) = unit_plan("llama-3.1-70b", nodes=1).ranks
    flag = list(leader.command).index("--additional-config")
    assert json.loads(leader.command[flag + 1]) == {"override_neuron_config": {"on_device_sampling_config": None}}


def test_single_node_passes_cp_and_dp_degrees_only_when_the_heads_need_them(unit_plan):
    # Llama-3-8B's 32 query heads over trn2's 64 NeuronCores: groups of 32 ranks, degree 2 each. The
    # keys are NxD Inference's (neuronx-distributed-inference@v0.7.14366 models/config.py:334,336),
    # passed under override_neuron_config in --additional-config (quickstart :66-70).
    # sampling="device": only the degrees, no host-sampling override
    plan = unit_plan("llama-3-8b", nodes=1, instance_type="trn2.48xlarge", sampling="device")
    (leader,) = plan.ranks
    flag = list(leader.command).index("--additional-config")
    assert json.loads(leader.command[flag + 1]) == {
        "override_neuron_config": {"cp_degree": 2, "attention_dp_degree": 2}
    }


@pytest.mark.parametrize("nodes, sampling", [(1, "device"), (1, "cpu"), (2, "device"), (2, "cpu"), (4, "device")])
def test_every_variable_and_flag_a_plan_emits_names_its_source(unit_plan, nodes, sampling):
    doc = unit_plan(
        {1: "llama-3-8b", 2: "llama-3.1-70b", 4: "llama-3.1-405b"}[nodes],
        nodes=nodes,
        instance_type="trn2.48xlarge" if nodes == 1 else "trn1.32xlarge",
        sampling=sampling,
    ).to_dict()
    sources = doc["sources"]
    assert "command" in sources
    for rank in doc["ranks"]:
        for name in rank["env"]:
            assert name in sources, f"{name} has no source"
        for arg in rank["command"]:
            if arg.startswith("--"):
                assert arg.split("=", 1)[0] in sources, f"{arg} has no source"
        for key in rank["override_neuron_config"]:
            assert f"override_neuron_config.{key}" in sources, f"override_neuron_config.{key} has no source"
    for claim in ("base_image", "vllm", "server"):
        assert doc["image"]["sources"][claim]


def test_trn1n_differs_from_trn1_only_in_efa_interface_count(checkpoint):
    model_dir = str(checkpoint("llama-3.1-70b"))
    shape = load_config_json(model_dir)
    a, b = (
        plan_unit(leader_host=LEADER, nodes=2, instance_type=t, model=shape, model_dir=model_dir)
        for t in ("trn1.32xlarge", "trn1n.32xlarge")
    )
    assert (a.instance.efa_interfaces, b.instance.efa_interfaces) == (8, 16)
    assert (a.instance.chips, b.instance.chips) == (16, 16)
    assert a.ranks == b.ranks


def test_a_member_gets_its_own_rank_of_the_unit_plan_with_the_rendezvous_leader(checkpoint):
    model_dir = str(checkpoint("llama-3.1-405b"))
    unit = membership([(f"10.1.0.{10 + r}", 8000) for r in range(4)], rank=2, unit_id="cell0-unit0", revision="r1")
    got = plan_member(unit, instance_type="trn1.32xlarge", model=load_config_json(model_dir), model_dir=model_dir)
    assert got.rank == 2 and got.role == "follower" and got.start_rank_id == 64
    assert "--node-rank=2" in got.command
    assert got.env["NEURON_RT_ROOT_COMM_ID"] == "10.1.0.10:63423"
    assert got.env["MASTER_ADDR"] == "10.1.0.10"
    assert got.override_neuron_config["start_rank_id"] == 64


def test_the_gloo_port_comes_from_rendezvous(checkpoint):
    model_dir = str(checkpoint("llama-3.1-70b"))
    membership = Membership(unit_id="u", revision="r", rank=1, world_size=2, dist_host="10.1.0.10", dist_port=29555)
    got = plan_member(membership, instance_type="trn1.32xlarge", model=load_config_json(model_dir), model_dir=model_dir)
    assert (got.env["MASTER_ADDR"], got.env["MASTER_PORT"]) == ("10.1.0.10", "29555")


def test_the_compile_cache_key_input_changes_with_what_nxd_inference_compiles(checkpoint):
    model_dir = str(checkpoint("llama-3.1-70b"))
    shape = load_config_json(model_dir)

    def cfg(nodes, rank=0, **options):
        unit = plan_unit(
            leader_host=LEADER,
            nodes=nodes,
            instance_type="trn1.32xlarge",
            model=shape,
            model_dir=model_dir,
            options=NeuronOptions(**options),
        )
        return dict(unit.ranks[rank].nxdi_config)

    assert cfg(1) != cfg(1, seq_len=2048) != cfg(1, batch_size=4)
    assert cfg(2, rank=0) != cfg(2, rank=1)  # start_rank_id: each node compiles for its own cores
    assert cfg(1)["tp_degree"] == 32 and cfg(2)["tp_degree"] == 64 and cfg(2)["world_size"] == 64


def test_launch_spec_lets_the_plan_override_inherited_neuron_variables(unit_plan):
    from runtime.engines.neuron.engine import NeuronEngine, NeuronEngineSettings, rank_argv
    from runtime.engines.neuron.prepare import launch_spec

    plan = unit_plan("llama-3.1-70b", nodes=2)
    argv, env = launch_spec(plan.ranks[1], {"PATH": "/usr/bin", "NEURON_RT_ROOT_COMM_ID": "10.9.9.9:1"})
    assert argv == list(plan.ranks[1].command)
    assert env["PATH"] == "/usr/bin" and env["NEURON_RT_ROOT_COMM_ID"] == f"{LEADER}:63423"
    # A launcher replaces only the interpreter: the same script and flags run under it.
    argv, _ = rank_argv(plan.ranks[1], {}, "/opt/py/bin/python -X dev")
    assert argv == ["/opt/py/bin/python", "-X", "dev", *plan.ranks[1].command[1:]]
    # Where the leader's own API reaches vLLM (bound to loopback by the leader command above).
    leader = NeuronEngine(
        Membership(unit_id="u", revision="r", rank=0, world_size=2, dist_host=LEADER, dist_port=29500),
        settings=NeuronEngineSettings(
            model_uri="s3://bucket/model/",
            model_dir=plan.model_dir,
            instance_type="trn1.32xlarge",
            options=NeuronOptions(),
        ),
        model_name="llama",
        start_timeout_s=1.0,
    )
    assert leader.url == "http://127.0.0.1:8001"
