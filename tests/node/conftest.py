"""Fixtures for node runtime tests: one shared two-member unit on the `tiny` model."""

from __future__ import annotations

import pytest

import contract

from node_harness import Unit


@pytest.fixture(scope="session")
def shared_unit(tmp_path_factory):
    unit = Unit(tmp_path_factory.mktemp("shared-unit"), **{contract.ENV_CELL_ID: "cell-t"}).start()
    try:
        unit.wait_ready(timeout=180)
    except AssertionError:
        logs = unit.dump_logs()
        unit.stop()
        raise AssertionError("the shared unit did not become ready:\n" + logs) from None
    yield unit
    unit.stop()
