"""Makes tests/ importable as a path root, so every suite shares its helpers (testnet.py for free
ports, nodeproc.py for real unit members), and holds the fixtures every suite may use."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import machine

STARTED = time.monotonic()  # this process's start, near enough: conftest is imported before collection
machine.share_cores()  # before any test module imports torch, which reads it then

import leftovers  # noqa: E402
import pytest  # noqa: E402
from nodeproc import Unit  # noqa: E402
from s3_fixture import s3  # noqa: E402, F401 - registers the moto bucket fixture for every suite
from xdist.scheduler import LoadFileScheduling  # noqa: E402


def pytest_addoption(parser):
    parser.addoption(
        "--long",
        action="store_true",
        help="run the long form of soak tests (the chaos test: thousands of requests; also FLOTILLA_CHAOS_LONG=1)",
    )


# The suite runs on every core (pytest.ini: `-n auto --dist loadfile`, pytest-xdist): each worker takes
# whole files, so a file's module fixtures are made once. The longest files go first, longest first
# (seconds in two fresh-clone runs on 2 cores and three workers, 2026-12-07: their order is what counts),
# so the workers finish together instead of one starting a long file when the others are nearly done.
# pytest.ini passes --no-loadscope-reorder, without which pytest-xdist would hand the files out by how
# many tests each has instead ("reorder tests by number of tests per scope", its --help;
# xdist/scheduler/loadscope.py at 3.8.0). Only the order changes: a file not named here runs after these,
# in collection order, and a stale entry costs balance, never a test.
LONGEST_FIRST = (
    "tests/stacks/test_updates.py",  # 140 s
    "tests/benchmarks/test_bench_commands.py",  # 139 s
    "tests/neuron/test_neuron_node.py",  # 118 s
    "tests/rehearsal/test_rehearsal.py",  # 110 s
    "tests/router/test_router_resume.py",  # 95 s
    "tests/node/test_openai_compat.py",  # 66 s
    "tests/stacks/test_cfn_lint.py",  # 60 s
    "tests/router/test_router_acceptance.py",  # 60 s
    "tests/node/test_node_unit_lifecycle.py",  # 54 s
    "tests/stacks/test_aws_rules.py",  # 49 s
    "tests/engine/test_engine.py",  # 49 s
    "tests/node/test_node_request_integrity.py",  # 42 s
    "tests/engine/test_models.py",  # 41 s
    "tests/neuron/test_neuron_openai_compat.py",  # 40 s
    "tests/engine/test_collectives.py",  # 39 s
    "tests/engine/test_failure.py",  # 33 s
    "tests/neuron/test_neuron_spmd.py",  # 32 s
    "tests/router/test_request_integrity_chaos.py",  # 30 s
    "tests/ops/test_ops_preflight.py",  # 30 s
    "tests/engine/test_exactness.py",  # 29 s
)


def pytest_collection_modifyitems(config, items):
    """Under the workers: the whole-machine tests first (one unit of work, tests/machine.py; those that
    read SmolLM2 last among them), then the longest files, longest first, then the rest. The
    whole-machine tests run one after the other on one worker, holding the machine throughout, so only
    the first waits for a test beside it to end: spread over their files, late in the run, eight of them
    waited 30-61 s in all for the tests beside them (the suite's "machine sharing" line)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):  # only where files are shared out (a plain run keeps its order)
        whole = [item.nodeid for item in items if _whole_machine(item)]
        machine.write_whole_machine(Path(config.option.basetemp).parent, whole)
        rank: dict[str, int] = {}  # a group of files that share a fixture goes where its first file would
        for i, path in enumerate(LONGEST_FIRST):
            rank.setdefault(machine.scope(path), i)

        def order(item) -> tuple[int, int]:
            if _whole_machine(item):
                return (0, 1 if _reads_smollm2(item) else 0)
            unit = machine.scope(item.nodeid)
            return (1 if unit in rank else 2, rank.get(unit, len(rank)))

        items.sort(key=order)  # stable: files stay whole, in collection order within each group


def _whole_machine(item) -> bool:
    return item.get_closest_marker("whole_machine") is not None


def _reads_smollm2(item) -> bool:
    """The test reads the converted SmolLM2 checkpoint: it asks for `smollm2_dir`, or runs a SmolLM2
    parameter of a module fixture that asks for it (whose id names the model). Among the whole-machine
    tests these come last: on a new machine `make test` converts the checkpoint beside the first ones
    (Makefile), and a test that needs it first would hold the machine while it waits for it."""
    return "smollm2_dir" in item.fixturenames or "smollm2" in getattr(getattr(item, "callspec", None), "id", "")


class FilesSharingFixtures(LoadFileScheduling):
    """--dist loadfile, except that the files of machine.ONE_WORKER go to one worker together and the
    whole-machine tests to one worker as a unit of their own."""

    whole_machine: frozenset[str] = frozenset()

    def schedule(self) -> None:
        if self.collection is None:  # the first call: every worker's collection is in
            # The run's folder, whose gwN subfolders pytest-xdist gives the workers as their basetemp
            # (read the same way in xdist/workermanage.py at 3.8.0).
            self.whole_machine = machine.read_whole_machine(self.config._tmp_path_factory.getbasetemp())
        super().schedule()

    def _split_scope(self, nodeid: str) -> str:
        return machine.scope(nodeid, self.whole_machine)


def pytest_xdist_make_scheduler(config, log):
    """The scheduler for pytest.ini's --dist loadfile (pytest-xdist hook; at 3.8.0 LoadFileScheduling
    groups the tests by the scope its `_split_scope` gives each node id, and LoadScopeScheduling.schedule
    splits the collection into those units once every worker's collection is in,
    xdist/scheduler/loadfile.py and loadscope.py). Any other --dist is pytest-xdist's own."""
    if config.getvalue("dist") != "loadfile":
        return None
    return FilesSharingFixtures(config, log)


def pytest_xdist_auto_num_workers(config):
    """`-n auto` (pytest.ini) starts no workers when every argument names single tests
    (`pytest path::test`): one test runs in this process, without a worker's start-up. Otherwise
    pytest-xdist decides (one worker per core, or PYTEST_XDIST_AUTO_NUM_WORKERS). A worker more than
    the cores was tried (docs/benchmarks.md, "Test suite"): faster on average, but a unit's ranks
    starved on two cores, and tests failed that pass on two workers."""
    if config.args and all("::" in arg for arg in config.args):
        return 0
    return None


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "whole_machine: the test spreads its work over every core (a unit, its router and a load on them): in a "
        "run on several workers it runs with no other test beside it",
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Under pytest-xdist, a test marked `whole_machine` runs with no other test beside it; the others
    run side by side (tests/machine.py). Beside another test on a 2-core machine, such a test gets half
    the cores it has alone, and its own timings (stall bounds, queue timeouts, a load's pace) with them.
    Taken around the whole test, setup included, so a wait for the machine is in no phase's duration;
    kept from one whole-machine test to the next."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        yield
        return
    global MACHINE
    if MACHINE is None:  # pytest-xdist gives each worker <run folder>/gwN
        MACHINE = machine.Share(Path(item.config.option.basetemp).parent)
    whole = _whole_machine(item)
    if not (whole and MACHINE.whole):  # not already held alone by the whole-machine test before
        asked = time.monotonic()
        if not WAITS.first_test_s:
            WAITS.first_test_s = asked - STARTED
        MACHINE.take(whole=whole)
        WAITS.note(whole, time.monotonic() - asked)
    try:
        yield
    finally:
        if not (whole and nextitem is not None and _whole_machine(nextitem)):
            MACHINE.give_back()


MACHINE: machine.Share | None = None  # this worker's hold on the machine

WAITS = machine.Waits()  # this worker's; sent to the controller at the end (pytest-xdist's workeroutput)


def pytest_sessionfinish(session):
    output = getattr(session.config, "workeroutput", None)  # set in a pytest-xdist worker only
    if output is not None:
        WAITS.done_at = time.time()
        output["machine_waits"] = dataclasses.asdict(WAITS)


def pytest_testnodedown(node, error):
    """The controller collects each worker's waits for the summary (pytest-xdist hook)."""
    waits = getattr(node, "workeroutput", {}).get("machine_waits")
    if waits:
        node.config.stash.setdefault(WORKER_WAITS, []).append(machine.Waits(**waits))


WORKER_WAITS = pytest.StashKey[list]()


def pytest_terminal_summary(terminalreporter, config):
    workers = config.stash.get(WORKER_WAITS, [])
    for line in (machine.waits_line(workers), machine.timeline_line(workers)):
        if line:
            terminalreporter.write_line(line)


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
