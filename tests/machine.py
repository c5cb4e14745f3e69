"""Sharing the machine between the suite's workers (pytest-xdist): a test marked `whole_machine` runs
with no other test beside it, the others side by side (tests/conftest.py, pytest_runtest_protocol).

Files are handed out whole, files that share an expensive session fixture together, and the
whole-machine tests as one unit of work, first (`scope`).

Two flock(2) locks in the run's folder, which every worker of one run shares: every test holds the
run lock shared, a whole-machine test holds it alone. A whole-machine test holds the gate while it
waits for the run lock, and the others take the gate (shared, a moment) before the run lock, so tests
that start while it waits queue behind it instead of keeping the run lock shared for ever: Linux's
flock grants a shared lock whenever no exclusive one is held, whoever waited first.

And each worker computes on its share of the cores (share_cores).
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


class Share:
    """One worker's hold on the machine, across its tests: `take(whole=...)` blocks until the test may
    run, `give_back()` lets the others in. A run of whole-machine tests keeps it between them (the
    worker takes it once, conftest.py), so no other test gets in between and each of them does not wait
    again for a test beside it to end."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.held: tuple | None = None  # the open gate and lock files while held
        self.whole = False

    def take(self, *, whole: bool) -> None:
        gate, lock = open(self.run_dir / "machine.gate", "a"), open(self.run_dir / "machine.lock", "a")
        if whole:
            fcntl.flock(gate, fcntl.LOCK_EX)
            fcntl.flock(lock, fcntl.LOCK_EX)
        else:
            fcntl.flock(gate, fcntl.LOCK_SH)
            fcntl.flock(lock, fcntl.LOCK_SH)
            fcntl.flock(gate, fcntl.LOCK_UN)
        self.held, self.whole = (gate, lock), whole

    def give_back(self) -> None:
        for f in self.held or ():
            f.close()  # closing the files releases what is held
        self.held, self.whole = None, False


# The whole-machine tests go to one worker as one unit of work, ahead of every file: they run one after
# the other at the start, holding the machine throughout, while the other worker waits behind them
# once. Each worker writes the node ids it collected with the mark here (the same list from each), and
# the scheduler, in the controlling process, reads it once every worker's collection is in.
WHOLE_MACHINE = "whole_machine"
WHOLE_MACHINE_LIST = "whole_machine.json"


def write_whole_machine(run_dir: Path, nodeids: list[str]) -> None:
    tmp = run_dir / f"{WHOLE_MACHINE_LIST}.{os.getpid()}"
    tmp.write_text(json.dumps(sorted(nodeids)))
    tmp.replace(run_dir / WHOLE_MACHINE_LIST)  # atomic: the scheduler never reads half of it


def read_whole_machine(run_dir: Path) -> frozenset[str]:
    try:
        return frozenset(json.loads((run_dir / WHOLE_MACHINE_LIST).read_text()))
    except FileNotFoundError:
        return frozenset()


# Test files that share an expensive session fixture: pytest-xdist hands them to one worker together,
# so the fixture is made once in the run rather than once in each worker that runs one of them (a
# session fixture lives in its worker's process). The 20,480-chip example's synth takes 16-20 s;
# with these files spread over both workers it was made twice in most runs. tests/lint checks that
# every file naming the fixture is listed.
ONE_WORKER: dict[str, tuple[str, ...]] = {
    "fleet_synth": (
        "tests/stacks/test_aws_rules.py",
        "tests/stacks/test_cell_stack.py",
        "tests/stacks/test_cfn_lint.py",
        "tests/stacks/test_discovery_layout.py",
        "tests/stacks/test_hard_limits.py",
        "tests/stacks/test_layouts_the_node_accepts.py",
        "tests/stacks/test_node_boot.py",
        "tests/stacks/test_rollout_waves.py",
    ),
}
_SHARED = {path: fixture for fixture, paths in ONE_WORKER.items() for path in paths}


def scope(nodeid: str, whole_machine: frozenset[str] = frozenset()) -> str:
    """What a worker is handed at once: the whole-machine tests, the test's file, or the files sharing a
    fixture with it."""
    if nodeid in whole_machine:
        return WHOLE_MACHINE
    path = nodeid.split("::", 1)[0]
    return _SHARED.get(path, path)


def core_count() -> int:
    """The cores this process may run on (its affinity, which a container or taskset narrows)."""
    return len(os.sched_getaffinity(0)) or 1


def share_cores(env: dict[str, str] | None = None, cores: int | None = None) -> None:
    """Each pytest-xdist worker computes on its share of the cores, and so does every process it starts
    that does not choose its own count: OMP_NUM_THREADS, which torch reads when it is first imported
    (tests/conftest.py calls this before any test module imports torch). torch's default, a thread per
    core, puts two busy threads per worker on cores the other worker needs, and OpenMP spins between
    parallel regions on the time it takes. Alone, the in-process engine tests take the same wall time
    on one thread as on two with about a quarter less CPU (docs/benchmarks.md, "Test suite"). A run in
    one process (`-n 0`) and a count set by the caller are left as they are."""
    env = os.environ if env is None else env
    workers = int(env.get("PYTEST_XDIST_WORKER_COUNT") or 0)
    if workers > 0 and "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(max(1, (cores or core_count()) // workers))


@dataclass
class Waits:
    """What sharing the machine cost one worker: the tests that waited for it, and how long."""

    whole: int = 0  # whole-machine tests that waited for the tests beside them to end
    whole_s: float = 0.0
    beside: int = 0  # other tests that waited behind a whole-machine test
    beside_s: float = 0.0
    # The worker's own timeline, in seconds: from its start to its first test (start-up and collection),
    # and when it ran out of files (time.time(); the summary compares the workers').
    first_test_s: float = 0.0
    done_at: float = 0.0

    def note(self, whole: bool, seconds: float, floor_s: float = 0.05) -> None:
        if seconds < floor_s:  # taking a free lock: no wait
            return
        if whole:
            self.whole, self.whole_s = self.whole + 1, self.whole_s + seconds
        else:
            self.beside, self.beside_s = self.beside + 1, self.beside_s + seconds


def waits_line(per_worker: Iterable[Waits]) -> str | None:
    """One line for the run's summary, or None when no test waited."""
    total = Waits()
    for w in per_worker:
        total.whole += w.whole
        total.whole_s += w.whole_s
        total.beside += w.beside
        total.beside_s += w.beside_s
    if not total.whole and not total.beside:
        return None
    return (
        f"machine sharing: {total.whole} whole-machine test(s) waited {total.whole_s:.1f} s for the tests "
        f"beside them to end; {total.beside} test(s) waited {total.beside_s:.1f} s behind whole-machine tests"
    )


def timeline_line(per_worker: Iterable[Waits]) -> str | None:
    """How the workers' time went outside their tests: each one's start-up before its first test, and how
    long each sat idle at the end while another still ran (a run shared out well ends together)."""
    workers = [w for w in per_worker if w.done_at]
    if len(workers) < 2:
        return None
    last = max(w.done_at for w in workers)
    starts = " / ".join(f"{w.first_test_s:.1f}" for w in workers)
    idle = " / ".join(f"{last - w.done_at:.1f}" for w in workers)
    return f"workers: first test after {starts} s; idle at the end {idle} s"
