"""Free loopback ports for tests that start real servers, never the same port twice per run.

runtime.ports finds a free port; this module remembers every port it handed out in this test
process and passes them as `avoid`, so two servers of one test never share a port.
"""

from __future__ import annotations

import threading

from runtime import ports

_issued: set[int] = set()
_lock = threading.Lock()


def free_port(span: int = 1) -> int:
    """A port p such that p..p+span-1 are free now and were never handed out by this process."""
    with _lock:
        port = ports.free_port(span, avoid=_issued)
        _issued.update(range(port, port + span))
        return port
