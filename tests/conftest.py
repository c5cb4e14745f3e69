"""Makes tests/ importable as a path root, so every suite shares its helpers (testnet.py for free
ports, nodeproc.py for real unit members), and holds the fixtures every suite may use."""

from __future__ import annotations

import leftovers
import pytest
from nodeproc import Unit
from s3_fixture import s3  # noqa: F401 - registers the moto bucket fixture for every suite


def pytest_addoption(parser):
    parser.addoption(
        "--long",
        action="store_true",
        help="run the long form of soak tests (the chaos test: thousands of requests; also FLOTILLA_CHAOS_LONG=1)",
    )


@pytest.fixture(autouse=True)
def nothing_left_running():
    """Fails the test that leaves a thread or a process running, or torch's thread count changed,
    after its own fixtures are torn down (tests/leftovers.py): what one test leaves behind slows
    every test after it. Stop it in the fixture or test that started it. Module- and session-scoped
    fixtures are set up before this snapshot and torn down after this check, so theirs are not
    counted."""
    before = leftovers.snapshot()
    yield
    found, pids = leftovers.left_behind(before)
    leftovers.kill(pids)
    if found:
        pytest.fail("left running after the test:\n  " + "\n  ".join(found), pytrace=False)


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
