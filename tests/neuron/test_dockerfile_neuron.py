"""runtime/Dockerfile.neuron: the pinned trn1-capable base, our runtime, nothing unpinned."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "runtime" / "Dockerfile.neuron"
PINNED_BASE = "public.ecr.aws/neuron/pytorch-inference-vllm-neuronx:0.16.0-neuronx-py312-sdk2.31.1-ubuntu24.04"


def _instructions() -> list[tuple[str, str]]:
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1])
        for line in text.splitlines()
        if line.strip() and not line.startswith("#")
    ]


def test_builds_from_the_pinned_trn1_capable_vllm_neuron_image():
    froms = [arg for op, arg in _instructions() if op == "FROM"]
    assert froms == [PINNED_BASE]


def test_sdk_version_used_for_the_compile_cache_matches_the_base_tag():
    env = " ".join(arg for op, arg in _instructions() if op == "ENV")
    sdk = re.search(r"-sdk(\d+\.\d+\.\d+)-", PINNED_BASE).group(1)
    assert f"FLOTILLA_NEURON_SDK_VERSION={sdk}" in env


def test_every_copy_source_exists_relative_to_the_repository_root():
    sources = [arg.split()[0] for op, arg in _instructions() if op == "COPY"]
    assert sources == ["runtime/requirements-neuron.txt", "contract/", "runtime/"]
    assert all((REPO / s).exists() for s in sources)


def test_runtime_extras_are_exact_pins_and_never_replace_the_base_images_ml_stack():
    lines = [
        ln.strip()
        for ln in (REPO / "runtime" / "requirements-neuron.txt").read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    ]
    assert lines and all(re.fullmatch(r"[A-Za-z0-9_.\-]+==[0-9][0-9A-Za-z.]*", ln) for ln in lines)
    names = {ln.split("==")[0].lower() for ln in lines}
    assert not names & {
        "torch",
        "transformers",
        "vllm",
        "torch-neuronx",
        "neuronx-distributed",
        "neuronx-distributed-inference",
    }


def test_the_image_starts_the_runtime_dispatcher():
    ops = dict(_instructions())
    assert ops["ENTRYPOINT"] == '["python3", "-m", "runtime"]'
    assert ops["CMD"] == '["node"]'


def test_runtime_extras_use_the_same_versions_as_the_cpu_runtime():
    def pins(path):
        return dict(
            ln.strip().split("==") for ln in path.read_text().splitlines() if "==" in ln and not ln.startswith("#")
        )

    neuron = pins(REPO / "runtime" / "requirements-neuron.txt")
    cpu = pins(REPO / "runtime" / "requirements.txt")
    assert {name: cpu.get(name) for name in neuron} == neuron
