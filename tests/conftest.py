"""Makes tests/ importable as a path root, so every suite shares its helpers (testnet.py for free
ports, nodeproc.py for real unit members), and holds the fixtures every suite may use."""

from __future__ import annotations

import pytest
from nodeproc import Unit
from s3_fixture import s3  # noqa: F401 - registers the moto bucket fixture for every suite


def pytest_addoption(parser):
    parser.addoption(
        "--long",
        action="store_true",
        help="run the long form of soak tests (the chaos test: thousands of requests; also FLOTILLA_CHAOS_LONG=1)",
    )


@pytest.fixture
def new_unit(tmp_path):
    """new_unit(**settings) -> a nodeproc.Unit, not yet started, logging under tmp_path. Every unit
    made this way is stopped at teardown, whatever the test did to it."""
    units: list[Unit] = []

    def make(**settings) -> Unit:
        unit = Unit(tmp_path, **settings)
        units.append(unit)
        return unit

    yield make
    for unit in units:
        unit.stop()
