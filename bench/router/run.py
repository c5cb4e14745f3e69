"""Router benchmark: added latency (p50/p99) and requests/s of the router on one core.

Starts the fast stand-in backend and the router (`python -m runtime router`) as processes, the router
pinned to one core (taskset), the backend and this load generator to the other, then measures the
same closed-loop load against the backend directly and through the router. Run: make bench-router
(`python -m bench.router.run`; --tiny: a fifth of a second per scenario).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
# Imported after the path to this checkout is known:
from bench.measure import (  # noqa: E402
    append_run,
    cpu_seconds,
    pct,
    pin_self,
    pinned,
    results_file,
    start_router,
    tiny_mode,
)
from runtime.ports import free_port  # noqa: E402

perf_counter = time.perf_counter


def request_bytes(port: int, stream: bool, paced: bool = False) -> bytes:
    payload = {"model": "tiny", "prompt": "hello", "max_tokens": 2, "stream": stream}
    if paced:
        payload["paced"] = True
    body = json.dumps(payload).encode()
    return (
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (port, len(body), body)
    )


class Client(asyncio.Protocol):
    """One keep-alive connection; one request at a time (closed loop)."""

    def __init__(self) -> None:
        self.event_lags: list[float] | None = None  # paced streams: delivery latency of each event
        self.buf = bytearray()
        self.done: asyncio.Future | None = None
        self.first_event_at = 0.0
        self.head_end = -1
        self.length = -1

    def connection_made(self, transport) -> None:
        self.transport = transport

    def send(self, data: bytes) -> asyncio.Future:
        self.buf.clear()
        self.first_event_at = 0.0
        self.head_end = -1
        self.length = -1
        self.done = asyncio.get_running_loop().create_future()
        self.transport.write(data)
        return self.done

    def data_received(self, data: bytes) -> None:
        assert self.done is not None, "the backend answered before send()"
        if not self.first_event_at and b"data:" in data:
            self.first_event_at = perf_counter()
        if self.event_lags is not None and b'{"t": ' in data:
            now = perf_counter()
            for piece in data.split(b'{"t": ')[1:]:
                self.event_lags.append(now - float(piece.split(b",", 1)[0]))
        self.buf += data
        if self.head_end < 0:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            self.head_end = end + 4
            head = bytes(self.buf[:end]).lower()
            if not head.startswith(b"http/1.1 200"):
                self.done.set_exception(RuntimeError(head.split(b"\r\n")[0].decode()))
                return
            at = head.find(b"content-length:")
            if at >= 0:
                self.length = int(head[at + 15 :].split(b"\r\n", 1)[0])
        if self.length >= 0:
            if len(self.buf) >= self.head_end + self.length:
                self.done.set_result(None)
        elif self.buf.endswith(b"0\r\n\r\n"):
            self.done.set_result(None)

    def connection_lost(self, exc) -> None:
        if self.done and not self.done.done():
            self.done.set_exception(ConnectionError("connection lost"))


async def closed_loop(
    port: int,
    *,
    concurrency: int,
    seconds: float,
    stream: bool,
    warmup: float = 1.0,
    cpu_pid: int | None = None,
    paced: bool = False,
) -> dict:
    loop = asyncio.get_running_loop()
    payload = request_bytes(port, stream, paced)
    event_lags: list[float] = []
    latencies: list[float] = []
    first_events: list[float] = []
    errors = 0
    measuring = False
    stop = False

    async def worker() -> None:
        nonlocal errors
        _, client = await loop.create_connection(Client, "127.0.0.1", port)
        while not stop:
            client.event_lags = event_lags if (paced and measuring) else None
            t0 = perf_counter()
            try:
                await client.send(payload)
            except (RuntimeError, ConnectionError):
                errors += 1
                return
            if measuring:
                latencies.append(perf_counter() - t0)
                if stream:
                    first_events.append(client.first_event_at - t0)
        client.transport.close()

    tasks = [asyncio.create_task(worker()) for _ in range(concurrency)]
    await asyncio.sleep(warmup)
    measuring = True
    cpu0 = cpu_seconds(cpu_pid) if cpu_pid else 0.0
    started = perf_counter()
    await asyncio.sleep(seconds)
    measuring = False
    elapsed = perf_counter() - started
    cpu = (cpu_seconds(cpu_pid) - cpu0) if cpu_pid else None
    stop = True
    await asyncio.gather(*tasks)
    cpu_us = 1e6 * cpu / len(latencies) if cpu is not None and latencies else None
    return {
        "requests": len(latencies),
        "rps": len(latencies) / elapsed,
        "errors": errors,
        "router_cpu_us_per_request": cpu_us,
        "p50_ms": 1000 * pct(latencies, 50),
        "p99_ms": 1000 * pct(latencies, 99),
        "first_event_p50_ms": 1000 * pct(first_events, 50) if stream else None,
        "first_event_p99_ms": 1000 * pct(first_events, 99) if stream else None,
        "event_lag_p50_ms": 1000 * pct(event_lags, 50) if paced else None,
        "event_lag_p99_ms": 1000 * pct(event_lags, 99) if paced else None,
    }


def wait_port(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port} after {timeout} s")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=5.0, help="measurement window per scenario")
    ap.add_argument("--warmup", type=float, default=1.0, help="seconds of load before each window")
    ap.add_argument("--router-cpu", default="0")
    ap.add_argument("--load-cpu", default="1", help="core for the backend and the load generator")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--events", type=int, default=32, help="SSE events per streamed response")
    ap.add_argument("--label", default="", help="name of this run in the results file")
    ap.add_argument("--out", default=str(results_file("router.json", tiny=False)))
    ap.add_argument("--router-args", default="", help="extra router flags, e.g. '--event-loop asyncio'")
    ap.add_argument(
        "--router-repo",
        default=str(REPO),
        help="checkout whose runtime/ is benchmarked (compare revisions on one machine)",
    )
    tiny_mode(
        ap, argv, seconds=0.2, warmup=0.1, concurrency=4, events=4, out=str(results_file("router.json", tiny=True))
    )
    args = ap.parse_args(argv)

    pin_self(args.load_cpu)
    backend_port = free_port()
    router_port = free_port(avoid={backend_port})
    # The router's access log is part of its cost: written to a file, as a container's stderr would be.
    router_log = tempfile.TemporaryFile()
    py = sys.executable
    backend = subprocess.Popen(
        pinned(
            args.load_cpu,
            py,
            "-m",
            "bench.router.backend",
            "--port",
            str(backend_port),
            "--events",
            str(args.events),
        ),
        cwd=REPO,
    )
    router = start_router(
        cpus=args.router_cpu,
        port=router_port,
        settings={"units": [f"http://127.0.0.1:{backend_port}"], "max_outstanding_per_unit": 1024},
        router_args=args.router_args,
        cwd=args.router_repo,
        stderr=router_log,
    )
    results: dict[str, dict] = {}
    try:
        wait_port(backend_port)
        wait_port(router_port)
        time.sleep(1.0)  # first polls: the unit becomes routable
        plan = [
            ("small direct c=1", backend_port, 1, False),
            ("small router c=1", router_port, 1, False),
            (f"small direct c={args.concurrency}", backend_port, args.concurrency, False),
            (f"small router c={args.concurrency}", router_port, args.concurrency, False),
            ("stream direct c=1", backend_port, 1, True),
            ("stream router c=1", router_port, 1, True),
            ("stream router c=8", router_port, 8, True),
            ("paced stream direct c=8", backend_port, 8, True),
            ("paced stream router c=8", router_port, 8, True),
        ]
        for name, port, conc, stream in plan:
            results[name] = asyncio.run(
                closed_loop(
                    port,
                    concurrency=conc,
                    seconds=args.seconds,
                    warmup=args.warmup,
                    stream=stream,
                    cpu_pid=router.pid if port == router_port else None,
                    paced=name.startswith("paced"),
                )
            )
            r = results[name]
            cpu = r["router_cpu_us_per_request"]
            print(
                f"{name:24s} {r['rps']:8.0f} req/s  p50 {r['p50_ms']:.3f} ms  p99 {r['p99_ms']:.3f} ms"
                + (f"  router CPU {cpu:.0f} us/req" if cpu else "")
                + (
                    f"  first event p50 {r['first_event_p50_ms']:.3f} p99 {r['first_event_p99_ms']:.3f}"
                    if stream
                    else ""
                )
                + (
                    f"  event lag p50 {r['event_lag_p50_ms']:.3f} p99 {r['event_lag_p99_ms']:.3f}"
                    if r["event_lag_p50_ms"] is not None
                    else ""
                )
                + (f"  errors {r['errors']}" if r["errors"] else ""),
                flush=True,
            )
    finally:
        router.terminate()
        backend.terminate()
        router.wait(30)
        backend.wait(10)
        router_log.close()

    d1, r1 = results["small direct c=1"], results["small router c=1"]
    s1, sr = results["stream direct c=1"], results["stream router c=1"]
    summary = {
        "added_p50_ms": r1["p50_ms"] - d1["p50_ms"],
        "added_p99_ms": r1["p99_ms"] - d1["p99_ms"],
        "router_rps_one_core": results[f"small router c={args.concurrency}"]["rps"],
        "router_cpu_us_per_small_request": results[f"small router c={args.concurrency}"]["router_cpu_us_per_request"],
        "router_cpu_us_per_stream": results["stream router c=8"]["router_cpu_us_per_request"],
        "stream_added_first_event_p50_ms": sr["first_event_p50_ms"] - s1["first_event_p50_ms"],
        "stream_added_total_p50_ms": sr["p50_ms"] - s1["p50_ms"],
        "stream_added_total_p99_ms": sr["p99_ms"] - s1["p99_ms"],
        "paced_event_added_p50_ms": results["paced stream router c=8"]["event_lag_p50_ms"]
        - results["paced stream direct c=8"]["event_lag_p50_ms"],
        "paced_event_added_p99_ms": results["paced stream router c=8"]["event_lag_p99_ms"]
        - results["paced stream direct c=8"]["event_lag_p99_ms"],
    }
    print(json.dumps(summary, indent=1))
    load = os.getloadavg()
    record = {
        "label": args.label,
        "router_repo": args.router_repo,
        "router_args": args.router_args,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "python": platform.python_version(),
        "loadavg_at_end": load,
        "seconds": args.seconds,
        "events": args.events,
        "results": results,
        "summary": summary,
    }
    append_run(args.out, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
