"""The deployment config's `speculation` section: what each engine runs, refused at synth with the key
and the fix (contract/speculation.py names the pinned stack's rule behind each), and the node's
variables the cell stack sets from it."""

from __future__ import annotations

import pytest

from stacks.config import ConfigError, parse_config
from stacks.speculation import speculation_environment

STAGING = {"instance_type": "m6i.large", "node": {"engine": "reference"}}
TRN1 = {
    "instance_type": "trn1.32xlarge",
    "nodes_per_unit": 1,
    "node": {"engine": "neuron", "neuron_sampling": "device"},
}


def test_off_by_default_and_the_node_is_told_nothing():
    cfg = parse_config(STAGING)
    assert cfg.speculation.method == "none" and speculation_environment(cfg) == {}


def test_prompt_lookup_on_the_reference_engine_and_eagle_on_one_trn1_node():
    ref = parse_config({**STAGING, "speculation": {"method": "ngram", "num_speculative_tokens": 5}})
    assert speculation_environment(ref) == {"FLOTILLA_SPECULATIVE_METHOD": "ngram", "FLOTILLA_SPECULATIVE_TOKENS": "5"}
    eagle = parse_config({**TRN1, "speculation": {"method": "eagle", "draft": "eagle-draft/"}})
    assert speculation_environment(eagle)["FLOTILLA_SPECULATIVE_DRAFT"] == "eagle-draft"


@pytest.mark.parametrize(
    "config, says",
    [
        (
            {**STAGING, "speculation": {"method": "eagle"}},
            "speculation.method='eagle' is not a method engine reference",
        ),
        ({**TRN1, "speculation": {"method": "ngram"}}, "speculation.method='ngram' is not a method engine neuron"),
        (
            {**TRN1, "nodes_per_unit": 2, "speculation": {"method": "eagle", "draft": "d"}},
            "cannot run on a unit of 2 nodes: use nodes_per_unit 1 or method none",
        ),
        (
            {**TRN1, "node": {"engine": "neuron"}, "speculation": {"method": "eagle", "draft": "d"}},
            "needs node.neuron_sampling device",
        ),
        (
            {
                **TRN1,
                "node": {**TRN1["node"], "neuron_prefix_caching_block": 32},
                "speculation": {"method": "eagle3", "draft": "d"},
            },
            "cannot run with prefix caching",
        ),
        ({**TRN1, "speculation": {"method": "eagle"}}, "speculation.draft='' is not a relative directory"),
        ({**TRN1, "speculation": {"method": "eagle", "draft": "../other"}}, "inside the model's artifact directory"),
        (
            {**STAGING, "speculation": {"method": "ngram", "num_speculative_tokens": 0}},
            "is out of range: give an integer from 1 to 16",
        ),
        ({**STAGING, "speculation": {"method": "ngram", "tokens": 4}}, "speculation.tokens='ngram'"[:18]),
    ],
)
def test_a_layout_the_engine_cannot_run_is_refused_naming_the_key_and_the_fix(config, says):
    with pytest.raises(ConfigError) as e:
        parse_config(config)
    assert says in str(e.value)
    assert len(str(e.value).splitlines()) == 1


def test_the_node_refuses_the_same_layouts_naming_its_variables():
    from contract.bad_input import BadInput
    from runtime.node.settings import load_settings
    from runtime.node.speculation import speculation_from_env

    s = load_settings(
        [],
        env={
            "FLOTILLA_ENGINE": "reference",
            "FLOTILLA_MODEL": "tiny",
            "FLOTILLA_PEERS": "127.0.0.1:1",
            "FLOTILLA_RANK": "0",
        },
    )
    assert speculation_from_env({"FLOTILLA_SPECULATIVE_METHOD": "ngram"}, s).method == "ngram"
    with pytest.raises(BadInput, match="FLOTILLA_SPECULATIVE_METHOD=eagle is not a method engine reference runs"):
        speculation_from_env({"FLOTILLA_SPECULATIVE_METHOD": "eagle"}, s)
    with pytest.raises(BadInput, match="FLOTILLA_SPECULATIVE_TOKENS=many is not an integer"):
        speculation_from_env({"FLOTILLA_SPECULATIVE_METHOD": "ngram", "FLOTILLA_SPECULATIVE_TOKENS": "many"}, s)


def test_synth_counts_the_eagle_drafts_memory_and_names_speculation_when_it_does_not_fit():
    from contract.layout import LayoutError, check_layout
    from contract.llama import PRESETS

    def fits(batch: int) -> bool:
        try:
            check_layout(PRESETS["llama-3.1-8b"], instance_type="trn1.32xlarge", nodes=1, batch_size=batch)
        except LayoutError:
            return False
        return True

    edge = 8
    while fits(edge + 8):  # the largest batch that holds the model without a draft
        edge += 8
    node = {**TRN1["node"], "neuron_batch_size": edge}
    config = {**TRN1, "node": node, "model": {"name": "llama-3.1-8b-instruct"}}
    parse_config(config)
    with pytest.raises(ConfigError) as e:
        parse_config({**config, "speculation": {"method": "eagle", "draft": "eagle-draft"}})
    said = str(e.value)
    assert said.startswith("speculation.method='eagle' cannot hold llama-3.1-8b-instruct") and "EAGLE draft" in said
    assert "lower node.neuron_batch_size or node.neuron_seq_len, or set speculation.method none" in said
    half = {**config, "node": {**node, "neuron_batch_size": edge // 2}}
    assert (
        parse_config({**half, "speculation": {"method": "eagle", "draft": "eagle-draft"}}).speculation.method == "eagle"
    )
