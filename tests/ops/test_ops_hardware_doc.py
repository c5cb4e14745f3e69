"""docs/hardware.md and contract/trainium.py state the same figures, each citing the same source."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from contract.trainium import GIB, INSTANCES, TrainiumInstance

REPO = Path(__file__).resolve().parents[2]
DOC = (REPO / "docs" / "hardware.md").read_text()
# "| figure | trn1.32xlarge | trn1n.32xlarge | trn2.48xlarge | source |" rows, keyed by the figure cell.
ROWS = {
    cells[0]: cells[1:]
    for line in DOC.splitlines()
    if line.startswith("| ")
    for cells in [[c.strip() for c in line.strip().strip("|").split("|")]]
}
HEADER = ROWS["figure"]
# "[label]: url" link definitions at the end of the page.
LINKS = dict(re.findall(r"^\[([\w-]+)\]: (\S+)$", DOC, flags=re.MULTILINE))


def _cell(row: str, instance_type: str) -> str:
    return ROWS[row][HEADER.index(instance_type)]


def _doc_rows(spec: TrainiumInstance) -> dict[str, tuple[str, str]]:
    """Each figure of the table -> (its row in the doc, the value that row must state for spec)."""
    return {
        "chips": ("Trainium chips (= Neuron devices `/dev/neuron0..15`)", f"{spec.chips}"),
        "neuron_cores_per_chip": ("NeuronCores per chip", f"{spec.neuron_cores_per_chip}"),
        "hbm_bytes_per_chip": ("HBM (device memory) per chip", f"{spec.hbm_bytes_per_chip // GIB} GiB"),
        "hbm_bytes_per_s_per_chip": ("HBM bandwidth per chip", f"{spec.hbm_bytes_per_s_per_chip / GIB:.0f} GiB/s"),
        "bf16_flops_per_chip": ("dense BF16/FP16 per chip", f"{spec.bf16_flops_per_chip / 1e12:.0f} TFLOPS"),
        "efa_interfaces": (
            "EFA interfaces (one per network card, `/dev/infiniband/uverbs0..N-1`)",
            f"{spec.efa_interfaces}",
        ),
        "efa_gbps": ("EFA bandwidth", f"{spec.efa_gbps} Gbps"),
        "vcpus": ("vCPUs", f"{spec.vcpus}"),
        "memory_gib": ("host memory", f"{spec.memory_gib} GiB"),
    }


def test_the_doc_has_a_column_for_every_instance_type():
    assert HEADER[:-1] == sorted(INSTANCES) and HEADER[-1] == "source"


@pytest.mark.parametrize("instance_type", sorted(INSTANCES))
def test_every_figure_of_the_table_is_in_the_doc_with_its_source(instance_type):
    spec = INSTANCES[instance_type]
    rows = _doc_rows(spec)
    figures = {f.name for f in fields(TrainiumInstance)} - {"instance_type", "sources"}
    assert set(rows) == figures, "a figure of contract/trainium.py has no row in docs/hardware.md"
    assert set(spec.sources) == figures, "every figure names the page it comes from"
    for figure, (row, value) in rows.items():
        assert _cell(row, instance_type) == value, f"docs/hardware.md, row {row!r}, column {instance_type}"
        cited = {LINKS[label] for label in re.findall(r"\[([\w-]+)\]", ROWS[row][-1])}
        assert spec.sources[figure] in cited, f"row {row!r} does not cite {spec.sources[figure]}"


@pytest.mark.parametrize("instance_type", sorted(INSTANCES))
def test_figures_the_planner_derives_are_in_the_doc(instance_type):
    spec = INSTANCES[instance_type]
    assert _cell("NeuronCores per instance", instance_type) == f"{spec.neuron_cores}"
    assert _cell("HBM per NeuronCore", instance_type) == f"{spec.hbm_bytes_per_core // GIB} GiB"
    assert _cell("HBM bandwidth per NeuronCore", instance_type) == f"{spec.hbm_bytes_per_s_per_core / GIB:.0f} GiB/s"


def _pinned(text: str) -> set[str]:
    """The distributions a requirements text (or the ops extra's list) pins with ==, lower case."""
    return {m.group(1).lower() for m in re.finditer(r"([A-Za-z0-9_.-]+)==", text)}


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    caught = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(isinstance(c, ast.Name) and c.id in ("ImportError", "ModuleNotFoundError") for c in caught)


def test_contract_imports_only_what_every_side_installs():
    # stacks/ (no torch), runtime/ (no aws-cdk-lib) and ops/ all import contract/: beyond the standard
    # library it may use only what the CDK app, the runtime image and the ops extra all pin. The
    # Neuron image takes pydantic from its base image's vLLM instead (runtime/requirements-neuron.txt).
    pyproject = (REPO / "pyproject.toml").read_text()
    ops_extra = pyproject[pyproject.index("\nops = [") :].split("]", 1)[0]
    everywhere = (
        _pinned((REPO / "requirements.txt").read_text())
        & _pinned((REPO / "runtime" / "requirements.txt").read_text())
        & _pinned(ops_extra)
    )
    assert "pydantic" in everywhere
    # pydantic pins its core exactly (pydantic 2.14.4's METADATA: `Requires-Dist: pydantic-core==2.50.5`),
    # so wherever pydantic is installed, pydantic_core is too, at the one version that pydantic was built
    # for; its own docs import core_schema from it for __get_pydantic_core_schema__
    # (docs.pydantic.dev/latest/concepts/types/, "Customizing validation with __get_pydantic_core_schema__").
    assert any(r.replace(" ", "").startswith("pydantic-core==") for r in importlib.metadata.requires("pydantic") or [])
    everywhere |= {"pydantic_core"}
    assert "pydantic" in (REPO / "runtime" / "requirements-neuron.txt").read_text()
    for path in sorted((REPO / "contract").glob("*.py")):
        tree = ast.parse(path.read_text())
        # An import guarded by `except ImportError` is optional: the module must work without it (the
        # watch line's orjson, held to that by the router's no-orjson test), so it need not be pinned.
        optional = {
            id(inner)
            for node in ast.walk(tree)
            if isinstance(node, ast.Try) and any(_catches_import_error(h) for h in node.handlers)
            for stmt in node.body
            for inner in ast.walk(stmt)
        }
        for node in ast.walk(tree):
            if id(node) in optional:
                continue
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            for name in names:
                top = name.split(".")[0]
                assert top in sys.stdlib_module_names or top in ("contract", "__future__") or top in everywhere, (
                    f"{path.name} imports {name}, which not every side pins"
                )
