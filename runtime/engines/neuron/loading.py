"""A starting neuron engine's load progress, kept where the work happens and read by the node.

prepare runs in a worker thread and the NxD Inference loop reports from its own process, so the
tracker is written from threads and read from the event loop: one lock, one immutable snapshot.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from contract.ready import Loading, LoadPhase

REPORT_EVERY_S = 0.5  # bytes move in 8 MiB chunks: report at most this often, phases at once


class LoadTracker:
    def __init__(self, report: Callable[[Loading], None] | None = None, every_s: float = REPORT_EVERY_S) -> None:
        self._report = report
        self._every_s = every_s
        self._lock = threading.Lock()
        self._current: Loading | None = None
        self._since = time.monotonic()
        self._reported_at = 0.0

    def phase(self, phase: LoadPhase | str, *, total_bytes: int = 0) -> None:
        with self._lock:
            self._current = Loading(phase=LoadPhase(phase), total_bytes=total_bytes)
            self._since = time.monotonic()
        self._emit(force=True)

    def bytes(self, done: int, total: int) -> None:
        """fetch's callback: `done` of `total` bytes of the current phase's set are on disk."""
        with self._lock:
            if self._current is None:
                return
            self._current = self._current.model_copy(update={"done_bytes": done, "total_bytes": total})
        self._emit(force=done >= total)

    def snapshot(self) -> Loading | None:
        with self._lock:
            if self._current is None:
                return None
            return self._current.model_copy(update={"phase_s": round(time.monotonic() - self._since, 1)})

    def _emit(self, *, force: bool) -> None:
        if self._report is None:
            return
        now = time.monotonic()
        if force or now - self._reported_at >= self._every_s:
            self._reported_at = now
            snap = self.snapshot()
            if snap is not None:
                self._report(snap)
