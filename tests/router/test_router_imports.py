"""The router reads what leaders send through contract/ alone: no router module imports the node's
code, so a node-side change cannot reach the router except through a declared wire format."""

from __future__ import annotations

import ast
from pathlib import Path

ROUTER = Path(__file__).resolve().parents[2] / "runtime" / "router"


def _node_imports(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        found += [n for n in names if n == "runtime.node" or n.startswith("runtime.node.")]
    return found


def test_no_router_module_imports_the_node():
    found = {p.name: _node_imports(p.read_text()) for p in sorted(ROUTER.rglob("*.py"))}
    assert len(found) > 10  # the walk finds the router's modules
    assert {name: n for name, n in found.items() if n} == {}, "move what both sides need into contract/"


def test_the_check_sees_each_way_of_importing_the_node():
    assert _node_imports("from runtime.node.queue_wait import retry_after_s")
    assert _node_imports("import runtime.node.handshake")
    assert _node_imports("from runtime.node import handshake")
    assert not _node_imports("from runtime.router import overload\nimport contract")
