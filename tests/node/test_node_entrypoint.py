"""`python -m runtime`: each subcommand is listed under the module that adds it, and a process loads
only its own subcommand's module (a node none of the router's, a router none of the node's)."""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from runtime import __main__ as entry

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", sorted(entry.SUBCOMMANDS))
def test_each_subcommand_is_listed_under_the_module_that_adds_it(name):
    sub = argparse.ArgumentParser().add_subparsers(dest="command")
    importlib.import_module(entry.SUBCOMMANDS[name]).add_parser(sub)
    assert set(sub.choices) == {name}


def _loaded_after(argv: list[str]) -> set[str]:
    """The runtime modules a fresh interpreter holds once the entry point has picked argv's modules."""
    code = (
        "import json, sys\n"
        "import runtime.__main__ as entry\n"
        f"entry.modules({argv!r})\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('runtime.'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return set(json.loads(out.stdout))


def test_a_node_loads_none_of_the_routers_modules_and_a_router_none_of_the_nodes():
    node = _loaded_after(["node", "--help"])
    assert "runtime.node.cli" in node
    assert not {m for m in node if m.startswith("runtime.router.")}, node
    router = _loaded_after(["router"])
    assert "runtime.router.cli" in router
    assert not {m for m in router if m.startswith("runtime.node.")}, router


def test_help_and_unknown_names_list_every_subcommand():
    for argv in (["--help"], ["nodes"]):
        out = subprocess.run(
            [sys.executable, "-m", "runtime", *argv], cwd=REPO, capture_output=True, text=True, timeout=120
        )
        assert "{plan,node,router,artifacts}" in out.stdout + out.stderr, (argv, out.stdout, out.stderr)
