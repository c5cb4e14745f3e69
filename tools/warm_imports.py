"""Byte-compile, once, what the test workers import while they collect.

pip installs without byte-compiling (Makefile, PIP_INSTALL), so Python compiles a module the first time
it is imported and writes the bytecode beside it. The test workers start together and each imports every
test file while it collects, so after a fresh install both compile the same few thousand modules
(torch, openai, moto, aws-cdk-lib) at the same time: on 2 cores (AMD EPYC) they took 24-25 s to reach
their first test with nothing compiled, 9-10 s with it all compiled. The Makefile starts this in the
background as soon as the test requirements are installed, while the model package and npm's install
leave the CPU mostly idle. A worker that imports a module before this has compiled it compiles it
itself, as without this; the bytecode is written atomically either way (a temporary file renamed into
place: CPython, Lib/importlib/_bootstrap_external.py, `_write_atomic`).

What it imports is read from the test files themselves (their module-level imports, as
`tests/lint/test_collection_imports.py` reads them), so nothing here needs updating when a test imports
something new. A name that does not import here (a class named in `from m import C`, a helper found
only beside its test) is skipped.

    python tools/warm_imports.py [--root DIR]
"""

from __future__ import annotations

import argparse
import ast
import compileall
import importlib
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("app.py", "contract", "stacks", "runtime", "ops", "bench", "tools", "traces", "tests")
# Two processes, one per core, each compiling libraries the other does not need first: the runtime's
# side (torch) in one, the rest (aws-cdk-lib, moto, openai, hypothesis) in the other.
TORCH_SIDE = frozenset({"runtime", "bench", "torch", "safetensors", "tokenizers", "numpy"})


def module_level_imports(path: Path) -> set[str]:
    """The absolute module names a file imports when it is imported: its module-level statements,
    including those under a module-level `if` or `try`, not those inside a function or class. For
    `from a.b import c`, both `a.b` and `a.b.c` (c may be a submodule)."""
    found: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.add(node.module)
                found.update(f"{node.module}.{alias.name}" for alias in node.names if alias.name != "*")
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                visit(node.orelse)
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)
                visit(getattr(node, "finalbody", []))

    visit(ast.parse(path.read_text(), str(path)).body)
    return found


def warm(root: Path, test_files: list[Path], names: list[str]) -> tuple[int, int]:
    """Import `names` as the test workers would find them; (imported, skipped)."""
    # The repository (pytest.ini's `pythonpath = .`) and each test file's folder (pytest's "prepend"
    # import mode: a helper beside a test is imported by its bare name).
    sys.path[:0] = [str(root), *sorted({str(p.parent) for p in test_files})]
    imported = skipped = 0
    for name in names:
        try:
            importlib.import_module(name)
            imported += 1
        except Exception:  # noqa: BLE001 (not a module, or one that needs its test's setup: the test will say)
            skipped += 1
    return imported, skipped


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=ROOT, help="the repository (default: this one)")
    ap.add_argument("--rest", action="store_true", help=argparse.SUPPRESS)  # the second process's half
    args = ap.parse_args(argv)
    root = args.root.resolve()
    test_files = sorted((root / "tests").rglob("*.py"))
    names = sorted(set().union(*(module_level_imports(p) for p in test_files)))
    # This process takes the torch side, the child (--rest) the others.
    names = [n for n in names if (n.split(".")[0] in TORCH_SIDE) != args.rest]
    child = None
    if not args.rest:
        child = subprocess.Popen([sys.executable, __file__, "--root", str(root), "--rest"])
        for source in SOURCES:
            path = root / source
            if path.is_dir():
                compileall.compile_dir(path, quiet=1)
            elif path.is_file():
                compileall.compile_file(path, quiet=1)
    imported, skipped = warm(root, test_files, names)
    print(f"warm_imports{' (rest)' if args.rest else ''}: {imported} imported, {skipped} skipped", flush=True)
    return child.wait() if child else 0


if __name__ == "__main__":
    sys.exit(main())
