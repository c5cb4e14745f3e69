"""The suite's check for what a test leaves running (tests/leftovers.py, run after every test by
tests/conftest.py) sees each kind of leftover, and not what the test process keeps by design."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import leftovers


def test_a_thread_still_running_after_the_test_is_named():
    before = leftovers.snapshot()
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, name="step-watchdog", daemon=True)
    thread.start()
    try:
        found, pids = leftovers.left_behind(before, grace_s=0)
        assert any("step-watchdog" in line for line in found), found
        assert pids == []
    finally:
        stop.set()
        thread.join()
    assert leftovers.left_behind(before, grace_s=0) == ([], [])


def test_a_child_process_still_running_is_named_and_killed():
    before = leftovers.snapshot()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        found, pids = leftovers.left_behind(before, grace_s=0)
        assert pids == [child.pid]
        assert any(f"pid {child.pid}" in line and "time.sleep(60)" in line for line in found), found
        leftovers.kill(pids)
        assert child.wait(timeout=10) == -9
    finally:
        child.kill()
        child.wait()
    assert leftovers.left_behind(before, grace_s=0) == ([], [])


def test_a_process_in_its_own_session_whose_parent_exited_is_still_found():
    # The shape of a unit member's engine: started in a session of its own by a process that then
    # died, so it is re-parented away from the test process and in no process group of the test's.
    before = leftovers.snapshot()
    launcher = subprocess.run(
        [
            sys.executable,
            "-c",
            "import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],"
            " start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); print(p.pid)",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    orphan = int(launcher.stdout)
    try:
        found, pids = leftovers.left_behind(before, grace_s=0)
        assert pids == [orphan], found
        assert os.getpgid(orphan) == orphan
    finally:
        leftovers.kill([orphan])
    assert leftovers.left_behind(before, grace_s=2) == ([], [])


def test_the_resource_tracker_the_test_process_keeps_is_not_a_leftover():
    before = leftovers.snapshot()
    tracker = subprocess.Popen(
        [sys.executable, "-c", "from multiprocessing.resource_tracker import main; import time; time.sleep(60)"]
    )
    try:
        # Until the child has exec'd, its command line is empty (a fork of this process, not yet the
        # tracker): on a busy machine that lasts long enough to be seen.
        deadline = time.monotonic() + 30
        while b"resource_tracker" not in Path(f"/proc/{tracker.pid}/cmdline").read_bytes():
            assert time.monotonic() < deadline, "the tracker never started"
            time.sleep(0.01)
        assert leftovers.left_behind(before, grace_s=0) == ([], [])
    finally:
        tracker.kill()
        tracker.wait()


def test_what_a_fixtures_older_process_starts_during_the_test_is_its_owners_to_stop():
    # A session fixture's unit member that restarts its engine during a test: the engine is new,
    # its parent is not, and killing it would break the unit for every later test.
    member = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys; sys.stdin.readline();"
            " p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); print(p.pid, flush=True);"
            " p.wait()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    engine = None
    try:
        before = leftovers.snapshot()
        member.stdin.write("start the engine\n")
        member.stdin.flush()
        engine = int(member.stdout.readline())
        assert leftovers.left_behind(before, grace_s=0) == ([], [])
    finally:
        member.kill()
        member.wait()
        if engine is not None:
            leftovers.kill([engine])
