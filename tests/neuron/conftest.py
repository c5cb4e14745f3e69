"""Fake checkpoint directories (config.json only) with real Llama shapes for the neuron tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from llama_shapes import LLAMA_3_8B, LLAMA_31_70B, LLAMA_31_405B, SHAPES, SMOLLM2_135M  # noqa: F401


@pytest.fixture
def checkpoint(tmp_path):
    """checkpoint(shape name or config dict, **overrides) -> a directory holding config.json."""
    made = []

    def make(config: str | dict, **overrides):
        raw = dict(SHAPES[config] if isinstance(config, str) else config, **overrides)
        path = tmp_path / f"model{len(made)}"
        path.mkdir()
        (path / "config.json").write_text(json.dumps(raw))
        made.append(path)
        return path

    return make


@pytest.fixture
def unit_plan(checkpoint):
    """unit_plan(config, nodes=, instance_type=, **options) -> plan_unit's plan for a unit of `nodes`
    `instance_type` instances led by 10.1.0.10, serving the checkpoint of `config` (as checkpoint takes
    it, or a checkpoint directory already made) with NeuronOptions(**options)."""
    from contract.llama import load_config_json
    from runtime.engines.neuron import NeuronOptions, plan_unit

    def plan(config="llama-3.1-70b", *, nodes: int = 2, instance_type: str = "trn1.32xlarge", **options):
        model_dir = str(config if isinstance(config, Path) else checkpoint(config))
        return plan_unit(
            leader_host="10.1.0.10",
            nodes=nodes,
            instance_type=instance_type,
            model=load_config_json(model_dir),
            model_dir=model_dir,
            options=NeuronOptions(**options),
        )

    return plan
