"""The capacity planner against cases computed by hand (arithmetic in the comments), and the clear
errors it gives for inputs no unit can serve.

Hardware figures used below (docs/hardware.md): trn1.32xlarge = 16 chips x 2 NeuronCores = 32
cores; 32 GiB HBM per chip -> 16 GiB = 17,179,869,184 B per core; 820 GiB/s per chip -> 410 GiB/s =
440,234,147,840 B/s per core; 190 TFLOPS BF16 per chip -> 3,040e12 per node; EFA 800 Gbps = 1e11
B/s (trn1n: 1600 Gbps = 2e11 B/s). Default HBM reserve 10 %: usable 15,461,882,265.6 B per core.
"""

from __future__ import annotations

import json

import pytest

from contract.llama import SMOLLM2
from ops.capacity import (
    PlanError,
    PlanModel,
    PlanSettings,
    Traffic,
    model_from_config_json,
    model_from_flags,
    plan,
)

USABLE = 17_179_869_184 * 0.9
HBM_PER_CORE_BPS = 440_234_147_840
NODE_FLOPS = 3_040e12
EFA_TRN1 = 1e11


def llama70b(**kw) -> PlanModel:
    return model_from_flags(
        layers=80,
        hidden=8192,
        heads=64,
        kv_heads=8,
        intermediate=28672,
        vocab=128256,
        context_length=8192,
        name="llama-70b",
        **kw,
    )


def llama405b(**kw) -> PlanModel:
    return model_from_flags(
        layers=126,
        hidden=16384,
        heads=128,
        kv_heads=8,
        intermediate=53248,
        vocab=128256,
        context_length=131072,
        name="llama-405b",
        **kw,
    )


def test_parameter_count_from_shape_matches_llama_3_70b():
    # per layer: q 8192*8192 = 67,108,864; k+v 2*8192*1024 = 16,777,216; o 67,108,864;
    # mlp 3*8192*28672 = 704,643,072; norms 2*8192 = 16,384 -> 855,654,400; x80 = 68,452,352,000
    # embeddings + lm_head (untied) 2*128256*8192 = 2,101,346,304; final norm 8,192
    assert llama70b().total_params == 70_553_706_496


def test_parameter_count_from_shape_matches_llama_3_1_405b():
    # per layer: q,o 2*16384^2 = 536,870,912; k+v 2*16384*1024 = 33,554,432;
    # mlp 3*16384*53248 = 2,617,245,696; norms 32,768 -> 3,187,703,808; x126 = 401,650,679,808
    # embeddings + lm_head 2*128256*16384 = 4,202,692,608; final norm 16,384
    assert llama405b().total_params == 405_853_388_800


def test_70b_fits_one_node_and_needs_four_units_for_ten_requests_per_second():
    """Llama-3-70B, bf16, batch 8, 1000 prompt + 200 output tokens, 10 req/s, trn1.32xlarge.

    1 node: tp_degree 32; 64 heads / 32 = 2 per core; 8 KV heads < 32 -> replicated, 1 per core.
    KV projections: 80*2*8192*8*128 = 1,342,177,280 params; the rest 69,211,529,216 / 32 =
    2,162,860,288; plus one KV head's k/v projections per core 80*2*8192*128 = 167,772,160
    -> 2,330,632,448 params * 2 B = 4,661,264,896 B of weights per core.
    KV cache per token per core: 80 layers * 2 (k,v) * 1 head * 128 * 2 B = 40,960 B;
    8 sequences * 1200 tokens -> 393,216,000 B. Total 5,054,480,896 B <= 15,461,882,265.6 usable.
    Decode step: weights + 8 * (1000 + 200/2) * 40,960 = 4,661,264,896 + 360,448,000
    = 5,021,712,896 B / 440,234,147,840 B/s = 11.4069 ms; one node -> no EFA traffic.
    Prefill: 2 * 70,553,706,496 * 1000 / 3,040e12 = 46.4169 ms.
    Per request: 46.4169 + 200 * 11.4069 / 8 = 331.59 ms of unit time -> 3.0158 req/s per unit;
    10 / 3.0158 = 3.32 -> 4 units.
    """
    p = plan(llama70b(), Traffic(requests_per_s=10, prompt_tokens=1000, output_tokens=200), PlanSettings(batch=8))
    assert (p.nodes_per_unit, p.tp_degree) == (1, 32)
    assert p.prefill_efa_s == 0  # one node: context encoding's all-reduces stay on the node
    assert (p.q_heads_per_core, p.kv_heads_per_core) == (2, 1)
    assert p.memory.weights == 4_661_264_896
    assert p.memory.kv_cache == 393_216_000
    assert p.decode_hbm_s == pytest.approx(5_021_712_896 / HBM_PER_CORE_BPS)
    assert p.decode_hbm_s == pytest.approx(0.0114069, rel=1e-5)
    assert p.decode_efa_s == 0
    assert p.prefill_compute_s == pytest.approx(0.0464169, rel=1e-5)
    assert p.requests_per_s_per_unit == pytest.approx(3.0158, rel=1e-4)
    assert p.units == 4
    # units_per_cell stays the config's default (20) unless asked: it is fixed once deployed
    assert p.config() == {
        "instance_type": "trn1.32xlarge",
        "nodes_per_unit": 1,
        "units": 4,
        "node": {"neuron_seq_len": 1200, "neuron_batch_size": 8},  # what the memory above was sized at
    }


def test_405b_needs_two_nodes_and_pays_efa_for_the_all_reduces_of_both_phases():
    """Llama-3.1-405B, bf16, batch 4, 1536 prompt + 512 output tokens (seq_len 2048), 2 req/s.

    1 node: rest (405,853,388,800 - 4,227,858,432 KV proj) / 32 = 12,550,797,824 + 126*2*16384*128
    = 528,482,304 -> 13,079,280,128 params = 26.2e9 B > 15.46e9 usable: too small.
    2 nodes: tp_degree 64 (128 heads -> 2 per core, 8 KV heads replicated -> 1 per core):
    401,625,530,368 / 64 = 6,275,398,912 + 528,482,304 = 6,803,881,216 params = 13,607,762,432 B;
    KV per token per core 126*2*128*2 = 64,512 B; 4 * 2048 * 64,512 = 528,482,304 B; fits.
    Decode HBM: 13,607,762,432 + 4 * (1536 + 256) * 64,512 = 14,070,184,448 B -> 31.9607 ms.
    Decode EFA: 2 all-reduces/layer of 4*16384*2 = 131,072 B; ring moves 2*(1/2) of it per node:
    126 * 2 * 131,072 = 33,030,144 B / 1e11 B/s = 0.33030 ms.
    Prefill compute: 2 * 405,853,388,800 * 1536 / (2 * 3,040e12) = 205.063 ms. Context encoding is
    tensor parallel over the same 64 cores (NxD Inference across nodes: cp_degree 1): 2 all-reduces
    per layer of 1536*16384*2 = 50,331,648 B, a ring moves 2*(1/2) of it per node: 126 * 2 *
    50,331,648 = 12,683,575,296 B / 1e11 = 126.836 ms; no KV re-shard (decode reads the KV cache
    where context encoding wrote it).
    Per request: 331.899 + 512 * 32.2910 / 4 = 4465.14 ms -> 0.223957 req/s; 2 / 0.223957 = 8.93 -> 9.
    First token: 331.899 + 32.2910 = 364.190 ms.
    """
    p = plan(llama405b(), Traffic(requests_per_s=2, prompt_tokens=1536, output_tokens=512), PlanSettings(batch=4))
    assert (p.nodes_per_unit, p.tp_degree) == (2, 64)
    assert p.memory.weights == 13_607_762_432
    assert p.memory.kv_cache == 528_482_304
    assert p.decode_hbm_s == pytest.approx(0.0319607, rel=1e-5)
    assert p.decode_efa_s == pytest.approx(33_030_144 / EFA_TRN1)
    assert p.prefill_compute_s == pytest.approx(0.205063, rel=1e-5)
    assert p.prefill_efa_s == pytest.approx(12_683_575_296 / EFA_TRN1)
    assert p.ttft_s == pytest.approx(0.364190, rel=1e-5)
    assert p.requests_per_s_per_unit == pytest.approx(0.223957, rel=1e-5)
    assert p.units == 9
    assert "1 nodes" in p.skipped[0]


def test_trn1n_halves_the_efa_time_of_the_same_unit():
    # Same 405B unit on trn1n.32xlarge: 1600 Gbps = 2e11 B/s -> 33,030,144 / 2e11 = 0.16515 ms.
    p = plan(
        llama405b(),
        Traffic(requests_per_s=2, prompt_tokens=1536, output_tokens=512),
        PlanSettings(batch=4, instance_type="trn1n.32xlarge"),
    )
    assert p.decode_efa_s == pytest.approx(33_030_144 / 2e11)


def test_node_counts_whose_tp_degree_does_not_divide_the_heads_are_skipped():
    """405B with batch 16: 2 nodes need 13,607,762,432 + 16*2048*64,512 = 15,721,691,648 B > usable;
    3 nodes give tp_degree 96, which does not divide 128 heads; 4 nodes (tp_degree 128) it is."""
    p = plan(llama405b(), Traffic(requests_per_s=1, prompt_tokens=1536, output_tokens=512), PlanSettings(batch=16))
    assert p.nodes_per_unit == 4
    assert p.tp_degree == 128
    assert any("tp_degree 96 does not divide 128 heads" in s for s in p.skipped)


def test_efficiency_derates_units_and_cells_follow_units_per_cell():
    # 70B case at efficiency 0.5: 1.5079 req/s per unit -> 100 / 1.5079 = 66.3 -> 67 units;
    # 20 units per cell -> 4 cells; 67 nodes.
    p = plan(
        llama70b(),
        Traffic(requests_per_s=100, prompt_tokens=1000, output_tokens=200),
        PlanSettings(batch=8, efficiency=0.5),
    )
    assert p.units == 67
    assert p.cells == 4
    assert p.total_nodes == 67
    assert "units_per_cell" not in p.config()
    asked = plan(
        llama70b(),
        Traffic(requests_per_s=100, prompt_tokens=1000, output_tokens=200),
        PlanSettings(batch=8, efficiency=0.5, units_per_cell=10),
    )
    assert asked.cells == 7 and asked.config()["units_per_cell"] == 10


def test_smollm2_heads_cannot_be_split_over_32_cores_without_padding():
    model = PlanModel(shape=SMOLLM2)  # 30 layers, hidden 576, 9 query / 3 KV heads, 8192 positions
    traffic = Traffic(requests_per_s=1, prompt_tokens=100, output_tokens=100)
    with pytest.raises(
        PlanError, match=r"^--heads=9 fits no unit of model on 1\.\.8 .*9 heads and 3 KV heads.*: use --pad-heads"
    ):
        plan(model, traffic, PlanSettings())
    padded = plan(model, traffic, PlanSettings(pad_heads=True))
    assert (padded.nodes_per_unit, padded.q_heads_per_core, padded.kv_heads_per_core) == (1, 1, 1)


def test_a_model_too_large_for_max_nodes_names_the_memory_it_needs_and_the_fixes():
    with pytest.raises(
        PlanError,
        match=r"^--max-nodes=2 fits no unit of .* on 1\.\.2 trn1\.32xlarge nodes .*: "
        r"the least it needs is .* GiB per NeuronCore; raise --max-nodes",
    ):
        # 2 nodes: 13,607,762,432 B of weights + 64 * 5000 * 64,512 = 20,643,840,000 B of KV cache
        plan(
            llama405b(),
            Traffic(requests_per_s=1, prompt_tokens=4000, output_tokens=1000),
            PlanSettings(max_nodes=2, batch=64),
        )


def test_requests_longer_than_the_context_are_refused():
    with pytest.raises(
        PlanError,
        match="^--prompt-tokens=8000 with --output-tokens 500 exceeds the model's context length 8192: shorten",
    ):
        plan(llama70b(), Traffic(requests_per_s=1, prompt_tokens=8000, output_tokens=500), PlanSettings())
    with pytest.raises(
        PlanError, match="^--seq-len=10000 exceeds the model's context length 8192: give at most 8192, or drop it$"
    ):
        plan(llama70b(), Traffic(requests_per_s=1, prompt_tokens=100, output_tokens=100), PlanSettings(seq_len=10000))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(layers=0), "--layers=0 is out of range: give a number above 0"),
        (dict(heads=64, kv_heads=7), "--heads=64 is not a multiple of --kv-heads 7 (grouped-query attention"),
        (dict(hidden=8200, heads=64, kv_heads=8), "--hidden=8200 is not divisible by --heads 64: give --head-dim"),
        (dict(dtype="bf17"), "--dtype=bf17 is not known: use one of float32"),
    ],
)
def test_inconsistent_model_shapes_are_refused_with_the_flag_to_fix(kwargs, message):
    base = dict(layers=80, hidden=8192, heads=64, kv_heads=8, context_length=8192, params=70_000_000_000)
    with pytest.raises(PlanError) as err:
        model_from_flags(**{**base, **kwargs})
    assert str(err.value).startswith(message) and "\n" not in str(err.value)  # contract.bad_input's one line


def test_a_shape_without_the_mlp_width_and_vocabulary_asks_for_them():
    # The layout check needs intermediate_size (the MLP must split over tp_degree), and the parameter
    # count needs both: --params alone no longer describes a model.
    with pytest.raises(
        PlanError,
        match="^--intermediate is not given: the layout check needs the MLP width and the vocabulary: "
        "give --intermediate and --vocab, or describe the model with --config-json PATH or --preset$",
    ):
        model_from_flags(layers=2, hidden=64, heads=4, kv_heads=4, context_length=128, params=1_000_000)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            dict(units_per_cell=21),
            r"^--units-per-cell=21 is out of range: give an integer from 1 to 20 \(ECS allows 20 .*\)$",
        ),
        (dict(efficiency=0), r"^--efficiency=0 is out of range: give a number above 0, at most 1 \(a fraction\)$"),
        (
            dict(hbm_reserve=1),
            r"^--hbm-reserve=1 is out of range: give a number of at least 0, below 1 \(a fraction\)$",
        ),
        (dict(instance_type="trn1.2xlarge"), r"^--instance-type=trn1\.2xlarge is not supported: use one of .*EFA"),
        (dict(batch=0), "^--batch-size=0 is out of range: give a number above 0$"),
    ],
)
def test_impossible_settings_are_refused(kwargs, message):
    with pytest.raises(PlanError, match=message):
        PlanSettings(**kwargs)


def test_config_json_of_a_llama_checkpoint_gives_the_same_plan_as_flags(tmp_path):
    cfg = {
        "num_hidden_layers": 80,
        "hidden_size": 8192,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "intermediate_size": 28672,
        "vocab_size": 128256,
        "max_position_embeddings": 8192,
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": False,
    }
    (tmp_path / "llama-70b").mkdir()
    path = tmp_path / "llama-70b" / "config.json"
    path.write_text(json.dumps(cfg))
    model = model_from_config_json(path)
    assert model.name == "llama-70b"
    assert model.total_params == 70_553_706_496
    # a flag overrides the file
    assert model_from_config_json(path, context_length=4096).context_length == 4096


def test_config_json_without_the_layer_count_names_the_key_and_the_flag(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"hidden_size": 64}))
    with pytest.raises(
        PlanError, match=r"^--config-json=\S+ is not a usable config\.json \(\S+: missing num_hidden_layers, "
    ):
        model_from_config_json(path)
    with pytest.raises(
        PlanError, match=r"^--config-json=\S+missing\.json is not a file: give the path of the model's config\.json$"
    ):
        model_from_config_json(tmp_path / "missing.json")


def test_a_unit_that_fits_one_node_is_single_node_on_the_v1_plugin_image_and_says_why():
    # Same 70B case as above: 5,054,480,896 B = 4.71 GiB per core <= 14.40 GiB usable on one node.
    p = plan(llama70b(), Traffic(requests_per_s=10, prompt_tokens=1000, output_tokens=200), PlanSettings(batch=8))
    assert (p.nodes_per_unit, p.mode) == (1, "single-node")
    assert p.image.dockerfile == "runtime/Dockerfile.neuron"
    # deep-learning-containers@2.28.0 README.md:78; SDK 2.28 is the last whose NxD Inference runs on trn1.
    assert p.image.base_image.endswith(":0.13.0-neuronx-py312-sdk2.28.0-ubuntu24.04")
    assert p.why.startswith("fits one trn1.32xlarge: 4.71 GiB per NeuronCore (weights 4.34 + KV cache 0.37")


def test_a_unit_that_must_span_nodes_names_the_nxd_inference_image_and_why():
    # Same 405B case as above: one node needs 26,158,560,256 B of weights + 528,482,304 B of KV cache
    # = 26,687,042,560 B = 24.85 GiB per core > 14.40 GiB usable.
    p = plan(llama405b(), Traffic(requests_per_s=2, prompt_tokens=1536, output_tokens=512), PlanSettings(batch=4))
    assert (p.nodes_per_unit, p.mode) == (2, "multi-node")
    assert p.image.dockerfile == "runtime/Dockerfile.neuron-multinode"
    # Multi-node units run NxD Inference from the SDK 2.28 container (deep-learning-containers@2.28.0
    # vllm/inference/0.13.0/Dockerfile.neuronx:166), split over both nodes' 64 NeuronCores.
    assert p.image.base_image.endswith(":0.13.0-neuronx-py312-sdk2.28.0-ubuntu24.04")
    assert p.why.startswith("does not fit one trn1.32xlarge (24.85 GiB per NeuronCore > 14.40 GiB usable)")
    assert "NxD Inference tp_degree=64, one start_rank_id per node" in p.why


def test_405b_fits_one_trn2_48xlarge_as_aws_serves_it():
    """AWS's tutorial serves Llama 3.1 405B on one trn2.48xlarge with vLLM: tensor_parallel_size=64,
    max_num_seqs=1, max_model_len=2048 (aws-neuron-sdk libraries/nxd-inference/tutorials/
    trn2-llama3.1-405b-tutorial.rst:6-13, 161-205).

    trn2.48xlarge (trn2-arch, trainium2, LNC pages): 16 chips x 4 logical NeuronCores = 64 cores;
    96 GiB per chip -> 24 GiB per core, 21.6 GiB usable. 405B over tp 64: 6,803,881,216 params =
    13,607,762,432 B of weights (as in the 2-node trn1 case, same tp); KV 1 * 2048 * 64,512 =
    132,120,576 B; total 13,739,883,008 B = 12.80 GiB <= 21.6 GiB.
    """
    p = plan(
        llama405b(),
        Traffic(requests_per_s=0.1, prompt_tokens=1024, output_tokens=1024),
        PlanSettings(instance_type="trn2.48xlarge", batch=1, seq_len=2048),
    )
    assert (p.nodes_per_unit, p.tp_degree, p.mode) == (1, 64, "single-node")
    assert p.memory.weights == 13_607_762_432 and p.memory.kv_cache == 132_120_576
    assert p.memory.usable == pytest.approx(24 * 2**30 * 0.9)
    assert p.why.startswith("fits one trn2.48xlarge: 12.80 GiB per NeuronCore")
