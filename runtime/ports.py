"""Free loopback ports for the processes flotilla starts locally (make local, tests, benchmarks).

Binding port 0 twice in a row can hand back the same port (the first socket is already closed), so
a caller that needs several ports passes the ones it already holds in `avoid`.
"""

from __future__ import annotations

import socket
from typing import Collection


def port_free(port: int) -> bool:
    """True when a server could bind `port` on 127.0.0.1 now.

    The probe binds as flotilla's servers do, with SO_REUSEADDR (runtime/node/cli.py, the router):
    connections that closed a moment ago linger in TIME_WAIT for a minute and make a plain bind fail,
    though a server's bind succeeds (on Linux SO_REUSEADDR still refuses a port someone listens on,
    https://man7.org/linux/man-pages/man7/socket.7.html, SO_REUSEADDR)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(span: int = 1, avoid: Collection[int] = ()) -> int:
    """A port p such that p..p+span-1 are free on 127.0.0.1 now and none of them is in `avoid`."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        block = range(port, port + span)
        if port + span >= 65535 or any(p in avoid for p in block):
            continue
        if all(port_free(p) for p in block[1:]):
            return port
    raise RuntimeError(f"no free block of {span} loopback port(s) found")
