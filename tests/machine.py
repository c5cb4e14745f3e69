"""Sharing the machine between the suite's workers (pytest-xdist): a test marked `whole_machine` runs
with no other test beside it, the others side by side (tests/conftest.py, pytest_runtest_protocol).

Two flock(2) locks in the run's folder, which every worker of one run shares: every test holds the
run lock shared, a whole-machine test holds it alone. A whole-machine test holds the gate while it
waits for the run lock, and the others take the gate (shared, a moment) before the run lock, so tests
that start while it waits queue behind it instead of keeping the run lock shared for ever: Linux's
flock grants a shared lock whenever no exclusive one is held, whoever waited first.
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def share(run_dir: Path, *, whole: bool) -> Iterator[None]:
    """Holds the machine for one test: alone if `whole`, else beside other tests that are not."""
    with open(run_dir / "machine.gate", "a") as gate, open(run_dir / "machine.lock", "a") as lock:
        if whole:
            fcntl.flock(gate, fcntl.LOCK_EX)
            fcntl.flock(lock, fcntl.LOCK_EX)
        else:
            fcntl.flock(gate, fcntl.LOCK_SH)
            fcntl.flock(lock, fcntl.LOCK_SH)
            fcntl.flock(gate, fcntl.LOCK_UN)
        yield  # closing the files releases what is held
