"""The request path reads top down: each of its modules imports only those below it, so a reader
can hold one piece at a time, and the server's docstring names every piece."""

from __future__ import annotations

import ast
from pathlib import Path

import runtime.router.proxy

ROUTER = Path(runtime.router.proxy.__file__).parent
# Each module of the request path and the request-path modules it may import (nothing above it).
LAYERS: dict[str, set[str]] = {
    "proxy": {"intake", "routing", "first_byte", "relay", "moves", "waits", "answers", "accounting"},
    "routing": {"intake", "first_byte", "answers", "accounting"},
    "first_byte": {"intake", "relay", "waits", "answers", "accounting"},
    "relay": {"intake", "moves", "waits", "answers", "accounting"},
    "moves": set(),
    "intake": {"answers"},
    "waits": set(),
    "answers": set(),
    "accounting": set(),
}
SCREENS = 300  # lines: a piece a reader holds, two screens or so


def router_imports(module: str) -> set[str]:
    """The runtime.router modules `module` imports, by their short names."""
    tree = ast.parse((ROUTER / f"{module}.py").read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "runtime.router":
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("runtime.router."):
            found.add(node.module.rsplit(".", 1)[1])
        elif isinstance(node, ast.Import):
            found.update(a.name.rsplit(".", 1)[1] for a in node.names if a.name.startswith("runtime.router."))
    return found


def test_each_piece_of_the_request_path_imports_only_the_pieces_below_it():
    for module, allowed in LAYERS.items():
        above = (router_imports(module) & LAYERS.keys()) - allowed
        assert not above, f"runtime/router/{module}.py imports {sorted(above)}, which sit above it"


def test_the_layers_form_no_cycle():
    seen: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, f"import cycle: {' -> '.join((*path, module))}"
        if module in seen:
            return
        for below in LAYERS[module]:
            visit(below, (*path, module))
        seen.add(module)

    visit("proxy", ())
    assert seen == LAYERS.keys(), f"pieces the server never reaches: {sorted(LAYERS.keys() - seen)}"


def test_no_other_router_module_reaches_into_the_request_path_but_through_the_server():
    pieces = LAYERS.keys() - {"proxy", "answers"}
    for path in sorted(ROUTER.glob("*.py")):
        if path.stem in LAYERS:
            continue
        reached = router_imports(path.stem) & pieces
        assert not reached, f"runtime/router/{path.name} imports {sorted(reached)} of the request path"


def test_the_server_names_every_piece_and_each_fits_on_a_screen_or_two():
    doc = runtime.router.proxy.__doc__ or ""
    for module in LAYERS.keys() - {"proxy"}:
        assert f"- {module}: " in doc, f"runtime/router/proxy.py's docstring does not name {module}"
    for module in LAYERS:
        source = (ROUTER / f"{module}.py").read_text()
        assert ast.get_docstring(ast.parse(source)), f"runtime/router/{module}.py has no docstring"
        lines = source.count("\n")
        assert lines <= SCREENS, f"runtime/router/{module}.py is {lines} lines: split it along its jobs"


def test_the_router_imports_nothing_of_the_node_or_the_engines():
    """What the router and a unit share lives in contract/ (busy answers, the watch line, the ready
    body), so a router revision never carries node code along."""
    for path in sorted(ROUTER.glob("*.py")):
        tree = ast.parse(path.read_text())
        names = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        names += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        inside = [m for m in names if m.startswith(("runtime.node", "runtime.engines"))]
        assert not inside, f"runtime/router/{path.name} imports {inside}: declare what both share in contract/"


def test_the_request_path_calls_a_fleet_member_a_member():
    """A Member is one unit's entry in the fleet view; `member.unit` is that unit's id. Named `unit`,
    the id read `unit.unit`."""
    for module in LAYERS:
        tree = ast.parse((ROUTER / f"{module}.py").read_text())
        misnamed = [
            f"line {arg.lineno}: {arg.arg}"
            for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            for arg in (*node.args.args, *node.args.kwonlyargs)
            if isinstance(arg.annotation, ast.Name)
            and arg.annotation.id == "Member"
            and arg.arg != "member"
            and arg.arg != "failed"
        ]
        assert not misnamed, f"runtime/router/{module}.py names a Member otherwise: {misnamed}"
        said = [
            n.lineno
            for n in ast.walk(tree)
            if isinstance(n, ast.Attribute)
            and n.attr == "unit"
            and isinstance(n.value, ast.Name)
            and n.value.id == "unit"
        ]
        assert not said, f"runtime/router/{module}.py reads unit.unit at lines {said}"
