"""The container image every flotilla task runs (node and router): a prebuilt URI from the
config, or an asset built from runtime/Dockerfile at `cdk deploy` (synth only copies and hashes)."""

from __future__ import annotations

from pathlib import Path

from aws_cdk import IgnoreMode
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_ecs as ecs
from constructs import Construct

REPO_ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = "runtime/Dockerfile"
# The build context is the repository root (the image needs runtime/, contract/ and the lock
# file), so the asset excludes everything else: synth copies this directory into cdk.out on every
# run, and a stray .venv or model cache would make that slow and the image hash unstable. Same
# set as the repository's .dockerignore (which CDK also reads), so `docker build` agrees.
ASSET_EXCLUDE = [
    "*",
    "!runtime/",
    "!contract/",
    "!constraints.txt",
    "**/__pycache__",
    "**/*.pyc",
    "**/.pytest_cache",
]


def node_image(scope: Construct, *, image_uri: str | None) -> ecs.ContainerImage:
    """One image per stack: a registry image if configured, else the runtime/ asset."""
    if image_uri:
        return ecs.ContainerImage.from_registry(image_uri)
    asset = ecr_assets.DockerImageAsset(
        scope, "RuntimeImage", directory=str(REPO_ROOT), file=DOCKERFILE,
        exclude=ASSET_EXCLUDE, ignore_mode=IgnoreMode.DOCKER,
        platform=ecr_assets.Platform.LINUX_AMD64)
    return ecs.ContainerImage.from_docker_image_asset(asset)
