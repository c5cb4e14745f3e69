"""The follower script refuses to run where it cannot, and stays runnable by the multi-node image's
Python: 3.10 syntax, standard library and vLLM imports only (it runs outside the flotilla package)."""

from __future__ import annotations

import ast
import builtins
import json
import sys
import types
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


def _fake_fork(monkeypatch, step_error: Exception) -> None:
    """The three fork modules the script imports, with a driver worker whose step raises."""

    class Worker:
        def execute_model(self):
            raise step_error

    class AsyncEngineArgs:
        @staticmethod
        def add_cli_args(parser):
            return parser

        @staticmethod
        def from_cli_args(args):
            return args

    class AsyncLLMEngine:
        @staticmethod
        def from_engine_args(args, usage_context):
            return types.SimpleNamespace(
                engine=types.SimpleNamespace(model_executor=types.SimpleNamespace(driver_worker=Worker()))
            )

    modules = {
        "vllm": {},
        "vllm.engine": {},
        "vllm.engine.arg_utils": {"AsyncEngineArgs": AsyncEngineArgs},
        "vllm.engine.async_llm_engine": {"AsyncLLMEngine": AsyncLLMEngine},
        "vllm.usage": {},
        "vllm.usage.usage_lib": {"UsageContext": types.SimpleNamespace(API_SERVER="api_server")},
    }
    for name, attrs in modules.items():
        monkeypatch.setitem(sys.modules, name, types.SimpleNamespace(**attrs))


def test_a_failed_step_exits_1_with_one_json_log_line_naming_the_reason(monkeypatch, capsys):
    monkeypatch.setenv("NEURON_RANK_ID", "3")
    closed = "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer"  # the leader died
    _fake_fork(monkeypatch, RuntimeError(closed))
    assert worker.main([]) == 1
    last = capsys.readouterr().err.splitlines()[-1]
    line = json.loads(last)
    assert list(line)[:2] == ["ts", "event"]  # runtime/logs.py's order
    assert line["event"] == "neuron_follower_exit" and line["level"] == "error"
    assert line["rank"] == 3 and line["code"] == 1
    assert line["reason"] == f"RuntimeError: {closed}"


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
