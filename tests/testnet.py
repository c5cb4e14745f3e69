"""Free loopback ports for tests that start real servers, never the same port twice per run.

Binding port 0 twice in a row can hand back the same port (the first socket is already closed),
which once gave a node the same HTTP and collectives port. Every helper here remembers what it
handed out and skips it.
"""

from __future__ import annotations

import socket
import threading

_issued: set[int] = set()
_lock = threading.Lock()


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(span: int = 1) -> int:
    """A port p such that p..p+span-1 are free now and were never handed out by this process."""
    with _lock:
        for _ in range(200):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            block = range(port, port + span)
            if port + span >= 65535 or any(p in _issued for p in block):
                continue
            if all(_bindable(p) for p in block[1:]):
                _issued.update(block)
                return port
    raise RuntimeError(f"no free block of {span} loopback port(s) found")
