"""runtime/Dockerfile and .dockerignore: what the image carries is what the node needs (checked
statically: the build itself needs a Docker daemon and network, which the test machines lack)."""

from __future__ import annotations

import ast
import fnmatch
import re
import sys
from pathlib import Path

import contract

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = (REPO / "runtime" / "Dockerfile").read_text()
# import name -> the runtime/requirements.txt package that provides it
PROVIDED = {
    "torch",
    "transformers",
    "safetensors",
    "tokenizers",
    "aiohttp",
    "prometheus_client",
    "boto3",
    "botocore",
    "numpy",
    "pydantic",
    "pydantic_core",  # installed by pydantic (its validation core); openai_api.py raises its error type
}


def instructions(name: str) -> list[str]:
    return [line.split(None, 1)[1] for line in DOCKERFILE.splitlines() if line.startswith(name + " ")]


def in_context(path: str) -> bool:
    """Evaluate .dockerignore (last matching pattern wins) for a path relative to the repo root."""
    keep = True
    for pat in (REPO / ".dockerignore").read_text().splitlines():
        pat = pat.strip()
        if not pat or pat.startswith("#"):
            continue
        neg = pat.startswith("!")
        pat = pat.lstrip("!").rstrip("/")
        parts = Path(path).parts
        hit = any(fnmatch.fnmatch("/".join(parts[:i]), pat) for i in range(1, len(parts) + 1)) or fnmatch.fnmatch(
            path, pat
        )
        if hit:
            keep = neg
    return keep


def test_every_copied_path_exists_and_is_in_the_build_context():
    sources = [src for line in instructions("COPY") for src in line.split()[:-1]]
    assert {"contract/", "runtime/"} <= set(sources)
    for src in sources:
        assert (REPO / src).exists(), src
        assert in_context(src.rstrip("/") + ("/__init__.py" if src.endswith("/") else "")), src


def test_virtualenvs_model_caches_and_cdk_output_stay_out_of_the_context():
    for path in (
        ".venv/lib/x.py",
        "node_modules/a.js",
        "cdk.out/t.json",
        ".flotilla/local.json",
        "tests/node/a.py",
        ".cache/flotilla/smollm2/model.safetensors",
        "runtime/__pycache__/x.pyc",
    ):
        assert not in_context(path), path


def test_the_image_runs_as_a_non_root_user_on_a_pinned_base():
    user = instructions("USER")[-1]
    assert user.split(":")[0] not in ("root", "0")
    base = re.search(r"ARG BASE_IMAGE=(\S+)", DOCKERFILE).group(1)
    assert re.search(r":\d+\.\d+\.\d+", base) and "latest" not in base


def test_the_image_command_is_the_node_by_default():
    assert instructions("ENTRYPOINT") == ['["python", "-m", "runtime"]']
    assert instructions("CMD") == [str(contract.NODE_COMMAND).replace("'", '"')]


def test_node_modules_import_only_the_standard_library_and_runtime_requirements():
    mine = [
        *(REPO / "runtime" / "node").glob("*.py"),
        *(REPO / "runtime" / "rendezvous").glob("*.py"),
        REPO / "runtime" / "local.py",
    ]
    reqs = (REPO / "runtime" / "requirements.txt").read_text()
    for name in PROVIDED - {"botocore", "pydantic_core"}:  # installed with boto3 / pydantic
        assert name.replace("_", "-") in reqs.replace("_", "-"), name
    for path in mine:
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module]
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                else []
            )
            for n in names:
                top = n.split(".")[0]
                assert top in sys.stdlib_module_names or top in PROVIDED or top in ("runtime", "contract"), (
                    f"{path.relative_to(REPO)} imports {n}, which the image does not install"
                )
