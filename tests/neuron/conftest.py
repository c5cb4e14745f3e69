"""Fake checkpoint directories (config.json only) with real Llama shapes for the neuron tests."""

from __future__ import annotations

import json

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
