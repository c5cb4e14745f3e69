"""The container images flotilla tasks run: a prebuilt URI from the config, or an asset built at
`cdk deploy` (synth only copies and hashes): runtime/Dockerfile for the router and CPU engines; for
units on the `neuron` engine, the Dockerfile of their mode (contract/neuron.py): one node, AWS's vLLM
V1 Neuron container (runtime/Dockerfile.neuron); several, NxD Inference split over the unit on the
same SDK 2.28 container (runtime/Dockerfile.neuron-multinode)."""

from __future__ import annotations

from pathlib import Path

from aws_cdk import IgnoreMode
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_ecs as ecs
from constructs import Construct

from contract import Engine
from contract.neuron import image_for
from contract.node_boot import EFA_INSTALLER

REPO_ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = "runtime/Dockerfile"
# The build context is the repository root (the image needs runtime/, contract/ and the lock
# file), so the asset excludes everything else: synth copies this directory into cdk.out on every
# run, and a stray .venv or model cache would make that slow and the image hash unstable. Same
# set as the repository's .dockerignore (which CDK also reads), so `docker build` agrees; CDK
# stages that file into the asset too, so its text is part of the image hash.
ASSET_EXCLUDE = [
    "*",
    "!runtime/",
    "!contract/",
    "!constraints.txt",
    "**/__pycache__",
    "**/*.pyc",
    "**/.pytest_cache",
]


def _asset(
    scope: Construct, construct_id: str, dockerfile: str, build_args: dict[str, str] | None = None
) -> ecs.ContainerImage:
    """The image built at `cdk deploy` from `dockerfile`, with the repository root as context."""
    asset = ecr_assets.DockerImageAsset(
        scope,
        construct_id,
        directory=str(REPO_ROOT),
        file=dockerfile,
        build_args=build_args,
        exclude=ASSET_EXCLUDE,
        ignore_mode=IgnoreMode.DOCKER,
        platform=ecr_assets.Platform.LINUX_AMD64,
    )
    return ecs.ContainerImage.from_docker_image_asset(asset)


def node_image(scope: Construct, *, image_uri: str | None) -> ecs.ContainerImage:
    """One image per stack: a registry image if configured, else the runtime/ asset."""
    if image_uri:
        return ecs.ContainerImage.from_registry(image_uri)
    return _asset(scope, "RuntimeImage", DOCKERFILE)


def unit_dockerfile(*, engine: str, nodes_per_unit: int) -> str:
    """Units on the `neuron` engine need the AWS Neuron vLLM image of their size's mode; the
    `reference` and `echo` engines need our CPU image (the Neuron images' transformers is not the
    one they are tested with)."""
    if engine == Engine.NEURON:
        return image_for(nodes_per_unit).dockerfile
    return DOCKERFILE


# One construct id per Dockerfile, so a stack never builds the same image twice.
_ASSET_IDS = {
    image_for(1).dockerfile: "NeuronRuntimeImage",
    image_for(2).dockerfile: "NeuronMultiNodeRuntimeImage",
}


# The multi-node image installs the EFA installer the nodes' boot installs, at the same pins
# (contract/node_boot.py); the Dockerfile's own defaults are kept equal to them by its test.
_BUILD_ARGS = {
    image_for(2).dockerfile: {
        "EFA_INSTALLER_VERSION": EFA_INSTALLER.version,
        "EFA_INSTALLER_SHA256": EFA_INSTALLER.sha256,
    },
}


# Where runtime/Dockerfile's BUILTIN_MODEL=smollm2 step converts SmolLM2 to (its FLOTILLA_CACHE_DIR plus
# runtime/models/smollm2.py CHECKPOINT_NAME; tests/stacks/test_staging.py keeps the three in step).
BAKED_MODEL_DIRS = {"smollm2": "/opt/flotilla/models/smollm2-135m-instruct-fp32"}


def builtin_model_setting(builtin: str) -> str:
    """FLOTILLA_MODEL for a built-in model: tiny is generated in the node; smollm2 is baked in the image."""
    return BAKED_MODEL_DIRS.get(builtin, builtin)


def unit_image(
    scope: Construct, *, image_uri: str | None, engine: str, nodes_per_unit: int, builtin_model: str = ""
) -> ecs.ContainerImage:
    """The image a unit's node containers run: the configured URI, else the matching asset (with the
    built-in model baked in when one needs it)."""
    dockerfile = unit_dockerfile(engine=engine, nodes_per_unit=nodes_per_unit)
    if not image_uri and builtin_model in BAKED_MODEL_DIRS:
        return _asset(scope, "StagingRuntimeImage", DOCKERFILE, build_args={"BUILTIN_MODEL": builtin_model})
    if image_uri or dockerfile == DOCKERFILE:
        return node_image(scope, image_uri=image_uri)
    return _asset(scope, _ASSET_IDS[dockerfile], dockerfile, build_args=_BUILD_ARGS.get(dockerfile))
