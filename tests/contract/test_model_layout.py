"""The model's shape (contract/llama.py) and the one layout-and-memory check (contract/layout.py) that
the node, `python -m runtime plan` and synth all run."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from contract.layout import LayoutError, check_layout, serving_nodes
from contract.llama import PRESETS, LlamaShape, ShapeError, load_config_json, preset

REPO = Path(__file__).resolve().parents[2]
GIB = 2**30


def _meta_mlp_width(dim: int, multiplier: float, multiple_of: int) -> int:
    """Meta's FeedForward width: 4 x dim, two thirds of it, times ffn_dim_multiplier, rounded up to a
    multiple of multiple_of (meta-llama/llama-models, models/llama3/reference_impl/model.py)."""
    hidden = int(2 * 4 * dim / 3)
    hidden = int(multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


@pytest.mark.parametrize(
    "name, dim, layers, heads, multiplier, multiple_of",
    [
        # Meta's model_args for Llama 3.1 (models/sku_list.py at 084b88e9): kv heads 8, vocab 128256.
        ("llama-3.1-8b", 4096, 32, 32, 1.3, 1024),
        ("llama-3.1-70b", 8192, 80, 64, 1.3, 4096),
        ("llama-3.1-405b", 16384, 126, 128, 1.2, 4096),
    ],
)
def test_llama_presets_are_metas_model_arguments(name, dim, layers, heads, multiplier, multiple_of):
    shape = PRESETS[name]
    assert (shape.hidden_size, shape.num_hidden_layers, shape.num_attention_heads) == (dim, layers, heads)
    assert (shape.num_key_value_heads, shape.vocab_size, shape.head_dim) == (8, 128256, dim // heads)
    assert shape.intermediate_size == _meta_mlp_width(dim, multiplier, multiple_of)
    assert (shape.max_position_embeddings, shape.dtype, shape.tie_word_embeddings) == (131072, "bfloat16", False)


def test_the_405b_preset_equals_the_config_json_meta_publishes():
    published = load_config_json(REPO / "tests" / "neuron" / "models" / "llama-3.1-405b" / "config.json")
    assert published == PRESETS["llama-3.1-405b"]


def test_instruct_names_and_case_reach_the_base_models_preset():
    assert preset("Llama-3.1-8B-Instruct") is PRESETS["llama-3.1-8b"]
    assert preset("smollm2-135m-instruct") is PRESETS["smollm2"]
    assert preset("my-finetune") is None


def test_a_config_without_the_shape_fields_names_them_and_where_it_came_from():
    with pytest.raises(ShapeError, match=r"^model\.shape: missing intermediate_size, vocab_size"):
        LlamaShape.from_config(
            {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64, "max_position_embeddings": 9},
            source="model.shape",
        )
    with pytest.raises(ShapeError, match=r"num_attention_heads=6 is not a multiple of num_key_value_heads=4"):
        LlamaShape.from_config(
            {**PRESETS["tiny"].as_dict(), "num_attention_heads": 6, "num_key_value_heads": 4}, source="x"
        )
    with pytest.raises(ShapeError, match=r"num_hidden_layers=0 must be a positive integer"):
        LlamaShape.from_config({**PRESETS["tiny"].as_dict(), "num_hidden_layers": 0}, source="x")


def test_llama_8b_on_two_trn1_nodes_is_refused_naming_the_unit_size_that_serves():
    # 2 x 32 NeuronCores = tp_degree 64 > 32 query heads: NxD Inference would pad heads.
    with pytest.raises(LayoutError) as err:
        check_layout(PRESETS["llama-3.1-8b"], instance_type="trn1.32xlarge", nodes=2, model="llama-3.1-8b-instruct")
    assert str(err.value) == (
        "--nodes=2 cannot serve llama-3.1-8b-instruct on trn1.32xlarge: tp_degree=64 (2 x 32 NeuronCores) does not "
        "split num_attention_heads=32 (num_key_value_heads=8, intermediate_size=14336) evenly: use --nodes 1"
    )
    assert err.value.setting == "nodes"


def test_the_same_refusal_speaks_the_callers_names_for_its_inputs():
    with pytest.raises(LayoutError) as err:
        check_layout(PRESETS["llama-3.1-8b"], instance_type="trn1.32xlarge", nodes=2, names={"nodes": "nodes_per_unit"})
    assert str(err.value).startswith("nodes_per_unit=2 cannot serve the model on trn1.32xlarge")
    assert str(err.value).endswith(": use nodes_per_unit 1")


def test_405b_does_not_fit_one_trn1_node_and_fits_four():
    # A trn1.32xlarge has 16 chips x 32 GiB = 512 GiB of device memory (contract/trainium.py); 405B's
    # 405,853,388,800 bfloat16 parameters are 756 GiB before any KV cache.
    shape = PRESETS["llama-3.1-405b"]
    assert shape.params * 2 / GIB > 512
    with pytest.raises(
        LayoutError, match=r"^--nodes=1 cannot hold .* > 14\.40 GiB usable per NeuronCore .*: use --nodes 4"
    ):
        check_layout(shape, instance_type="trn1.32xlarge", nodes=1)
    four = check_layout(shape, instance_type="trn1.32xlarge", nodes=4)
    assert four.tp_degree == 128 and four.memory is not None and four.memory.fits
    # 128 query heads, one per NeuronCore; MLP 53248 / 128 = 416 columns each.
    assert shape.num_attention_heads % four.tp_degree == 0 and shape.intermediate_size % four.tp_degree == 0


def test_the_unit_sizes_that_serve_each_preset_on_trn1():
    # tp_degree = 32 x nodes must divide the query heads (32, 64, 128) and the MLP; 405B needs the memory
    # of more than 2 nodes at batch 8 x 4096 (14.64 GiB per NeuronCore on 2 > 14.40 usable).
    assert serving_nodes(PRESETS["llama-3.1-8b"], instance_type="trn1.32xlarge") == (1,)
    assert serving_nodes(PRESETS["llama-3.1-70b"], instance_type="trn1.32xlarge") == (1, 2)
    assert serving_nodes(PRESETS["llama-3.1-405b"], instance_type="trn1.32xlarge") == (4,)
    assert serving_nodes(PRESETS["llama-3.1-405b"], instance_type="trn1.32xlarge", batch_size=4) == (2, 4)


def test_the_memory_arithmetic_per_neuroncore_for_405b_on_four_nodes():
    # KV projections 126 x 2 x 16384 x 8 x 128 = 4,227,858,432 parameters, replicated one KV head per
    # core past 8 cores (126 x 2 x 16384 x 128 = 528,482,304 each); the rest shards over 128 cores.
    shape = PRESETS["llama-3.1-405b"]
    layout = check_layout(shape, instance_type="trn1.32xlarge", nodes=4)
    rest = math.ceil((405_853_388_800 - 4_227_858_432) / 128)
    assert layout.memory.weights == (rest + 528_482_304) * 2
    # KV cache per token per core: 126 layers x (k, v) x 1 head x 128 x 2 B; 8 x 4096 tokens.
    assert layout.memory.kv_cache == 8 * 4096 * 126 * 2 * 128 * 2


def test_the_reference_engine_needs_a_layer_per_rank():
    check_layout(PRESETS["tiny"], engine="reference", instance_type="m6i.large", nodes=4)
    with pytest.raises(LayoutError, match=r"^--nodes=5 cannot serve .* at least one of its 4 layers: use at most 4"):
        check_layout(PRESETS["tiny"], engine="reference", instance_type="m6i.large", nodes=5)
