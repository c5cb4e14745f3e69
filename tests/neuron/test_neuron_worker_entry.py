"""The follower entry point refuses to run where it cannot: on rank 0, or without vLLM."""

from __future__ import annotations

import builtins

from runtime.engines.neuron import worker


def test_follower_loop_refuses_rank_0(monkeypatch, capsys):
    monkeypatch.setenv("NEURON_RANK_ID", "0")
    assert worker.main([]) == 2
    assert "the follower loop runs on ranks 1..N-1" in capsys.readouterr().err


def test_follower_loop_without_vllm_names_the_neuron_image(monkeypatch, capsys):
    monkeypatch.setenv("NEURON_RANK_ID", "1")
    real_import = builtins.__import__

    def no_vllm(name, *args, **kwargs):
        if name.startswith("vllm"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_vllm)
    assert worker.main([]) == 2
    assert "runtime/Dockerfile.neuron" in capsys.readouterr().err
