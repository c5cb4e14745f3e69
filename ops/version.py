"""The release `flotilla --version` prints: declared once, as pyproject.toml's [project] version.

An installed CLI (`pip install ".[ops]"`) reads it from the package metadata pip wrote; a checkout
run as `python -m ops` (never installed) reads the pyproject.toml beside the `ops` package.
"""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

DISTRIBUTION = "flotilla-runtime"  # pyproject.toml [project] name
PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def version() -> str:
    # A checkout's own pyproject.toml first: a stale install elsewhere in the environment must not
    # name another release than the code that runs.
    if PYPROJECT.is_file():
        project = tomllib.loads(PYPROJECT.read_text()).get("project", {})
        if project.get("name") == DISTRIBUTION and "version" in project:
            return str(project["version"])
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "unknown (neither installed nor run from a checkout)"
