"""docs/hardware.md and ops/hardware.py state the same figures, and every figure has a source."""

from __future__ import annotations

from pathlib import Path

from ops.hardware import GIB, INSTANCES

DOC = (Path(__file__).resolve().parents[2] / "docs" / "hardware.md").read_text()


def test_every_instance_figure_the_planner_uses_is_in_the_doc():
    for spec in INSTANCES.values():
        assert f"{spec.chips} |" in DOC or f"| {spec.chips}" in DOC
        assert f"{spec.hbm_bytes_per_chip // GIB} GiB" in DOC
        assert f"{spec.hbm_bytes_per_s_per_chip / GIB:.0f} GiB/s" in DOC
        assert f"{spec.bf16_flops_per_chip / 1e12:.0f} TFLOPS" in DOC
        assert f"{spec.efa_gbps} Gbps ({spec.efa_interfaces} EFA interfaces)" in DOC
        assert f"{spec.hbm_bytes_per_core // GIB} GiB" in DOC
        assert f"{spec.neuron_cores}" in DOC


def test_every_source_the_module_names_is_linked_from_the_doc():
    for spec in INSTANCES.values():
        for url in spec.sources:
            assert url in DOC
