"""Fixtures for node runtime tests: one shared two-member unit on the `tiny` model."""

from __future__ import annotations

import pytest
from nodeproc import Unit

import contract


@pytest.fixture(scope="session")
def shared_unit(tmp_path_factory):
    unit = Unit(tmp_path_factory.mktemp("shared-unit"), **{contract.ENV_CELL_ID: "cell-t"})
    try:
        yield unit.start().wait_ready(timeout=180)
    finally:
        unit.stop()
