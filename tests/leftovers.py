"""What a test leaves running: Python threads, processes it started (children, and their
descendants after a parent died and they were re-parented to init), torch's thread count.

Something one test leaves behind slows every later test in the same process (a spinning step
thread, a unit's engine that lost its parent, a torch thread count turned down), so the suite
became slower together than its files are alone. tests/conftest.py snapshots before each test and
fails the test whose teardown leaves anything of this kind.

Processes are recognised two ways, both from /proc (Linux, as the suites are): a descendant of
this process by parent pid, or a process whose environment carries MARK with this process's pid
(set in os.environ here, so every child that inherits the environment carries it, whatever its
process group or session, and keeps it after its parent dies).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

MARK = "FLOTILLA_TEST_PARENT"  # in the environment of every process a test starts (if it inherits it)
os.environ[MARK] = str(os.getpid())
_MARK_BYTES = f"{MARK}={os.getpid()}".encode()

# Kept for the life of the test process, started by whichever test needs them first; not a leak:
ALLOWED_COMMANDS = (
    # multiprocessing's resource tracker: one per process, started on first use of shared memory
    # or a semaphore, lives until the interpreter exits (Python docs, multiprocessing "resource
    # tracker").
    "from multiprocessing.resource_tracker import main",
    # jsii's kernel: the Node.js process behind aws_cdk, started on first import and kept until
    # the interpreter exits (jsii-runtime, jsii/_kernel/providers/process.py).
    "jsii-runtime",
    # multiprocessing's fork server, likewise one per process once a test uses the forkserver
    # start method (Python docs, multiprocessing "Contexts and start methods").
    "from multiprocessing.forkserver import main",
)
ALLOWED_THREADS = (
    # jsii reads its kernel's stderr on a thread for the life of the kernel (same file).
    "process.stderr_sink",
)
GRACE_S = 5.0  # a stopped server's threads and processes take a moment to finish: wait this long at most


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    pgid: int
    cmdline: str

    def __str__(self) -> str:
        return f"pid {self.pid} (parent {self.ppid}, group {self.pgid}): {self.cmdline[:200]}"


@dataclass(frozen=True)
class Snapshot:
    threads: frozenset[threading.Thread]
    pids: frozenset[int]  # every pid on the machine: only processes started later are looked at
    torch_threads: int | None = None


def _pids() -> frozenset[int]:
    return frozenset(int(e) for e in os.listdir("/proc") if e.isdigit())


def _stat(pid: int) -> tuple[int, int] | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    if fields[0] == "Z":  # a zombie has finished: its parent has only to reap it
        return None
    return int(fields[1]), int(fields[2])


def _marked(pid: int) -> bool:
    try:
        return _MARK_BYTES in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:  # another user's process, or gone
        return False


def started_here(pid: int) -> bool:
    """Whether `pid` was started by this test process or by what it started (it carries MARK): other
    test runs on the same machine start processes of the same name."""
    return _marked(pid)


def _cmdline(pid: int) -> str:
    """The process's command line. A process just started may read empty for a moment: Popen returns
    once the child's execve has closed its close-on-exec pipe (do_close_on_exec, Linux fs/exec.c),
    which comes before the ELF loader records the new image's arguments (create_elf_tables,
    fs/binfmt_elf.c, sets mm->arg_start), and /proc/<pid>/cmdline reads nothing until then. Seen once
    in a CI run. So an empty read is tried again, up to 0.2 s."""
    for _ in range(20):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return ""
        if cmd:
            return cmd.replace(b"\0", b" ").decode(errors="replace").strip()
        time.sleep(0.01)
    return ""


def _allowed(cmd: str) -> bool:
    return any(a in cmd for a in ALLOWED_COMMANDS)


def processes(since: frozenset[int]) -> dict[int, Proc]:
    """Every live process started since `since` (the pids then) by this one or by what it started
    then, directly or not (see the module docstring); not what a process older than `since` that
    this one started (a module or session fixture's unit) starts meanwhile, since that is its
    owner's to stop, nor the ALLOWED_COMMANDS and theirs. Reads /proc only for the new pids, so the
    check costs next to nothing after a test that started no process."""
    me = os.getpid()
    stats = {pid: st for pid in _pids() - since if (st := _stat(pid)) is not None}
    ours: dict[int, Proc] = {}
    skipped: set[int] = set()  # new, but an allowed command's or an older process's of ours
    pending = dict(stats)
    changed = True
    while changed:  # a parent may be listed after its child: go round until nothing more is decided
        changed = False
        for pid, (ppid, pgid) in list(pending.items()):
            older_parent = ppid not in stats and ppid != me
            if not (ppid == me or ppid in ours or ppid in skipped or (older_parent and _marked(pid))):
                continue
            del pending[pid]
            changed = True
            cmd = _cmdline(pid)
            if ppid in skipped or _allowed(cmd) or (older_parent and _older_of_ours(ppid, me)):
                skipped.add(pid)
            else:
                ours[pid] = Proc(pid, ppid, pgid, cmd)
    return ours


def _older_of_ours(pid: int, me: int) -> bool:
    """Whether `pid`, a process older than the test, is one this process started (a fixture's), or
    an allowed one; not init or a subreaper that adopted an orphan of the test's."""
    stat = _stat(pid)
    return stat is not None and (stat[0] == me or _marked(pid) or _allowed(_cmdline(pid)))


def _torch_threads() -> int | None:
    torch = sys.modules.get("torch")
    return torch.get_num_threads() if torch is not None else None


def snapshot() -> Snapshot:
    return Snapshot(frozenset(threading.enumerate()), _pids(), _torch_threads())


def _threads_left(before: Snapshot) -> list[threading.Thread]:
    return [
        t
        for t in threading.enumerate()
        if t not in before.threads and t.is_alive() and not any(a in t.name for a in ALLOWED_THREADS)
    ]


def left_behind(before: Snapshot, grace_s: float = GRACE_S) -> tuple[list[str], list[int]]:
    """What runs now that did not before `before` was taken, after waiting up to grace_s for it to
    finish: one line each, naming it so the test's author can find who started it, and the pids
    of the processes among it."""
    deadline = time.monotonic() + grace_s
    while True:
        threads = _threads_left(before)
        procs = processes(before.pids)
        if (not threads and not procs) or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    found = [f"thread {t.name!r} (daemon={t.daemon}, target={getattr(t, '_target', None)!r})" for t in threads]
    found += [f"process {p}" for p in procs.values()]
    torch_now = _torch_threads()
    if before.torch_threads is not None and torch_now != before.torch_threads:
        found.append(f"torch.get_num_threads() is {torch_now}, was {before.torch_threads}: restore it")
    return found, sorted(procs)


def kill(pids: list[int]) -> None:
    """SIGKILL what a test left, so one leak fails one test, not every test after it."""
    for pid in pids:
        if pid <= 1:  # 0 and -1 would signal a whole process group, 1 is init
            raise ValueError(f"not a process a test started: {pid}")
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
