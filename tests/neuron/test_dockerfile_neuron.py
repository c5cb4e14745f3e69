"""runtime/Dockerfile.neuron (single-node) and runtime/Dockerfile.neuron-multinode: each builds FROM
the image contract/neuron.py pins for its mode, adds our runtime, and nothing unpinned."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from contract.neuron import MULTI_NODE_IMAGE, SINGLE_NODE_IMAGE

REPO = Path(__file__).resolve().parents[2]
SINGLE = REPO / SINGLE_NODE_IMAGE.dockerfile
MULTI = REPO / MULTI_NODE_IMAGE.dockerfile


def _instructions(path: Path) -> list[tuple[str, str]]:
    text = path.read_text().replace("\\\n", " ")
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1])
        for line in text.splitlines()
        if line.strip() and not line.startswith("#")
    ]


def _env(path: Path) -> str:
    return " ".join(arg for op, arg in _instructions(path) if op == "ENV")


@pytest.mark.parametrize("image", [SINGLE_NODE_IMAGE, MULTI_NODE_IMAGE], ids=["single-node", "multi-node"])
def test_each_mode_builds_from_its_pinned_aws_image_with_the_matching_sdk(image):
    path = REPO / image.dockerfile
    assert [arg for op, arg in _instructions(path) if op == "FROM"] == [image.base_image]
    sdk = re.search(r"-sdk(\d+\.\d+\.\d+)-", image.base_image).group(1)
    assert sdk == image.neuron_sdk
    assert f"FLOTILLA_NEURON_SDK_VERSION={sdk}" in _env(path)  # the compile-cache key's SDK part
    assert f"py{image.python.replace('.', '')}" in image.base_image


def test_the_single_node_image_is_the_newest_whose_nxd_inference_supports_trn1():
    # aws-neuron-sdk release-notes/components/nxd-inference.rst:58-61 (2.29.0): NxD Inference models
    # only on Trn2 and newer; Trn1 users pin to 2.28. deep-learning-containers@2.28.0 README.md:78.
    assert SINGLE_NODE_IMAGE.base_image == (
        "public.ecr.aws/neuron/pytorch-inference-vllm-neuronx:0.13.0-neuronx-py312-sdk2.28.0-ubuntu24.04"
    )


def test_the_multi_node_image_is_the_v0_fork_release_with_the_multi_node_example():
    # deep-learning-containers@2.24.1 docker/vllm/inference/0.7.2/Dockerfile.neuronx:225 clones branch
    # neuron-2.24-vllm-v0.7.2, which holds examples/neuron/multi_node/ (README.md:83 at 2.28.0).
    assert MULTI_NODE_IMAGE.base_image == (
        "public.ecr.aws/neuron/pytorch-inference-vllm-neuronx:0.7.2-neuronx-py310-sdk2.24.1-ubuntu22.04"
    )


def test_single_node_copies_the_runtime_and_installs_only_its_exact_pins():
    sources = [arg.split()[0] for op, arg in _instructions(SINGLE) if op == "COPY"]
    assert sources == ["runtime/requirements-neuron.txt", "contract/", "runtime/"]
    assert all((REPO / s).exists() for s in sources)


def test_single_node_extras_are_exact_pins_and_never_replace_the_base_images_ml_stack():
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


def test_single_node_extras_use_the_same_versions_as_the_cpu_runtime():
    def pins(path):
        return dict(
            ln.strip().split("==") for ln in path.read_text().splitlines() if "==" in ln and not ln.startswith("#")
        )

    neuron = pins(REPO / "runtime" / "requirements-neuron.txt")
    cpu = pins(REPO / "runtime" / "requirements.txt")
    assert {name: cpu.get(name) for name in neuron} == neuron


def test_single_node_starts_the_runtime_with_the_images_python():
    ops = dict(_instructions(SINGLE))
    assert ops["ENTRYPOINT"] == '["python3", "-m", "runtime"]'
    assert ops["CMD"] == '["node"]'


def test_multi_node_runs_our_runtime_in_its_own_python_beside_the_forks():
    # The fork's Python (conda, 3.10) keeps its packages untouched; ours is a separate 3.11 environment
    # with the CPU runtime's exact pins, and the plan's `python` stays the image's (PATH unchanged).
    ops = _instructions(MULTI)
    runs = " ".join(arg for op, arg in ops if op == "RUN")
    assert "mamba create -y -p /opt/flotilla/py" in runs and "python=${FLOTILLA_PYTHON}" in runs
    assert "/opt/flotilla/py/bin/python -m pip install" in runs
    assert "-r /opt/flotilla/runtime/requirements.txt -c /opt/flotilla/constraints.txt" in runs
    assert "ARG FLOTILLA_PYTHON=3.11" in MULTI.read_text()
    assert "PATH=" not in _env(MULTI).replace("LD_LIBRARY_PATH=", "")
    assert dict(ops)["ENTRYPOINT"] == '["/opt/flotilla/py/bin/python", "-m", "runtime"]'
    assert dict(ops)["CMD"] == '["node"]'
    sources = [arg.split()[0] for op, arg in ops if op == "COPY"]
    assert sources == ["runtime/requirements.txt", "constraints.txt", "contract/", "runtime/"]


def test_multi_node_extends_the_library_path_as_the_forks_launcher_does():
    # multi_node_launcher.sh:46 exports to every rank:
    # LD_LIBRARY_PATH=/opt/aws/neuron/lib:/opt/amazon/efa/lib:/opt/amazon/openmpi/lib:$LD_LIBRARY_PATH
    dirs = "/opt/aws/neuron/lib:/opt/amazon/efa/lib:/opt/amazon/openmpi/lib"
    assert f"LD_LIBRARY_PATH={dirs}:${{LD_LIBRARY_PATH}}" in _env(MULTI)


@pytest.mark.parametrize("path", [SINGLE, MULTI], ids=["single-node", "multi-node"])
def test_each_dockerfile_has_an_ignore_file_that_keeps_the_context_to_the_runtime(path):
    ignore = Path(f"{path}.dockerignore").read_text().split()
    assert ignore[ignore.index("**") :][:3] == ["**", "!contract/", "!runtime/"]
