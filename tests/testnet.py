"""Free loopback ports for tests that start real servers, never the same port twice per run.

runtime.ports finds a free port; this module remembers every port it handed out in this test
process and passes them as `avoid`, so two servers of one test never share a port. Test processes
running side by side (pytest-xdist workers, pytest.ini) take ports from blocks of their own, so one
worker never picks a port another has just handed out and not yet bound.
"""

from __future__ import annotations

import json
import os
import socket
import threading

from runtime import ports

_issued: set[int] = set()
_lock = threading.Lock()

# pytest-xdist names each worker gw0, gw1, ... and says how many there are (its docs, "Identifying the
# worker process during a test"); a run without workers takes any port.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
_WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
_BLOCK = 256  # ports per block; block b belongs to worker b % _WORKERS


def _mine(port: int, span: int) -> bool:
    return all((p // _BLOCK) % _WORKERS == _WORKER for p in range(port, port + span))


def free_port(span: int = 1) -> int:
    """A port p such that p..p+span-1 are free now, were never handed out by this process, and lie in
    this worker's blocks."""
    with _lock:
        for _ in range(100):
            port = ports.free_port(span, avoid=_issued)
            if _mine(port, span):
                _issued.update(range(port, port + span))
                return port
        raise RuntimeError(f"no free block of {span} loopback port(s) in worker {_WORKER}'s share of the ports")


class StalledReader:
    """A streaming client that stays connected but stops reading: a raw socket with a tiny receive
    buffer (set before connect, so the TCP window stays small) that reads the response's status
    line and headers and then nothing. Blocking and bounded by `timeout`: run it in a thread
    (asyncio.to_thread) when the server shares the test's event loop."""

    RCVBUF = 1024  # Linux doubles it and keeps a floor of a few KiB: the window stays tiny

    def __init__(
        self,
        port: int,
        path: str,
        body: dict,
        *,
        timeout: float = 10.0,
        headers: dict[str, str] | None = None,
        mss: int | None = None,
    ) -> None:
        """`mss` (TCP_MAXSEG, set before connect) caps the segment size the server may send: Linux sizes
        a socket's send buffer from it (2 x max(cwnd, 10) segments, torvalds/linux
        net/ipv4/tcp_input.c `tcp_sndbuf_expand`), so on loopback (MSS ~64 KiB, buffers autotuned up to
        tcp_wmem's max) a small one keeps the server's send buffer to tens of KiB: a short stream fills it."""
        self.port, self.path, self.body, self.timeout = port, path, body, timeout
        self.headers, self.mss = headers or {}, mss
        self.sock: socket.socket | None = None
        self.head = b""

    def open(self) -> bytes:
        """Send the request, read up to the end of the headers; returns the status line."""
        payload = json.dumps(self.body).encode()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.RCVBUF)
        if self.mss is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, self.mss)
        sock.settimeout(self.timeout)
        sock.connect(("127.0.0.1", self.port))
        self.sock = sock
        extra = "".join(f"{k}: {v}\r\n" for k, v in self.headers.items())
        sock.sendall(
            f"POST {self.path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{extra}"
            f"Content-Length: {len(payload)}\r\n\r\n".encode()
            + payload
        )
        head = b""
        while b"\r\n\r\n" not in head:
            got = sock.recv(1)  # byte by byte: nothing past the headers leaves the kernel's buffer
            if not got:
                raise AssertionError(f"the server closed before its headers: {head!r}")
            head += got
        self.head = head
        return head.split(b"\r\n", 1)[0]

    def closed_by_peer(self) -> bool:
        """Whether the server gave up on this connection (reset or closed it); reads what is left."""
        assert self.sock is not None
        self.sock.settimeout(self.timeout)
        try:
            while self.sock.recv(65536):
                pass
        except (ConnectionResetError, BrokenPipeError):
            return True
        except TimeoutError:
            return False
        return True

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
