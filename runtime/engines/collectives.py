"""How a unit's ranks exchange tensors: shared memory when every rank runs on one host, gloo otherwise.

connect() decides once per formation (same host name and boot id on every rank, and a segment every
rank can open and verify) and logs the choice; both transports offer the same calls (all_reduce,
broadcast, gather, and point-to-point isend/recv around the pipeline ring).
"""

from __future__ import annotations

import collections
import ctypes
import fcntl
import logging
import mmap
import os
import platform
import secrets
import socket
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol, Sequence

import torch
import torch.distributed as dist

log = logging.getLogger("flotilla.engine")

TRANSPORTS = ("auto", "shm", "gloo")
SHM_DIR = "/dev/shm"
SEGMENT_PREFIX = "flotilla-shm-"
# Per rank and buffer. A decode step's messages are a few KB; a prefill's hidden states or a KV
# re-shard are cut into rounds of this size. 2 ranks x 2 buffers x 1 MiB plus a 4 x 512 KiB ring
# per rank keeps a 2-rank segment at ~8 MiB, well inside Docker's default 64 MB /dev/shm.
SLOT_BYTES = 1 << 20
RING_SLOT_BYTES = 512 << 10
RING_SLOTS = 4
# A waiting rank first polls (the peer is usually a few microseconds away) for at most SPIN_S, less
# while recent waits were longer than that, then sleeps on a futex, so an idle follower costs no
# CPU; asleep, it wakes at least every _SLICE_S to check its peers' liveness.
SPIN_S = 1e-3
_SLICE_S = 0.02
_MASK = 0xFFFFFFFF
_HALF = 0x80000000
_MAGIC = b"FLOTSHM2"  # the segment's layout version: ranks of another layout refuse to attach
_HEADER = 4096
_LINE = 64  # one cache line per counter: ranks write different lines, never the same one
# The five words each rank owns a line for. ASLEEP is 1 while the rank may be asleep on its
# DOORBELL, so peers make the wake-up system call only then.
_ARRIVE, _DOORBELL, _SENT, _ACKED, _ASLEEP = 0, 1, 2, 3, 4
_PER_RANK = 5 * _LINE

# A full memory barrier between a rank's store of one word and its load of another (a store may
# otherwise pass a later load: Intel SDM vol. 3A, 9.2.3.4, "Loads May Be Reordered with Earlier
# Stores to Different Locations"). CPython 3.11 builds a Lock on POSIX semaphores on Linux
# (Python/thread_pthread.h, USE_SEMAPHORES: acquire is sem_trywait, release sem_post), and glibc
# changes a semaphore with an atomic compare-and-exchange (nptl/sem_waitcommon.c, nptl/sem_post.c),
# a lock-prefixed instruction on x86-64, which no load or store passes (SDM 9.2.2). Uncontended,
# the pair costs about 0.1 us.
_BARRIER = threading.Lock()


def _full_barrier() -> None:
    _BARRIER.acquire()
    _BARRIER.release()


# Linux x86-64: futex(2) is syscall 202 (arch/x86/entry/syscalls/syscall_64.tbl). FUTEX_WAIT /
# FUTEX_WAKE without FUTEX_PRIVATE_FLAG work across processes sharing the mapping (futex(2)).
_SYS_FUTEX = 202
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1


class CollectiveError(RuntimeError):
    """A collective could not complete: a peer died or stayed silent past the timeout."""


class Work(Protocol):
    def wait(self) -> None: ...


class Communicator(Protocol):
    """The calls the executor makes; every rank calls the collectives in the same order."""

    transport: str
    rank: int
    world_size: int

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor: ...  # sum, in place

    def broadcast(self, t: torch.Tensor, src: int) -> torch.Tensor: ...  # in place

    def gather(self, t: torch.Tensor, dst: int) -> list[torch.Tensor] | None: ...  # dst: one per rank

    def isend(self, t: torch.Tensor, dst: int) -> Work: ...

    def recv(self, t: torch.Tensor, src: int) -> torch.Tensor: ...

    def close(self) -> None: ...


class GlooCommunicator:
    """torch.distributed's default group (gloo): works across hosts."""

    def __init__(self, rank: int, world_size: int, transport: str = "gloo") -> None:
        self.rank, self.world_size, self.transport = rank, world_size, transport

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(t)
        return t

    def broadcast(self, t: torch.Tensor, src: int) -> torch.Tensor:
        dist.broadcast(t, src=src)
        return t

    def gather(self, t: torch.Tensor, dst: int) -> list[torch.Tensor] | None:
        if self.rank != dst:
            dist.gather(t, dst=dst)
            return None
        parts = [torch.empty_like(t) for _ in range(self.world_size)]
        dist.gather(t, gather_list=parts, dst=dst)
        return parts

    def isend(self, t: torch.Tensor, dst: int) -> Work:
        return dist.isend(t, dst=dst)

    def recv(self, t: torch.Tensor, src: int) -> torch.Tensor:
        dist.recv(t, src=src)
        return t

    def close(self) -> None:
        pass


# --- shared memory -------------------------------------------------------------------------------


def _layout(world_size: int) -> tuple[int, int, int]:
    """(offset of the collective slots, offset of the ring slots, total bytes)."""
    control = _HEADER + world_size * _PER_RANK
    slots = -(-control // 4096) * 4096
    ring = slots + 2 * world_size * SLOT_BYTES
    return slots, ring, ring + world_size * RING_SLOTS * RING_SLOT_BYTES


def _ge(a: int, b: int) -> bool:
    """a >= b for 32-bit counters that wrap."""
    return (a - b) & _MASK < _HALF


class _Futex:
    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self._syscall = libc.syscall
        self._syscall.restype = ctypes.c_long

    def wait(self, addr: int, expected: int, timeout_s: float) -> None:
        ts = (ctypes.c_long * 2)(int(timeout_s), int((timeout_s % 1) * 1e9))
        # Returns at once if the word no longer holds `expected` (the kernel compares atomically).
        self._syscall(
            ctypes.c_long(_SYS_FUTEX),
            ctypes.c_void_p(addr),
            ctypes.c_long(_FUTEX_WAIT),
            ctypes.c_long(expected),
            ts,
            None,
            ctypes.c_long(0),
        )

    def wake(self, addr: int) -> None:
        self._syscall(
            ctypes.c_long(_SYS_FUTEX), ctypes.c_void_p(addr), ctypes.c_long(_FUTEX_WAKE), ctypes.c_long(1 << 30)
        )


@dataclass
class _Send:
    data: torch.Tensor  # flat uint8 view of the tensor being sent
    done: int = 0


class _SendWork:
    def __init__(self, comm: "ShmCommunicator", send: _Send) -> None:
        self._comm, self._send = comm, send

    def wait(self) -> None:
        self._comm._finish_send(self._send)


class _Done:
    def wait(self) -> None:
        pass


class ShmCommunicator:
    """Ranks of one host exchanging tensors through one shared-memory segment.

    Collectives: each rank copies its part into its own slot of the current buffer, bumps its
    `arrive` counter and waits until every rank's counter reached this round; then it reads what it
    needs. Two buffers alternate, so a rank can start round n+1 while a slower peer still reads
    round n, and cannot overwrite round n's buffer in round n+2 before every peer finished it (they
    all arrived at n+1 first). Sums run in rank order on every rank, so every rank holds the same
    bits. Point-to-point: one ring channel per rank to its successor (the pipeline's direction), of
    RING_SLOTS slots with a sent and an acknowledged counter; a send that finds the ring full stays
    pending and is pushed on from every later wait, so sends never block a rank that must receive.

    Memory order: a counter is stored after the data it announces and read before that data.
    x86-64 keeps stores in order and loads in order (Intel SDM vol. 3A, 9.2.2), which is why
    connect() uses this transport on x86-64 only.

    Waiting: poll for SPIN_S, then sleep on the rank's own doorbell word with futex(2). A rank
    raises its ASLEEP word before it sleeps; whoever changes a counter that rank may wait for then
    bumps its doorbell and wakes it. A peer that is polling is not woken: the system call costs
    about 6 us in the middle of a decode step, 60 times a step (measured: docs/benchmarks.md).
    Both sides store their word, pass a full barrier, then load the other's (the sleeper: ASLEEP,
    then the counter; the waker: the counter, then ASLEEP), so at least one of them sees the
    other's store: the sleeper finds the counter changed, or the waker finds it asleep.

    While it sleeps a rank checks its peers every _SLICE_S: each rank holds a lock on its own byte
    of the segment file, released by the kernel when the process dies, so a dead peer is reported
    at once and a wedged one after timeout_s.
    """

    transport = "shm"

    def __init__(self, rank: int, world_size: int, fd: int, size: int, *, timeout_s: float, name: str) -> None:
        self.rank, self.world_size, self.timeout_s, self.name = rank, world_size, timeout_s, name
        self._fd = fd
        self._mm = mmap.mmap(fd, size)
        self._slots_at, self._ring_at, _ = _layout(world_size)
        self._ctl = memoryview(self._mm)[_HEADER : _HEADER + world_size * _PER_RANK].cast("I")
        self._anchor = ctypes.c_char.from_buffer(self._mm)
        self._base = ctypes.addressof(self._anchor)
        self._bytes = torch.frombuffer(self._mm, dtype=torch.uint8)
        self._futex = _Futex()
        self._peers = [r for r in range(world_size) if r != rank]
        self._seq = self._ctl[self._idx(rank, _ARRIVE)]
        self._next, self._prev = (rank + 1) % world_size, (rank - 1) % world_size
        self._sent = self._ctl[self._idx(rank, _SENT)]  # chunks this rank pushed into its ring
        self._received = self._ctl[self._idx(rank, _ACKED)]  # chunks taken from prev's ring
        self._pending: collections.deque[_Send] = collections.deque()
        self._typed: dict[tuple[int, int, torch.dtype], torch.Tensor] = {}
        self._by_shape: dict[tuple[int, torch.Size, torch.dtype], list[torch.Tensor]] = {}
        self._last_check = 0.0
        self._spin = SPIN_S  # current polling budget, adapted by _wait
        self.closed = False

    # -- counters ---------------------------------------------------------------------------------
    def _idx(self, rank: int, counter: int) -> int:
        return (rank * _PER_RANK + counter * _LINE) // 4

    def _get(self, rank: int, counter: int) -> int:
        return self._ctl[self._idx(rank, counter)]

    def _set(self, counter: int, value: int) -> None:
        self._ctl[self._idx(self.rank, counter)] = value & _MASK

    def _ring_doorbell(self, rank: int) -> None:
        """Wake `rank` if it sleeps: called after storing a counter it may be waiting for."""
        _full_barrier()
        if not self._ctl[self._idx(rank, _ASLEEP)]:
            return  # polling: it sees the counter without help
        i = self._idx(rank, _DOORBELL)
        self._ctl[i] = (self._ctl[i] + 1) & _MASK
        self._futex.wake(self._base + _HEADER + i * 4)

    def _wait(self, ready: Callable[[], bool], what: str, peers: Sequence[int]) -> None:
        if ready():
            return
        clock = time.perf_counter
        started = clock()
        spin_until = started + self._spin
        while clock() < spin_until:
            if ready():
                self._spin = min(SPIN_S, max(2 * self._spin, 10e-6))
                return
        try:
            self._sleep_until(ready, what, peers)
        finally:
            # Polling pays when peers arrive within SPIN_S; when they take longer (a busy host, an
            # idle leader) it only burns the core the peer may need, and sleeping also earns the
            # scheduler's wake-up preference. So the polling budget follows the recent waits.
            if clock() - started <= SPIN_S:
                self._spin = min(SPIN_S, max(2 * self._spin, 10e-6))
            else:
                self._spin /= 2

    def _sleep_until(self, ready: Callable[[], bool], what: str, peers: Sequence[int]) -> None:
        self._set(_ASLEEP, 1)
        _full_barrier()
        try:
            self._sleep(ready, what, peers)
        finally:
            self._set(_ASLEEP, 0)

    def _sleep(self, ready: Callable[[], bool], what: str, peers: Sequence[int]) -> None:
        deadline = time.monotonic() + self.timeout_s
        bell = self._idx(self.rank, _DOORBELL)
        addr = self._base + _HEADER + bell * 4
        while True:
            seen = self._ctl[bell]  # read before the check: a ring after it changes the word
            if ready():
                return
            now = time.monotonic()
            if now - self._last_check >= _SLICE_S:
                self._last_check = now
                self._check_alive(peers, what)
            if now >= deadline:
                raise CollectiveError(
                    f"rank {self.rank}: shared-memory {what} waited {self.timeout_s:g} s for rank(s) "
                    f"{', '.join(map(str, peers))}, which are alive but silent (wedged or stopped)"
                )
            self._futex.wait(addr, seen, min(_SLICE_S, deadline - now))

    def _check_alive(self, peers: Sequence[int], what: str) -> None:
        for peer in peers:
            try:
                fcntl.lockf(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, peer)
            except OSError:
                continue  # its lock is held: the peer process is alive
            fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, peer)
            raise CollectiveError(
                f"rank {self.rank}: rank {peer} died during a shared-memory {what} (its process is gone)"
            )

    # -- slots ------------------------------------------------------------------------------------
    def _slot(self, buf: int, rank: int, dtype: torch.dtype) -> torch.Tensor:
        key = (buf, rank, dtype)
        view = self._typed.get(key)
        if view is None:
            start = self._slots_at + (buf * self.world_size + rank) * SLOT_BYTES
            view = self._bytes[start : start + SLOT_BYTES].view(dtype)
            self._typed[key] = view
        return view

    def _shaped(self, buf: int, t: torch.Tensor) -> list[torch.Tensor]:
        key = (buf, t.shape, t.dtype)
        views = self._by_shape.get(key)
        if views is None:
            if len(self._by_shape) >= 64:  # prefill shapes vary; decode uses a handful
                self._by_shape.clear()
            n = t.numel()
            views = [self._slot(buf, r, t.dtype)[:n].view(t.shape) for r in range(self.world_size)]
            self._by_shape[key] = views
        return views

    def _round(self, what: str) -> int:
        """Announce this rank's part of the next round and wait for every peer's."""
        self._seq = seq = (self._seq + 1) & _MASK
        self._set(_ARRIVE, seq)
        for peer in self._peers:
            self._ring_doorbell(peer)
        ctl, peers = self._ctl, self._peers
        if len(peers) == 1:  # _ge inlined in the poll: 0.1-0.3 ms less a 2-rank decode step, measured
            i = self._idx(peers[0], _ARRIVE)
            self._wait(lambda: (ctl[i] - seq) & _MASK < _HALF, what, peers)
        else:
            idx = self._idx
            self._wait(lambda: all(_ge(ctl[idx(p, _ARRIVE)], seq) for p in peers), what, peers)
        return seq & 1

    def _chunks(self, t: torch.Tensor) -> tuple[torch.Tensor, int]:
        if not t.is_contiguous():
            raise ValueError("shared-memory collectives need contiguous tensors")
        flat = t.view(-1)
        return flat, max(1, SLOT_BYTES // flat.element_size())

    # -- collectives ------------------------------------------------------------------------------
    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        if t.is_contiguous() and t.numel() * t.element_size() <= SLOT_BYTES:
            # One round (every decode-step all-reduce): views shaped like t, cached, so the round
            # is a copy in and a sum out with no slicing.
            buf = (self._seq + 1) & 1
            views = self._shaped(buf, t)
            views[self.rank].copy_(t)
            self._round("all_reduce")
            torch.add(views[0], views[1], out=t)
            for view in views[2:]:
                t.add_(view)
            return t
        flat, step = self._chunks(t)
        for a in range(0, flat.numel(), step):
            part = flat[a : a + step]
            n = part.numel()
            buf = (self._seq + 1) & 1
            self._slot(buf, self.rank, t.dtype)[:n].copy_(part)
            self._round("all_reduce")
            torch.add(self._slot(buf, 0, t.dtype)[:n], self._slot(buf, 1, t.dtype)[:n], out=part)
            for r in range(2, self.world_size):
                part.add_(self._slot(buf, r, t.dtype)[:n])
        return t

    def broadcast(self, t: torch.Tensor, src: int) -> torch.Tensor:
        flat, step = self._chunks(t)
        for a in range(0, flat.numel(), step):
            part = flat[a : a + step]
            n = part.numel()
            buf = (self._seq + 1) & 1
            if self.rank == src:
                self._slot(buf, src, t.dtype)[:n].copy_(part)
            self._round("broadcast")
            if self.rank != src:
                part.copy_(self._slot(buf, src, t.dtype)[:n])
        return t

    def gather(self, t: torch.Tensor, dst: int) -> list[torch.Tensor] | None:
        flat, step = self._chunks(t)
        outs = [torch.empty_like(t) for _ in range(self.world_size)] if self.rank == dst else None
        for a in range(0, flat.numel(), step):
            n = min(step, flat.numel() - a)
            buf = (self._seq + 1) & 1
            self._slot(buf, self.rank, t.dtype)[:n].copy_(flat[a : a + n])
            self._round("gather")
            if outs is not None:
                for r, out in enumerate(outs):
                    out.view(-1)[a : a + n].copy_(self._slot(buf, r, t.dtype)[:n])
        return outs

    # -- the pipeline ring ------------------------------------------------------------------------
    def _ring_slot(self, channel: int, k: int) -> torch.Tensor:
        start = self._ring_at + (channel * RING_SLOTS + k % RING_SLOTS) * RING_SLOT_BYTES
        return self._bytes[start : start + RING_SLOT_BYTES]

    def isend(self, t: torch.Tensor, dst: int) -> Work:
        if dst != self._next:
            raise ValueError(f"rank {self.rank} sends only to its ring successor {self._next}, not {dst}")
        if not t.is_contiguous():
            raise ValueError("shared-memory sends need contiguous tensors")
        send = _Send(data=t.view(-1).view(torch.uint8))
        if send.data.numel() == 0:
            return _Done()
        self._pending.append(send)
        self._progress()
        return _SendWork(self, send)

    def _progress(self) -> bool:
        """Push pending sends into free ring slots; True when nothing is pending any more."""
        while self._pending:
            send = self._pending[0]
            while send.done < send.data.numel():
                if (self._sent - self._get(self._next, _ACKED)) & _MASK >= RING_SLOTS:
                    return False  # the ring is full until the successor takes a chunk
                n = min(RING_SLOT_BYTES, send.data.numel() - send.done)
                self._ring_slot(self.rank, self._sent)[:n].copy_(send.data[send.done : send.done + n])
                self._sent = (self._sent + 1) & _MASK
                self._set(_SENT, self._sent)
                self._ring_doorbell(self._next)
                send.done += n
            self._pending.popleft()
        return True

    def _finish_send(self, send: _Send) -> None:
        def ready() -> bool:
            self._progress()
            return send.done == send.data.numel()

        self._wait(ready, "send", [self._next])

    def recv(self, t: torch.Tensor, src: int) -> torch.Tensor:
        if src != self._prev:
            raise ValueError(f"rank {self.rank} receives only from its ring predecessor {self._prev}, not {src}")
        if not t.is_contiguous():
            raise ValueError("shared-memory receives need contiguous tensors")
        data = t.view(-1).view(torch.uint8)
        peers = sorted({self._prev, self._next})
        for a in range(0, data.numel(), RING_SLOT_BYTES):
            want = (self._received + 1) & _MASK

            def ready() -> bool:
                self._progress()  # a pending send of ours may be what the predecessor waits for
                return _ge(self._get(self._prev, _SENT), want)

            self._wait(ready, "recv", peers)
            n = min(RING_SLOT_BYTES, data.numel() - a)
            data[a : a + n].copy_(self._ring_slot(self._prev, self._received)[:n])
            self._received = want
            self._set(_ACKED, want)
            self._ring_doorbell(self._prev)
        return t

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._typed.clear()
        self._by_shape.clear()
        self._pending.clear()
        del self._bytes, self._anchor
        self._ctl.release()
        try:
            self._mm.close()
        except BufferError:  # a tensor still views the segment; the mapping goes with the process
            pass
        os.close(self._fd)  # also drops this rank's liveness lock


# --- choosing the transport ----------------------------------------------------------------------


def host_identity() -> tuple[str, str]:
    """(host name, boot id): two processes share memory only if both match."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    return socket.gethostname(), boot


def shm_unsupported(shm_dir: str = SHM_DIR) -> str:
    """Why this process cannot use the shared-memory transport, or "" if it can."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return f"{platform.system()}/{platform.machine()} (the shared-memory transport relies on x86-64 Linux)"
    if not os.path.isdir(shm_dir) or not os.access(shm_dir, os.W_OK):
        return f"{shm_dir} is missing or not writable"
    return ""


def sweep_stale_segments(shm_dir: str = SHM_DIR) -> list[str]:
    """Remove segments whose creator died before unlinking them (it holds a lock until then)."""
    removed: list[str] = []
    try:
        names = [n for n in os.listdir(shm_dir) if n.startswith(SEGMENT_PREFIX)]
    except OSError:
        return removed
    for name in names:
        path = os.path.join(shm_dir, name)
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError:
            continue
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # whole file: no rank holds any byte
            os.unlink(path)
            removed.append(name)
        except OSError:
            pass
        finally:
            os.close(fd)
    return removed


def _create_segment(world_size: int, shm_dir: str) -> tuple[str, bytes, int, int]:
    """Leader: a new segment file, sized and reserved, with a nonce followers verify."""
    _, _, size = _layout(world_size)
    name = f"{SEGMENT_PREFIX}{os.getpid()}-{secrets.token_hex(6)}"
    path = os.path.join(shm_dir, name)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
        try:
            # Reserve the pages now: a tmpfs that runs out later kills the process with SIGBUS.
            os.posix_fallocate(fd, 0, size)
        except OSError as e:
            free = os.statvfs(shm_dir)
            raise OSError(
                f"a {size / 2**20:.0f} MiB segment does not fit in {shm_dir} "
                f"({free.f_bavail * free.f_frsize / 2**20:.0f} MiB free: {e.strerror}); give the "
                "container a larger /dev/shm (docker --shm-size, ECS linuxParameters.sharedMemorySize)"
            ) from e
        nonce = secrets.token_bytes(16)
        os.pwrite(fd, _MAGIC + nonce + struct.pack("<I", world_size), 0)
    except BaseException:
        os.close(fd)
        os.unlink(path)
        raise
    return name, nonce, fd, size


def _attach_segment(name: str, nonce: bytes, rank: int, world_size: int, shm_dir: str) -> tuple[int, int]:
    _, _, size = _layout(world_size)
    fd = os.open(os.path.join(shm_dir, name), os.O_RDWR)
    try:
        head = os.pread(fd, len(_MAGIC) + 20, 0)
        if head != _MAGIC + nonce + struct.pack("<I", world_size) or os.fstat(fd).st_size < size:
            raise OSError(f"{shm_dir}/{name} is not the leader's segment (another /dev/shm?)")
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, rank)
    except BaseException:
        os.close(fd)
        raise
    return fd, size


def connect(
    rank: int, world_size: int, *, timeout_s: float, transport: str = "auto", shm_dir: str = SHM_DIR
) -> Communicator:
    """Every rank calls this after the gloo group formed; all get the same transport.

    auto: shared memory if every rank reports this host's name and boot id, can use it, and opens
    and verifies the leader's segment; gloo otherwise, with the reason logged. shm: shared memory
    or an error. gloo: always gloo.
    """
    if transport not in TRANSPORTS:
        raise ValueError(f"collectives transport {transport!r} is not one of {', '.join(TRANSPORTS)}")
    gloo = GlooCommunicator(rank, world_size)
    if transport == "gloo":
        log.info("collectives: gloo (chosen by setting)")
        return gloo
    mine = (*host_identity(), shm_unsupported(shm_dir))
    everyone: list = [None] * world_size
    dist.all_gather_object(everyone, mine)
    why = ""
    for r, (host, boot, unsupported) in enumerate(everyone):
        if unsupported:
            why = f"rank {r}: {unsupported}"
            break
        if (host, boot) != everyone[0][:2]:
            why = f"rank {r} runs on {host}, rank 0 on {everyone[0][0]}"
            break
    comm = None
    if not why:
        comm, why = _form_shm(rank, world_size, timeout_s=timeout_s, shm_dir=shm_dir)
    if comm is not None:
        log.info(
            "collectives: shared memory (%d ranks on host %s, %s, %.0f MiB)",
            world_size,
            everyone[0][0],
            shm_dir,
            _layout(world_size)[2] / 2**20,
        )
        return comm
    if transport == "shm":
        raise CollectiveError(f"the shared-memory transport was required but cannot be used: {why}")
    log.info("collectives: gloo (%s)", why)
    return gloo


def _form_shm(rank: int, world_size: int, *, timeout_s: float, shm_dir: str) -> tuple[ShmCommunicator | None, str]:
    offer: list = [None]
    fd, size, name = -1, 0, ""
    if rank == 0:
        swept = sweep_stale_segments(shm_dir)
        if swept:
            log.info("removed %d stale shared-memory segment(s) of dead units: %s", len(swept), ", ".join(swept))
        try:
            name, nonce, fd, size = _create_segment(world_size, shm_dir)
            offer = [(name, nonce, "")]
        except OSError as e:
            offer = [("", b"", str(e))]
    dist.broadcast_object_list(offer, src=0)
    name, nonce, error = offer[0]
    if rank != 0 and not error:
        try:
            fd, size = _attach_segment(name, nonce, rank, world_size, shm_dir)
        except OSError as e:
            error = f"rank {rank} cannot open the segment: {e}"
    errors: list = [None] * world_size
    dist.all_gather_object(errors, error)
    failed = next((e for e in errors if e), "")
    if rank == 0 and name:
        # Every rank has it open (or gave up): the name is no longer needed, and without a name
        # nothing can leak, whatever happens to the processes later.
        os.unlink(os.path.join(shm_dir, name))
    if failed:
        if fd >= 0:
            os.close(fd)
        return None, failed
    return ShmCommunicator(rank, world_size, fd, size, timeout_s=timeout_s, name=name), ""
