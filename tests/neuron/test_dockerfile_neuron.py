"""runtime/Dockerfile.neuron (single-node) and runtime/Dockerfile.neuron-multinode: each builds FROM
the image contract/neuron.py pins for its mode, adds our runtime, and nothing unpinned."""

from __future__ import annotations

import ast
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


def test_the_multi_node_image_is_the_sdk_2_28_container_that_carries_nxd_inference():
    # deep-learning-containers@2.28.0 vllm/inference/0.13.0/Dockerfile.neuronx:165-166 pins NxD 0.17.26814
    # and NxD Inference 0.8.16251 in this image; SDK 2.28 is the last whose NxD Inference runs on trn1.
    assert MULTI_NODE_IMAGE.base_image == SINGLE_NODE_IMAGE.base_image
    assert MULTI_NODE_IMAGE.neuron_sdk == "2.28.0"


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


def test_multi_node_installs_efa_user_space_as_the_2_28_container_does_at_a_pinned_release():
    # deep-learning-containers@2.28.0 vllm/inference/0.13.0/Dockerfile.neuronx:92-105:
    # `./efa_installer.sh -y -g --skip-kmod --skip-limit-conf --no-verify` (the kernel module is the host's).
    runs = [arg for op, arg in _instructions(MULTI) if op == "RUN"]
    (efa,) = [r for r in runs if "efa_installer.sh" in r]
    assert "./efa_installer.sh -y -g --skip-kmod --skip-limit-conf --no-verify" in efa
    assert "latest" not in efa
    assert efa.rstrip().endswith("/opt/amazon/efa/bin/fi_info --version")  # the build fails without libfabric
    # The Neuron runtime finds libfabric there (the path the fork's multi_node_launcher.sh:46 exported).
    assert "LD_LIBRARY_PATH=/opt/aws/neuron/lib:/opt/amazon/efa/lib:${LD_LIBRARY_PATH}" in _env(MULTI)


def _steps(run: str) -> list[str]:
    return [step.strip() for step in run.split("&&")]


def test_multi_node_checks_the_installer_against_the_pinned_sha256_before_running_it():
    """The checksum AWS publishes (EC2 user guide, efa-verify.html), pinned once in contract/node_boot.py:
    no key or signature fetched from the host that serves the tarball."""
    from contract.node_boot import EFA_INSTALLER

    text = MULTI.read_text()
    assert re.search(rf"^ARG EFA_INSTALLER_VERSION={re.escape(EFA_INSTALLER.version)}$", text, re.M)
    assert re.search(rf"^ARG EFA_INSTALLER_SHA256={EFA_INSTALLER.sha256}$", text, re.M)
    (efa,) = [arg for op, arg in _instructions(MULTI) if op == "RUN" and "efa_installer.sh" in arg]
    steps = _steps(efa)
    tarball = "aws-efa-installer-${EFA_INSTALLER_VERSION}.tar.gz"
    check = f'echo "${{EFA_INSTALLER_SHA256}}  {tarball}" | sha256sum --check --strict -'
    assert check in steps
    download = next(i for i, s in enumerate(steps) if s.startswith("curl ") and ".tar.gz" in s)
    untar = next(i for i, s in enumerate(steps) if s.startswith("tar "))
    assert download < steps.index(check) < untar
    assert "gpg" not in efa and ".key" not in efa and ".sig" not in efa


def test_multi_node_refreshes_the_package_lists_the_base_image_deleted_before_the_installer_needs_them():
    # The base image removes /var/lib/apt/lists after each apt step (Dockerfile.neuronx:50) and the
    # installer installs its dependencies with apt-get; the 2.28 DLC's own EFA step updates first (:93).
    (efa,) = [arg for op, arg in _instructions(MULTI) if op == "RUN" and "efa_installer.sh" in arg]
    steps = _steps(efa)
    assert steps[0] == "apt-get update"
    assert steps.index("rm -rf /var/lib/apt/lists/*") > next(i for i, s in enumerate(steps) if "efa_installer.sh" in s)


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}


def test_multi_node_ends_with_an_import_check_of_every_module_the_engine_loads():
    ops = _instructions(MULTI)
    runs = [arg for op, arg in ops if op == "RUN"]
    check = runs[-1]
    assert check.startswith('python3 -c "import ')
    imported = set(check.split("import ", 1)[1].rstrip('"').replace(" ", "").split(","))
    # Every NxD Inference module the loop imports, read from its source, and the runtime's entry points.
    spmd = REPO / "runtime" / "engines" / "neuron" / "spmd.py"
    nxdi = {m for m in _imported_modules(spmd) if m.startswith("neuronx_distributed_inference")}
    assert nxdi and nxdi <= imported
    assert {"runtime.engines.neuron.spmd", "runtime.engines.neuron.engine", "runtime.node.cli"} <= imported
    # The check runs after the runtime is copied in, and nothing but the entry point follows it.
    assert [op for op, _ in ops][-3:] == ["RUN", "ENTRYPOINT", "CMD"]
    assert dict(ops)["ENTRYPOINT"] == '["python3", "-m", "runtime"]'


@pytest.mark.parametrize("path", [SINGLE, MULTI], ids=["single-node", "multi-node"])
def test_each_dockerfile_has_an_ignore_file_that_keeps_the_context_to_the_runtime(path):
    ignore = Path(f"{path}.dockerignore").read_text().split()
    assert ignore[ignore.index("**") :][:3] == ["**", "!contract/", "!runtime/"]
