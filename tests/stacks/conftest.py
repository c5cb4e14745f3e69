"""Shared fixtures for the stack tests: each deployment is synthesized once per session.

Other stack tests (Front, Observability) reuse `default_synth` and the helpers in
synth_helpers.py / moto_cfn.py (importable because pytest puts this directory on sys.path).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from synth_helpers import config_with, default_config, synthesize  # noqa: E402


@pytest.fixture(scope="session")
def default_synth(tmp_path_factory):
    """The default deployment (cdk.json): Network + Cell-0 with one unit of 2 trn1.32xlarge."""
    return synthesize(default_config(), tmp_path_factory.mktemp("cdk-default"))


@pytest.fixture(scope="session")
def trn1n_synth(tmp_path_factory):
    """One unit of 2 trn1n.32xlarge: 16 EFA interfaces per instance."""
    return synthesize(config_with(instance_type="trn1n.32xlarge"),
                      tmp_path_factory.mktemp("cdk-trn1n"))


@pytest.fixture(scope="session")
def fleet_synth(tmp_path_factory):
    """The 20,480-chip example: 160 units of 8 trn1.32xlarge in 8 cells."""
    from stacks.config import load_config
    from synth_helpers import cdk_json_context
    config = load_config(cdk_json_context()["flotilla"],
                         str(REPO_ROOT / "examples" / "fleet-20k-chips.yaml"))
    return synthesize(config, tmp_path_factory.mktemp("cdk-fleet"))
