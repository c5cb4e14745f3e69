"""Real processes for the router's acceptance tests: routers (`python -m runtime router`) and a
steady client load. The units behind them are tests/nodeproc.py's.

Every wait is bounded; every process is stopped by its own handle.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

import contract
from runtime.router.settings import router_command

REPO = Path(__file__).resolve().parents[2]


class RouterProcess:
    def __init__(self, log_dir: Path, *, name: str, args: list[str]) -> None:
        self.name = name
        self.log_path = log_dir / f"router-{name}.log"
        self.args = args
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self.metrics_url = ""

    async def start(self) -> "RouterProcess":
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            router_command(host="127.0.0.1", port=0, metrics_port=0, extra=self.args),
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=log,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        log.close()
        line = await asyncio.wait_for(asyncio.to_thread(self.proc.stdout.readline), 30)
        if not line.startswith(b"router listening on "):
            raise AssertionError(f"router {self.name} did not start: {line!r}\n{self.log_path.read_text()}")
        self.url = line.decode().split()[-1]
        line = await asyncio.wait_for(asyncio.to_thread(self.proc.stdout.readline), 30)
        assert line.startswith(b"router metrics on "), line
        self.metrics_url = line.decode().split()[-1]
        return self

    async def wait_routable(self, count: int, timeout: float = 60.0) -> None:
        async with aiohttp.ClientSession() as s:
            deadline = time.monotonic() + timeout
            while True:
                async with s.get(self.url + contract.ROUTER_HEALTH_PATH) as r:
                    if (await r.json()).get("routable_units") == count:
                        return
                if time.monotonic() > deadline:
                    raise AssertionError(f"router {self.name} never saw {count} routable unit(s)")
                await asyncio.sleep(0.05)

    async def metrics(self) -> str:
        async with aiohttp.ClientSession() as s:
            async with s.get(self.metrics_url) as r:
                return await r.text()

    def sigterm(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)

    async def wait_exit(self, timeout: float) -> int:
        assert self.proc is not None
        return await asyncio.wait_for(asyncio.to_thread(self.proc.wait), timeout)

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if self.proc.stdout:
            self.proc.stdout.close()
        return self.proc.returncode


@dataclass
class Outcome:
    """One client request as the client saw it."""

    sent: float
    done: float
    stream: bool
    status: int = 0
    unit: str = ""
    revision: str = ""
    ok: bool = False
    error: str = ""
    text: str = ""
    via: str = ""


@dataclass
class Load:
    """Closed-loop clients: each sends its next request when the previous one ends."""

    pick_url: object  # () -> base URL of the router to use
    clients: int = 8
    max_tokens: int = 6
    ignore_eos: bool = False  # generate max_tokens even if the tiny model emits EOS
    stream_max_tokens: int | None = None  # longer streams, so a failure can catch one mid-way
    outcomes: list[Outcome] = field(default_factory=list)
    live_streams: dict[str, int] = field(default_factory=dict)  # unit -> streams past their first event
    _stop: bool = False

    async def run(self, until) -> list[Outcome]:
        """Run until until(outcomes) is true; bounded by the caller's timeout."""
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:

            async def client(i: int) -> None:
                n = 0
                while not self._stop:
                    self.outcomes.append(await self.one(session, stream=(i + n) % 2 == 0))
                    n += 1
                    if until(self.outcomes):
                        self._stop = True

            await asyncio.gather(*(client(i) for i in range(self.clients)))
        return self.outcomes

    async def one(self, session: aiohttp.ClientSession, *, stream: bool) -> Outcome:
        base = self.pick_url()
        out = Outcome(sent=time.monotonic(), done=0.0, stream=stream, via=base)
        max_tokens = self.stream_max_tokens if stream and self.stream_max_tokens else self.max_tokens
        payload = {
            "model": "tiny",
            "prompt": "the router test",
            "max_tokens": max_tokens,
            "stream": stream,
            "ignore_eos": self.ignore_eos,
        }
        try:
            async with session.post(base + "/v1/completions", json=payload) as r:
                out.status = r.status
                out.unit = r.headers.get(contract.UNIT_HEADER, "")
                out.revision = r.headers.get(contract.REVISION_HEADER, "")
                if stream and r.status == 200:
                    body = b""
                    live = False
                    try:
                        async for piece in r.content.iter_any():
                            body += piece
                            if not live and b"data: " in body:
                                live = True  # this stream is now visibly in progress
                                self.live_streams[out.unit] = self.live_streams.get(out.unit, 0) + 1
                    finally:
                        if live:
                            self.live_streams[out.unit] -= 1
                else:
                    body = await r.read()
            if out.status != 200:
                out.error = body.decode(errors="replace")[:300]
            elif stream:
                events = [e[len(b"data: ") :] for e in body.split(b"\n\n") if e.startswith(b"data: ")]
                errors = [
                    json.loads(e)["error"]["message"] for e in events if e != b"[DONE]" and "error" in json.loads(e)
                ]
                if errors:
                    out.error = errors[0]
                elif events and events[-1] == b"[DONE]":
                    out.ok = True
                    out.text = "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1])
                else:
                    out.error = "stream ended without [DONE] or an error event"
            else:
                out.text = json.loads(body)["choices"][0]["text"]
                out.ok = True
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError) as exc:
            out.error = f"{exc.__class__.__name__}: {exc}"
        out.done = time.monotonic()
        return out
