"""tests/machine.py: how the suite's workers share the machine (a whole-machine test runs alone, and each
worker computes on its share of the cores)."""

from __future__ import annotations

import fcntl
import os
import sys
import threading
import time

import machine


def _holder(run_dir, whole: bool, name: str, order: list[str], inside: threading.Event, leave: threading.Event):
    def hold() -> None:
        held = machine.Share(run_dir)
        held.take(whole=whole)
        try:
            order.append(name)
            inside.set()
            assert leave.wait(30)
        finally:
            held.give_back()

    t = threading.Thread(target=hold, name=f"share-{name}")
    t.start()
    return t


def _gate_held_alone(run_dir) -> bool:
    with open(run_dir / "machine.gate", "a") as gate:
        try:
            fcntl.flock(gate, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        return False


def _wait(predicate, what: str) -> None:
    deadline = time.monotonic() + 10
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_tests_that_are_not_whole_machine_run_side_by_side(tmp_path):
    order: list[str] = []
    ins = [threading.Event(), threading.Event()]
    leave = threading.Event()
    threads = [_holder(tmp_path, False, f"t{i}", order, ins[i], leave) for i in range(2)]
    try:
        assert ins[0].wait(10) and ins[1].wait(10), "the second test waited for the first"
    finally:
        leave.set()
        for t in threads:
            t.join(10)


def test_a_whole_machine_test_waits_for_the_running_one_and_tests_started_meanwhile_wait_for_it(tmp_path):
    order: list[str] = []
    first_in, whole_in, later_in = threading.Event(), threading.Event(), threading.Event()
    first_leave, whole_leave, later_leave = threading.Event(), threading.Event(), threading.Event()
    threads = [_holder(tmp_path, False, "running", order, first_in, first_leave)]
    try:
        assert first_in.wait(10)
        threads.append(_holder(tmp_path, True, "whole", order, whole_in, whole_leave))
        _wait(lambda: _gate_held_alone(tmp_path), "the whole-machine test to hold the gate")
        threads.append(_holder(tmp_path, False, "later", order, later_in, later_leave))
        time.sleep(0.2)  # time for it to get in, were the gate not there
        assert not whole_in.is_set(), "the whole-machine test started beside a running test"
        first_leave.set()
        assert whole_in.wait(10)
        assert not later_in.is_set(), "a test started beside the whole-machine test"
        whole_leave.set()
        assert later_in.wait(10)
        assert order == ["running", "whole", "later"]
    finally:
        for e in (first_leave, whole_leave, later_leave):
            e.set()
        for t in threads:
            t.join(10)


def test_each_worker_gets_its_share_of_the_cores_and_a_set_count_or_one_process_is_left_alone():
    two_workers = {"PYTEST_XDIST_WORKER_COUNT": "2"}
    machine.share_cores(two_workers, cores=2)
    assert two_workers["OMP_NUM_THREADS"] == "1"
    four_of_eight = {"PYTEST_XDIST_WORKER_COUNT": "2"}
    machine.share_cores(four_of_eight, cores=8)
    assert four_of_eight["OMP_NUM_THREADS"] == "4"
    many = {"PYTEST_XDIST_WORKER_COUNT": "3"}
    machine.share_cores(many, cores=2)
    assert many["OMP_NUM_THREADS"] == "1"  # never zero threads
    chosen = {"PYTEST_XDIST_WORKER_COUNT": "2", "OMP_NUM_THREADS": "2"}
    machine.share_cores(chosen, cores=2)
    assert chosen["OMP_NUM_THREADS"] == "2"
    alone: dict[str, str] = {}
    machine.share_cores(alone, cores=2)
    assert "OMP_NUM_THREADS" not in alone


def test_torch_in_this_process_computes_on_the_count_the_suite_set():
    # conftest.py shares the cores before any test module imports torch: a test module that imported
    # torch first, or a conftest that set the count after, would leave torch at a thread per core.
    import torch

    assert "torch" in sys.modules
    if "OMP_NUM_THREADS" in os.environ:
        assert torch.get_num_threads() == int(os.environ["OMP_NUM_THREADS"])
    else:  # one process (`-n 0`): torch's default, a thread per core
        assert torch.get_num_threads() == (os.cpu_count() or 1)


def test_the_summary_adds_every_workers_waits_and_leaves_out_locks_taken_free():
    a, b = machine.Waits(), machine.Waits()
    a.note(True, 12.0)
    a.note(False, 0.01)  # a free lock: not a wait
    b.note(False, 3.5)
    b.note(False, 1.5)
    b.note(True, 0.5)
    assert machine.waits_line([a, b]) == (
        "machine sharing: 2 whole-machine test(s) waited 12.5 s for the tests beside them to end; "
        "2 test(s) waited 5.0 s behind whole-machine tests"
    )
    assert machine.waits_line([machine.Waits()]) is None


def test_the_summary_gives_each_workers_start_up_and_its_idle_time_at_the_end():
    a = machine.Waits(first_test_s=21.04, done_at=1000.0)
    b = machine.Waits(first_test_s=19.5, done_at=1042.25)
    assert machine.timeline_line([a, b]) == "workers: first test after 21.0 / 19.5 s; idle at the end 42.2 / 0.0 s"
    assert machine.timeline_line([a]) is None  # one worker: nothing to compare
    assert machine.timeline_line([a, machine.Waits()]) is None  # a worker that never reported


def test_a_run_of_single_tests_starts_no_worker_and_a_wider_run_leaves_the_count_to_pytest_xdist(pytestconfig):
    import types
    from pathlib import Path

    # tests/conftest.py as pytest registered it (several conftest modules share the name "conftest")
    top = str(Path(__file__).resolve().parents[1] / "conftest.py")
    (conftest,) = [p for p in pytestconfig.pluginmanager.get_plugins() if getattr(p, "__file__", None) == top]
    one_test = types.SimpleNamespace(args=["tests/lint/test_machine_share.py::test_x"])
    assert conftest.pytest_xdist_auto_num_workers(one_test) == 0
    assert conftest.pytest_xdist_auto_num_workers(types.SimpleNamespace(args=["tests"])) is None


def test_the_workers_take_the_files_in_the_suites_order():
    # With --dist loadfile, pytest-xdist 3.8 sorts the files by how many tests each has unless told
    # not to (xdist/scheduler/loadscope.py, `loadscopereorder`): the longest-first and whole-machine-last
    # order of tests/conftest.py would be undone.
    import configparser
    from pathlib import Path

    ini = configparser.ConfigParser()
    ini.read(Path(__file__).resolve().parents[2] / "pytest.ini")
    addopts = ini["pytest"]["addopts"].split()
    assert "loadfile" in addopts and "--no-loadscope-reorder" in addopts


def test_files_that_share_the_fleets_synth_are_handed_out_together():
    # A file that names the fixture but is not in the group makes the 20,480-chip synth again on the
    # other worker: 16-20 s.
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    for fixture, paths in machine.ONE_WORKER.items():
        naming = {str(p.relative_to(root)) for p in (root / "tests").rglob("test_*.py") if fixture in p.read_text()}
        assert naming == set(paths), f"{fixture}: add {sorted(naming - set(paths))}, drop {sorted(set(paths) - naming)}"
    assert machine.scope("tests/stacks/test_cfn_lint.py::test_x") == machine.scope("tests/stacks/test_aws_rules.py::t")
    assert machine.scope("tests/node/test_node_api.py::test_x[a::b]") == "tests/node/test_node_api.py"


def test_the_scheduler_hands_out_files_and_the_fleets_files_as_one(pytestconfig):
    from pathlib import Path

    top = str(Path(__file__).resolve().parents[1] / "conftest.py")
    (conftest,) = [p for p in pytestconfig.pluginmanager.get_plugins() if getattr(p, "__file__", None) == top]
    # Only the scope is under test here: a whole scheduler needs pytest-xdist's worker settings.
    sched = conftest.FilesSharingFixtures.__new__(conftest.FilesSharingFixtures)
    assert sched._split_scope("tests/stacks/test_hard_limits.py::test_a") == sched._split_scope(
        "tests/stacks/test_node_boot.py::test_b[x]"
    )
    assert sched._split_scope("tests/node/test_node_api.py::test_a") == "tests/node/test_node_api.py"
    sched.whole_machine = frozenset({"tests/node/test_node_api.py::test_b"})
    assert sched._split_scope("tests/node/test_node_api.py::test_b") == machine.WHOLE_MACHINE


def test_a_worker_that_keeps_the_machine_between_whole_machine_tests_lets_no_test_in_between(tmp_path):
    mine = machine.Share(tmp_path)
    mine.take(whole=True)  # the first of a run of whole-machine tests
    other_in, leave = threading.Event(), threading.Event()
    other = _holder(tmp_path, False, "other", [], other_in, leave)
    try:
        _wait(lambda: _gate_held_alone(tmp_path), "the whole-machine test to hold the gate")
        time.sleep(0.2)  # the next whole-machine test runs on the same hold: nothing gets in meanwhile
        assert not other_in.is_set(), "a test started between two whole-machine tests"
        mine.give_back()  # after the last of them
        assert other_in.wait(10)
        assert mine.held is None and not mine.whole
    finally:
        mine.give_back()
        leave.set()
        other.join(10)


def test_the_whole_machine_tests_are_one_unit_of_work_whatever_their_files(tmp_path):
    ids = ["tests/a/test_x.py::test_whole", "tests/b/test_y.py::test_whole[4]"]
    assert machine.read_whole_machine(tmp_path) == frozenset()  # a run whose workers wrote none
    machine.write_whole_machine(tmp_path, ids)
    whole = machine.read_whole_machine(tmp_path)
    assert whole == frozenset(ids)
    assert {machine.scope(i, whole) for i in ids} == {machine.WHOLE_MACHINE}
    assert machine.scope("tests/b/test_y.py::test_whole[2]", whole) == "tests/b/test_y.py"
