"""Every test worker imports every test file while it collects, so what a test file imports at its top
every worker pays before its first test. The libraries below cost each process 0.4 s or more and
are used by a few tests only: a test file imports them inside the test or helper that uses them."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Top-level package -> what importing it costs a process (`python -X importtime`, AMD EPYC, bytecode
# already compiled; more in a fresh clone, where each worker compiles it too).
HEAVY = {
    "transformers": "its Llama classes pull in torch, torch.distributed.tensor and sympy: 4 s",
    "cfnlint": "cfn-lint and networkx under it: 0.4-0.5 s",
}


def top_level_imports(path: Path) -> set[str]:
    """The packages a module imports when it is imported: its module-level statements, including those
    under a module-level `if` or `try`, not those inside a function or class."""
    found: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                found.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.add(node.module.split(".")[0])
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                visit(node.orelse)
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)
                visit(getattr(node, "finalbody", []))

    visit(ast.parse(path.read_text(), str(path)).body)
    return found


def test_no_test_module_imports_a_heavy_library_at_its_top():
    offenders = sorted(
        f"{path.relative_to(ROOT)}: {name} ({HEAVY[name]})"
        for path in (ROOT / "tests").rglob("*.py")
        for name in top_level_imports(path) & HEAVY.keys()
    )
    assert not offenders, "import these where they are used:\n  " + "\n  ".join(offenders)


def test_the_check_sees_an_import_at_the_top_and_not_one_inside_a_function(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        "import json\nfrom cfnlint.api import lint\ntry:\n    import transformers.models\nexcept ImportError:\n"
        "    pass\n\ndef f():\n    import torch\n"
    )
    assert top_level_imports(module) == {"json", "cfnlint", "transformers"}
