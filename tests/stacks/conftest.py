"""Shared fixtures for the stack tests: each deployment is synthesized once per session.

`deployment_synth` is the deployment both ways its front door can be configured, for the
deployment-wide checks (cfn-lint, cdk-nag, moto). Helpers live in synth_helpers.py / moto_cfn.py
(importable because pytest puts this directory on sys.path).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from synth_helpers import FRONT_DOORS, config_with, default_config, synthesize  # noqa: E402


@pytest.fixture(scope="session")
def default_synth(tmp_path_factory):
    """The default deployment (cdk.json): Network + Cell-0 with one unit of 1 trn1.32xlarge."""
    return synthesize(default_config(), tmp_path_factory.mktemp("cdk-default"))


@pytest.fixture(scope="session")
def https_front_door_synth(tmp_path_factory):
    """The "https" front door of FRONT_DOORS: a certificate, an alarm e-mail, internet-facing for one
    client range, and a prebuilt image (PREBUILT_IMAGE) for the router and every unit."""
    return synthesize(config_with(**FRONT_DOORS["https"]), tmp_path_factory.mktemp("cdk-https"))


@pytest.fixture(scope="session", params=list(FRONT_DOORS))
def deployment_synth(request):
    """The default deployment with each front door: "http-only" is cdk.json as shipped (no
    certificate, no alarm e-mail); "https" adds a certificate (443, with 80 redirecting to it)
    and an alarm e-mail."""
    return request.getfixturevalue({"http-only": "default_synth", "https": "https_front_door_synth"}[request.param])


@pytest.fixture(scope="session")
def trn1n_synth(tmp_path_factory):
    """One unit of 2 trn1n.32xlarge serving Llama-3.1-70B (its 64 heads split over the 64 NeuronCores): 16 EFA
    interfaces per instance, and the multi-member unit the stack tests check leader and follower tasks on."""
    from synth_helpers import LLAMA_70B

    config = config_with(instance_type="trn1n.32xlarge", nodes_per_unit=2, model=LLAMA_70B)
    return synthesize(config, tmp_path_factory.mktemp("cdk-trn1n"))


@pytest.fixture(scope="session")
def fleet_synth(tmp_path_factory):
    """The 20,480-chip example: 320 units of 4 trn1.32xlarge (Llama-3.1-405B) in 16 cells."""
    from synth_helpers import cdk_json_context

    from stacks.config import load_config

    config = load_config(cdk_json_context()["flotilla"], str(REPO_ROOT / "examples" / "fleet-20k-chips.yaml"))
    return synthesize(config, tmp_path_factory.mktemp("cdk-fleet"))


@pytest.fixture(scope="session")
def staging_synth(tmp_path_factory):
    """examples/staging.yaml: 3 units of 2 m6i.large in 2 cells, reference engine, SmolLM2 baked in."""
    from synth_helpers import cdk_json_context

    from stacks.config import load_config

    config = load_config(cdk_json_context()["flotilla"], str(REPO_ROOT / "examples" / "staging.yaml"))
    return synthesize(config, tmp_path_factory.mktemp("cdk-staging"))
