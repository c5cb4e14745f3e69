"""Every test worker imports every test file while it collects, so what a test file imports at its top
every worker pays before its first test. The libraries below cost each process 0.4 s or more and
are used by a few tests only: a test file imports them inside the test or helper that uses them."""

from __future__ import annotations

from pathlib import Path

from tools.warm_imports import module_level_imports

ROOT = Path(__file__).resolve().parents[2]
# Top-level package -> what importing it costs a process (`python -X importtime`, AMD EPYC, bytecode
# already compiled; more in a fresh clone, where each worker compiles it too).
HEAVY = {
    "transformers": "its Llama classes pull in torch, torch.distributed.tensor and sympy: 4 s",
    "cfnlint": "cfn-lint and networkx under it: 0.4-0.5 s",
}


def top_level_imports(path: Path) -> set[str]:
    """The packages a module imports when it is imported (its module-level statements, including those
    under a module-level `if` or `try`, not those inside a function or class)."""
    return {name.split(".")[0] for name in module_level_imports(path)}


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


def test_the_warm_up_byte_compiles_what_test_files_import_at_their_top_and_nothing_they_import_later(tmp_path):
    """tools/warm_imports.py, run as the Makefile runs it, on a repository of one test file: the
    modules that file imports at its top (a package module by its dotted name, a helper beside it by
    its bare name, and what that helper imports) have bytecode afterwards; one imported inside a test
    does not."""
    import os
    import subprocess
    import sys

    (tmp_path / "pkg").mkdir()
    for name in ("__init__", "shared", "via_helper", "later"):
        (tmp_path / "pkg" / f"{name}.py").write_text("VALUE = 1\n")
    (tmp_path / "tests" / "unit").mkdir(parents=True)
    (tmp_path / "tests" / "unit" / "helper_beside.py").write_text("import pkg.via_helper\n")
    (tmp_path / "tests" / "unit" / "test_a.py").write_text(
        "import helper_beside\nfrom pkg.shared import VALUE\n\ndef test_x():\n    import pkg.later\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "warm_imports.py"), "--root", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr

    def compiled(name: str) -> bool:
        return any((tmp_path / "pkg" / "__pycache__").glob(f"{name}.*.pyc"))

    assert compiled("shared") and compiled("via_helper"), proc.stdout
    assert not compiled("later")
