"""The follower script refuses to run where it cannot, and stays runnable by the multi-node image's
Python: 3.10 syntax, standard library and vLLM imports only (it runs outside the flotilla package)."""

from __future__ import annotations

import ast
import builtins
import sys
from pathlib import Path

from runtime.engines.neuron import worker
from runtime.engines.neuron.launch import WORKER_SCRIPT

SOURCE = Path(WORKER_SCRIPT).read_text()


def test_follower_loop_refuses_rank_0(monkeypatch, capsys):
    monkeypatch.setenv("NEURON_RANK_ID", "0")
    assert worker.main([]) == 2
    assert "the follower loop runs on ranks 1..N-1" in capsys.readouterr().err


def test_follower_loop_without_vllm_names_the_multi_node_image(monkeypatch, capsys):
    monkeypatch.setenv("NEURON_RANK_ID", "1")
    real_import = builtins.__import__

    def no_vllm(name, *args, **kwargs):
        if name.startswith("vllm"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_vllm)
    assert worker.main([]) == 2
    assert "runtime/Dockerfile.neuron-multinode" in capsys.readouterr().err


def test_the_script_parses_as_python_3_10():
    # The 0.7.2 image's Python is 3.10 (deep-learning-containers@2.24.1 Dockerfile.neuronx:10-11).
    ast.parse(SOURCE, feature_version=(3, 10))


def test_the_script_imports_only_the_standard_library_and_vllm():
    names = set()
    for node in ast.walk(ast.parse(SOURCE)):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            names.add((node.module or "").split(".")[0])
    assert names - {"vllm"} <= set(sys.stdlib_module_names), names
    assert "vllm" in names
