"""The README is a path a newcomer walks top to bottom: short, status and cost before any command, then
local, staging, production and clean-up in that order, a client snippet that talks to what `make local`
starts, and every link (file and heading) landing somewhere."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MAX_LINES = 250
# The path, in the order a newcomer walks it.
PATH = ["## Status", "## Cost", "## 1. Try it locally", "## 2. Staging", "## 3. Production", "## 4. Clean up"]


def _lines() -> list[str]:
    return README.read_text().splitlines()


def test_the_readme_fits_a_sitting():
    assert len(_lines()) <= MAX_LINES, f"README.md has {len(_lines())} lines: move detail into docs/ and link it"


def test_status_and_cost_come_first_then_local_staging_production_and_clean_up():
    lines = _lines()
    found = [next((i for i, line in enumerate(lines) if line.startswith(h)), None) for h in PATH]
    missing = [h for h, i in zip(PATH, found, strict=True) if i is None]
    assert not missing, f"README.md lacks the sections {missing}"
    assert found == sorted(found), "README.md's sections are out of order: " + " < ".join(PATH)
    first_block = next(i for i, line in enumerate(lines) if line.startswith("```"))
    assert first_block > found[PATH.index("## Cost")], "a command comes before the status and the cost"


def test_the_status_says_what_has_not_run_on_trainium():
    status = README.read_text().split("## Status", 1)[1].split("\n## ", 1)[0]
    assert "Nothing has run on Trainium yet" in status
    assert "docs/trainium.md" in status  # the mode-by-mode table it summarizes


def test_the_local_client_snippet_is_python_that_calls_the_port_and_model_make_local_serves():
    from runtime import local

    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "no openai client snippet"
    tree = ast.parse(blocks[0])
    literals = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    assert f"http://127.0.0.1:{local.DEFAULT_PUBLIC_PORT}/v1" in literals
    assert local.parse_args([]).model in literals


def github_anchor(heading: str) -> str:
    """GitHub's heading id: lower case, punctuation but - and _ dropped, spaces to -."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    headings = [line.lstrip("#").strip() for line in path.read_text().splitlines() if re.match(r"#{1,6} ", line)]
    return frozenset(github_anchor(h) for h in headings)


def _links(path: Path) -> list[tuple[int, str]]:
    text = re.sub(r"```.*?```", lambda m: "\n" * m.group(0).count("\n"), path.read_text(), flags=re.S)
    return [
        (n, m.group(1)) for n, line in enumerate(text.splitlines(), 1) for m in re.finditer(r"\]\(([^)\s]+)\)", line)
    ]


DOCS = [README, *sorted((ROOT / "docs").rglob("*.md"))]


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_lands_on_a_file_and_heading_that_exist(path):
    broken = []
    for line, target in _links(path):
        if re.match(r"^[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            broken.append(f"{path.name}:{line}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{path.name}:{line}: {target} (no such heading in {dest.name})")
    assert not broken, "\n".join(broken)


def test_the_anchor_rule_is_githubs():
    assert github_anchor("Six validation layers (tests/stacks)") == "six-validation-layers-testsstacks"
    assert github_anchor("Operations: the `flotilla` CLI") == "operations-the-flotilla-cli"
    assert github_anchor("1. Try it locally") == "1-try-it-locally"
