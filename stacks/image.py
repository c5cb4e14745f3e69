"""The container images flotilla tasks run: a prebuilt URI from the config, or an asset built at
`cdk deploy` (synth only copies and hashes): runtime/Dockerfile for the router and CPU engines,
runtime/Dockerfile.neuron (AWS's vLLM Neuron container plus our runtime) for trn1 units on the
`neuron` engine."""

from __future__ import annotations

from pathlib import Path

from aws_cdk import IgnoreMode
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_ecs as ecs
from constructs import Construct

REPO_ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = "runtime/Dockerfile"
NEURON_DOCKERFILE = "runtime/Dockerfile.neuron"
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


def _asset(scope: Construct, construct_id: str, dockerfile: str) -> ecs.ContainerImage:
    """The image built at `cdk deploy` from `dockerfile`, with the repository root as context."""
    asset = ecr_assets.DockerImageAsset(
        scope,
        construct_id,
        directory=str(REPO_ROOT),
        file=dockerfile,
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


def unit_dockerfile(*, instance_type: str, engine: str) -> str:
    """trn1 units serving with the `neuron` engine need AWS's Neuron vLLM image; the `reference`
    engine needs our CPU image (the Neuron image's transformers is not the one it is tested with)."""
    if instance_type.startswith("trn1") and engine == "neuron":
        return NEURON_DOCKERFILE
    return DOCKERFILE


def unit_image(scope: Construct, *, image_uri: str | None, instance_type: str, engine: str) -> ecs.ContainerImage:
    """The image a unit's node containers run: the configured URI, else the matching asset."""
    dockerfile = unit_dockerfile(instance_type=instance_type, engine=engine)
    if image_uri or dockerfile == DOCKERFILE:
        return node_image(scope, image_uri=image_uri)
    return _asset(scope, "NeuronRuntimeImage", dockerfile)
