"""Impossible layouts fail before anything starts, with a message naming the input and the fix."""

from __future__ import annotations

import pytest

from contract.layout import LayoutError
from contract.llama import ShapeError, load_config_json


@pytest.mark.parametrize("instance_type", ["trn1.2xlarge", "trn2.3xlarge", "p5.48xlarge"])
def test_instance_types_outside_the_table_are_refused(unit_plan, instance_type):
    with pytest.raises(
        LayoutError,
        match=rf"--instance-type={instance_type} cannot host a Neuron unit: use one of trn1.32xlarge, trn1n.32xlarge, "
        r"trn2.48xlarge",
    ):
        unit_plan(instance_type=instance_type)


def test_zero_nodes_is_refused(unit_plan):
    with pytest.raises(LayoutError, match=r"--nodes=0 is not a positive integer"):
        unit_plan(nodes=0)


def test_sequence_longer_than_the_models_positions_is_refused(unit_plan):
    with pytest.raises(
        LayoutError,
        match=r"--seq-len=8193 exceeds the max_position_embeddings=8192 of .*: give at most 8192",
    ):
        unit_plan("llama-3-8b", seq_len=8193)


# cp_degree / attention_dp_degree reach NxD Inference only on single-node units (multi-node units run
# the documented multi-node layout, tensor parallel only), so their checks run on one trn2.48xlarge.
TRN2 = {"nodes": 1, "instance_type": "trn2.48xlarge"}


def test_multi_node_units_refuse_cp_and_dp_degrees_outside_the_documented_multi_node_layout(unit_plan):
    with pytest.raises(LayoutError, match=r"--cp-degree=2 applies to single-node units only.*cp_degree=1"):
        unit_plan("llama-3.1-405b", nodes=2, cp_degree=2)
    with pytest.raises(LayoutError, match=r"--attention-dp-degree=4 applies to single-node units only"):
        unit_plan("llama-3.1-405b", nodes=4, attention_dp_degree=4)
    assert unit_plan("llama-3.1-405b", nodes=4, cp_degree=1, attention_dp_degree=1).cp_degree == 1


def test_cp_degree_must_divide_the_tp_degree(unit_plan):
    with pytest.raises(LayoutError, match=r"--cp-degree=3 does not divide tp_degree=64 on 1 x trn2.48xlarge"):
        unit_plan(cp_degree=3, **TRN2)


def test_attention_dp_degree_must_divide_the_tp_degree(unit_plan):
    with pytest.raises(LayoutError, match=r"--attention-dp-degree=6 does not divide tp_degree=64"):
        unit_plan(attention_dp_degree=6, **TRN2)


def test_batch_must_split_evenly_over_attention_dp_groups(unit_plan):
    with pytest.raises(
        LayoutError,
        match=r"--batch-size=3 is not a multiple of attention_dp_degree=2.*raise --batch-size to 4",
    ):
        unit_plan("llama-3-8b", cp_degree=2, attention_dp_degree=2, batch_size=3, **TRN2)


def test_attention_dp_degree_must_divide_cp_degree_when_both_are_used(unit_plan):
    with pytest.raises(LayoutError, match=r"--attention-dp-degree=8 does not divide cp_degree=4"):
        unit_plan("llama-3-8b", cp_degree=4, attention_dp_degree=8, **TRN2)


def test_sequence_must_split_evenly_over_context_parallel_ranks(unit_plan):
    with pytest.raises(
        LayoutError,
        match=r"--seq-len=4095 is not a multiple of cp_degree=2.*use --seq-len 4094",
    ):
        unit_plan("llama-3-8b", cp_degree=2, attention_dp_degree=2, seq_len=4095, **TRN2)


def test_prefill_attention_over_more_ranks_than_heads_names_the_cp_degrees_that_fit(unit_plan):
    # Llama-3-8B on trn2: 64 ranks for 32 query heads would pad every other rank's head.
    # Groups of 32, 16, ... ranks fit: cp_degree 2, 4, 8, 16, 32, 64.
    with pytest.raises(
        LayoutError,
        match=r"--cp-degree=1 leaves 64 ranks to share prefill attention.*"
        r"num_attention_heads=32 / num_key_value_heads=8.*"
        r"use --cp-degree one of \[2, 4, 8, 16, 32, 64\]",
    ):
        unit_plan("llama-3-8b", cp_degree=1, attention_dp_degree=2, **TRN2)


def test_decode_attention_over_more_ranks_than_heads_names_the_dp_degrees_that_fit(unit_plan):
    # Llama-3-8B on trn2: groups of 32 or fewer ranks fit the heads; batch 8 rules out 16 and up,
    # and cp_degree 4 allows only its divisors.
    with pytest.raises(
        LayoutError,
        match=r"--attention-dp-degree=1 leaves 64 ranks to share decode attention"
        r".*use --attention-dp-degree one of \[2, 4, 8\]",
    ):
        unit_plan("llama-3-8b", cp_degree=4, attention_dp_degree=1, **TRN2)


@pytest.mark.parametrize(
    "config, instance_type, cp, dp",
    [
        # 64 query heads fit 32 (trn1) and 64 (trn2) cores as they are.
        ("llama-3.1-70b", "trn1.32xlarge", 1, 1),
        ("llama-3.1-70b", "trn2.48xlarge", 1, 1),
        # 32 query heads: groups of at most 32 ranks, so degree 2 on trn2's 64 cores.
        ("llama-3-8b", "trn1.32xlarge", 1, 1),
        ("llama-3-8b", "trn2.48xlarge", 2, 2),
        # 405B's 128 heads: two per rank on trn2.
        ("llama-3.1-405b", "trn2.48xlarge", 1, 1),
    ],
)
def test_auto_degrees_are_the_smallest_that_split_heads_evenly(unit_plan, config, instance_type, cp, dp):
    plan = unit_plan(config, nodes=1, instance_type=instance_type)
    assert (plan.cp_degree, plan.attention_dp_degree) == (cp, dp)
    layout = plan.to_dict()["parallelism"]
    heads = load_config_json(plan.model_dir).num_attention_heads
    assert layout["prefill"]["q_heads_per_rank"] == heads * cp // plan.tp_degree
    assert layout["prefill"]["kv_heads_per_rank"] == 1  # 8 KV heads replicated over >= 8 ranks


def test_auto_dp_that_needs_a_bigger_batch_says_so(unit_plan):
    # SmolLM2: 9 query / 3 KV heads. On 32 cores only groups of 1 rank fit -> degree 32 > batch 8.
    with pytest.raises(
        LayoutError,
        match=r"--batch-size=8 leaves no attention_dp_degree .*: raise --batch-size to a multiple of 32",
    ):
        unit_plan("smollm2-135m", nodes=1)


def test_a_model_whose_heads_do_not_split_over_the_units_cores_is_refused_naming_the_fix(unit_plan):
    # tp_degree is every node's NeuronCores: 9 heads split over no multiple of 32.
    with pytest.raises(
        LayoutError,
        match=r"--nodes=2 cannot serve .* on trn1.32xlarge: tp_degree=64 \(2 x 32 NeuronCores\) does not split "
        r"num_attention_heads=9 .*: use another instance type",
    ):
        unit_plan("smollm2-135m", nodes=2)
    # 70B's 64 heads split over 1 node (32 cores) or 2 (64), not 4 (128); at batch 8 x 4096 it fits one node.
    with pytest.raises(
        LayoutError, match=r"--nodes=4 cannot serve .*tp_degree=128 .* num_attention_heads=64 .*: use --nodes 1 or 2$"
    ):
        unit_plan("llama-3.1-70b", nodes=4)


def test_mlp_that_does_not_split_over_tp_is_refused(checkpoint, unit_plan):
    with pytest.raises(LayoutError, match=r"tp_degree=64 .* intermediate_size=28004\) evenly"):
        unit_plan(checkpoint("llama-3.1-70b", intermediate_size=28004), nodes=2)


@pytest.mark.parametrize("value", [0, -2, "two", True])
def test_degrees_must_be_positive_integers_or_auto(unit_plan, value):
    with pytest.raises(LayoutError, match=r"--cp-degree=.* is not a degree: give a positive integer or 'auto'"):
        unit_plan(cp_degree=value)


def test_a_directory_without_config_json_is_named_with_the_fix(tmp_path):
    with pytest.raises(
        ShapeError,
        match=r"config.json: not found; a checkpoint directory "
        r"must hold",
    ):
        load_config_json(tmp_path)


def test_a_config_missing_shape_fields_names_them(checkpoint):
    model_dir = checkpoint({"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64})
    with pytest.raises(
        ShapeError,
        match=r"missing intermediate_size, vocab_size, "
        r"max_position_embeddings",
    ):
        load_config_json(model_dir)


def test_kv_heads_default_to_attention_heads_for_mha_checkpoints(checkpoint):
    raw = {
        k: v
        for k, v in {
            "num_hidden_layers": 2,
            "num_attention_heads": 32,
            "hidden_size": 4096,
            "intermediate_size": 11008,
            "vocab_size": 32000,
            "max_position_embeddings": 4096,
        }.items()
    }
    assert load_config_json(checkpoint(raw)).num_key_value_heads == 32
