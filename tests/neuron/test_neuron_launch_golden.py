"""Golden tests: every rank's environment, command and NxD Inference config, computed by hand.

The expected values below are written out by hand from the Neuron multi-node conventions: local TP
32 per trn1 node, global tp_degree = 32 x nodes, start_rank_id = rank x 32, NEURON_RT_ROOT_COMM_ID
at the leader, gloo (torch env://) at the leader for the input broadcast, EFA variables.
"""

from __future__ import annotations

import json

import pytest

from runtime.engines.neuron import NeuronOptions, load_model_shape, plan_member, plan_unit
from runtime.membership import Member, Membership

LEADER = "10.1.0.10"

# (model, nodes, cp_degree, attention_dp_degree): chosen by hand so heads split evenly.
LAYOUTS = [
    pytest.param("llama-3.1-70b", 2, 1, 1, id="70b-2-nodes-tp64"),
    pytest.param("llama-3.1-70b", 4, 2, 2, id="70b-4-nodes-tp128-cp2-dp2"),
    pytest.param("llama-3.1-405b", 8, 4, 2, id="405b-8-nodes-tp256-cp4-dp2"),
]


def _expected_nxdi(nodes: int, rank: int, cp: int, dp: int) -> dict:
    return {
        "tp_degree": 32 * nodes,
        "world_size": 32 * nodes,
        "local_ranks_size": 32,
        "start_rank_id": 32 * rank,
        "cp_degree": cp,
        "attention_dp_degree": dp,
        "seq_len": 4096,
        "max_context_length": 4096,
        "batch_size": 8,
        "ctx_batch_size": 1,
        "tkg_batch_size": 8,
        "is_continuous_batching": True,
        "torch_dtype": "bfloat16",
    }


def _expected_env(nodes: int, rank: int) -> dict:
    return {
        "VLLM_NEURON_FRAMEWORK": "neuronx-distributed-inference",
        "NEURON_COMPILED_ARTIFACTS": "/var/cache/flotilla/neuron-compiled",
        "ENABLE_NEURON_MULTI_NODE": "true",
        "NEURON_RANK_ID": str(rank),
        "NEURON_LOCAL_TP": "32",
        "NEURON_RT_ROOT_COMM_ID": "10.1.0.10:29501",
        "WORLD_SIZE": str(nodes),
        "MASTER_ADDR": "10.1.0.10",
        "MASTER_PORT": "29500",
        "FI_PROVIDER": "efa",
        "FI_EFA_USE_DEVICE_RDMA": "1",
        "FI_EFA_FORK_SAFE": "1",
    }


def _engine_args(model_dir: str, nodes: int, rank: int, cp: int, dp: int) -> list[str]:
    return [
        "--model",
        model_dir,
        "--tensor-parallel-size",
        str(32 * nodes),
        "--max-num-seqs",
        "8",
        "--max-model-len",
        "4096",
        "--dtype",
        "bfloat16",
        "--additional-config",
        json.dumps(
            {"override_neuron_config": _expected_nxdi(nodes, rank, cp, dp)}, sort_keys=True, separators=(",", ":")
        ),
    ]


@pytest.mark.parametrize("instance_type", ["trn1.32xlarge", "trn1n.32xlarge"])
@pytest.mark.parametrize("config, nodes, cp, dp", LAYOUTS)
def test_every_rank_gets_the_hand_computed_env_command_and_nxdi_config(
    checkpoint, config, nodes, cp, dp, instance_type
):
    model_dir = str(checkpoint(config))
    plan = plan_unit(
        leader_host=LEADER,
        nodes=nodes,
        instance_type=instance_type,
        model=load_model_shape(model_dir),
        model_dir=model_dir,
        options=NeuronOptions(
            seq_len=4096, batch_size=8, cp_degree=cp, attention_dp_degree=dp, served_model_name="llama"
        ),
    )
    assert plan.tp_degree == 32 * nodes
    assert [r.rank for r in plan.ranks] == list(range(nodes))
    for rank, got in enumerate(plan.ranks):
        assert got.start_rank_id == 32 * rank
        assert dict(got.env) == _expected_env(nodes, rank)
        assert dict(got.nxdi_config) == _expected_nxdi(nodes, rank, cp, dp)
        if rank == 0:
            assert got.role == "leader"
            assert list(got.command) == [
                "python3",
                "-m",
                "vllm.entrypoints.openai.api_server",
                *_engine_args(model_dir, nodes, rank, cp, dp),
                "--served-model-name",
                "llama",
                "--host",
                "127.0.0.1",
                "--port",
                "8001",
            ]
        else:
            assert got.role == "follower"
            assert list(got.command) == [
                "python3",
                "-m",
                "runtime.engines.neuron.worker",
                *_engine_args(model_dir, nodes, rank, cp, dp),
            ]


def test_trn1n_differs_from_trn1_only_in_efa_interface_count(checkpoint):
    model_dir = str(checkpoint("llama-3.1-70b"))
    shape = load_model_shape(model_dir)
    a, b = (
        plan_unit(leader_host=LEADER, nodes=2, instance_type=t, model=shape, model_dir=model_dir)
        for t in ("trn1.32xlarge", "trn1n.32xlarge")
    )
    assert (a.instance.efa_interfaces, b.instance.efa_interfaces) == (8, 16)
    assert (a.instance.chips, b.instance.chips) == (16, 16)
    assert a.ranks == b.ranks


@pytest.mark.parametrize(
    "config, nodes, cp, dp, prefill_heads, decode_heads",
    [
        # 70B: 64 query heads. tp 64 fits with no split; tp 128 needs groups of 64 (degree 2);
        # tp 256 needs degree 4.
        ("llama-3.1-70b", 2, 1, 1, 1, 1),
        ("llama-3.1-70b", 4, 2, 2, 1, 1),
        ("llama-3.1-70b", 8, 4, 4, 1, 1),
        # 8B: 32 query heads: groups of at most 32 ranks, so degree = tp / 32 = nodes.
        ("llama-3-8b", 2, 2, 2, 1, 1),
        ("llama-3-8b", 8, 8, 8, 1, 1),
        # 405B: 128 query heads: tp 64 gives two heads per rank.
        ("llama-3.1-405b", 2, 1, 1, 2, 2),
    ],
)
def test_auto_degrees_are_the_smallest_that_split_heads_evenly(
    checkpoint, config, nodes, cp, dp, prefill_heads, decode_heads
):
    model_dir = str(checkpoint(config))
    plan = plan_unit(
        leader_host=LEADER,
        nodes=nodes,
        instance_type="trn1.32xlarge",
        model=load_model_shape(model_dir),
        model_dir=model_dir,
    )
    assert (plan.cp_degree, plan.attention_dp_degree) == (cp, dp)
    layout = plan.to_dict()["parallelism"]
    assert layout["prefill"]["q_heads_per_rank"] == prefill_heads
    assert layout["decode"]["q_heads_per_rank"] == decode_heads
    assert layout["prefill"]["kv_heads_per_rank"] == 1  # 8 KV heads replicated over >= 8 ranks


def test_a_member_gets_its_own_rank_of_the_unit_plan_with_the_rendezvous_leader(checkpoint):
    model_dir = str(checkpoint("llama-3.1-70b"))
    members = tuple(Member(rank=r, host=f"10.1.0.{10 + r}", api_port=8000) for r in range(4))
    membership = Membership(
        unit_id="cell0-unit0",
        revision="r1",
        rank=2,
        world_size=4,
        dist_host="10.1.0.10",
        dist_port=29500,
        members=members,
    )
    got = plan_member(membership, instance_type="trn1.32xlarge", model=load_model_shape(model_dir), model_dir=model_dir)
    assert got.rank == 2 and got.role == "follower" and got.start_rank_id == 64
    assert got.env["NEURON_RANK_ID"] == "2"
    assert got.env["NEURON_RT_ROOT_COMM_ID"] == "10.1.0.10:29501"
    assert got.env["MASTER_ADDR"] == "10.1.0.10"
    assert got.nxdi_config["tp_degree"] == 128


def test_single_node_unit_has_no_multi_node_wiring(checkpoint):
    model_dir = str(checkpoint("llama-3-8b"))
    plan = plan_unit(
        leader_host=LEADER,
        nodes=1,
        instance_type="trn1.32xlarge",
        model=load_model_shape(model_dir),
        model_dir=model_dir,
    )
    (leader,) = plan.ranks
    assert dict(leader.env) == {
        "VLLM_NEURON_FRAMEWORK": "neuronx-distributed-inference",
        "NEURON_COMPILED_ARTIFACTS": "/var/cache/flotilla/neuron-compiled",
    }
    assert leader.nxdi_config["tp_degree"] == 32
    assert leader.nxdi_config["start_rank_id"] == 0


def test_the_gloo_port_comes_from_rendezvous(checkpoint):
    model_dir = str(checkpoint("llama-3.1-70b"))
    membership = Membership(unit_id="u", revision="r", rank=1, world_size=2, dist_host="10.1.0.10", dist_port=29555)
    got = plan_member(membership, instance_type="trn1.32xlarge", model=load_model_shape(model_dir), model_dir=model_dir)
    assert (got.env["MASTER_ADDR"], got.env["MASTER_PORT"]) == ("10.1.0.10", "29555")


def test_launch_spec_lets_the_plan_override_inherited_neuron_variables(checkpoint):
    from runtime.engines.neuron.engine import NeuronEngine, NeuronEngineSettings
    from runtime.engines.neuron.prepare import launch_spec

    model_dir = str(checkpoint("llama-3.1-70b"))
    plan = plan_unit(
        leader_host=LEADER,
        nodes=2,
        instance_type="trn1.32xlarge",
        model=load_model_shape(model_dir),
        model_dir=model_dir,
    )
    argv, env = launch_spec(plan.ranks[1], {"PATH": "/usr/bin", "NEURON_RANK_ID": "7"})
    assert argv == list(plan.ranks[1].command)
    assert env["PATH"] == "/usr/bin" and env["NEURON_RANK_ID"] == "1"
    # Where the leader's own API reaches vLLM (bound to loopback by the leader command above).
    leader = NeuronEngine(
        Membership(unit_id="u", revision="r", rank=0, world_size=2, dist_host=LEADER, dist_port=29500),
        settings=NeuronEngineSettings(
            model_uri="s3://bucket/model/", model_dir=model_dir, instance_type="trn1.32xlarge", options=NeuronOptions()
        ),
        model_name="llama",
        start_timeout_s=1.0,
    )
    assert leader.url == "http://127.0.0.1:8001"
