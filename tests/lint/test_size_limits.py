"""Product code stays in pieces a reader can hold: no module over 800 lines and no function over
120 in runtime/, stacks/, ops/ and contract/ (docs/development.md, "Code we want to live in"). A
function that must be longer says why on its `def` line, in a comment that starts `# size:`."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PRODUCT = ("runtime", "stacks", "ops", "contract")
MODULE_LINES = 800
FUNCTION_LINES = 120


def _sources() -> list[Path]:
    return sorted(p for root in PRODUCT for p in (REPO / root).rglob("*.py"))


def _long_functions(path: Path, root: Path = REPO) -> list[str]:
    text = path.read_text()
    lines = text.splitlines()
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > FUNCTION_LINES and "# size:" not in lines[node.lineno - 1]:
                found.append(f"{path.relative_to(root)}:{node.lineno} {node.name} is {length} lines")
    return found


def test_no_product_module_is_longer_than_800_lines():
    long = [
        f"{p.relative_to(REPO)} is {n} lines"
        for p in _sources()
        if (n := len(p.read_text().splitlines())) > MODULE_LINES
    ]
    assert not long, "split these along their responsibilities:\n" + "\n".join(long)


def test_no_product_function_is_longer_than_120_lines_without_a_reason():
    long = [f for p in _sources() for f in _long_functions(p)]
    assert not long, "split these into named steps, or say why on the def line (# size: ...):\n" + "\n".join(long)


def test_the_check_sees_a_long_function_and_its_reason(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(FUNCTION_LINES))
    path = tmp_path / "probe.py"
    path.write_text(f"def long():\n{body}\n")
    assert _long_functions(path, tmp_path) == [f"probe.py:1 long is {FUNCTION_LINES + 1} lines"]
    path.write_text(f"def long():  # size: a table the reader reads top to bottom\n{body}\n")
    assert _long_functions(path, tmp_path) == []
