"""A stand-in fleet in one process: hundreds to thousands of unit members (leaders and followers) on
distinct 127.0.0.1 ports, speaking the node's health contract (/health/ready, /health/watch with the
leader's report of its followers) and a minimal OpenAI completions API, with scripted readiness,
load and latency. No model, no engine: it exists to load a real router the way a fleet would.

Run by bench/fleet/run.py (`make bench-fleet`); a control port takes the script (kill a unit, change
the background load) and reports what every member saw. Deaths it can play, as a router meets them:
- exit: the process is gone. Its connections are reset; its port then resets every new connection
  (counted: a dead host's kernel refuses it, the router sees a failed connect either way).
- hang: the host stops answering (no FIN): open streams fall silent, new requests get no answer.
- unready: the unit reports broken and answers API requests 503, as a node that lost a member does.
And one that is not a death: leave marks a unit that stays alive while the driver deregisters it from
Cloud Map (a unit leaving the fleet), so the requests it still gets afterwards are counted.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import random
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from aiohttp import web

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
import contract  # noqa: E402 - after the path to this checkout is known
from runtime.router.balance import PROMPT_CHECKPOINTS  # noqa: E402

READY_PATH = contract.NODE_READY_PATH
WATCH_PATH = contract.NODE_WATCH_PATH
_MAX_HEAD = 64 * 1024


@dataclass
class Unit:
    name: str  # the unit id members report, e.g. cell3-unit7
    cell: str
    ecs_service: str  # what ECS would write as ECS_SERVICE_NAME
    decoy: bool  # alive and ready but never registered in Cloud Map: must never get a request
    ready_at: float  # monotonic time it becomes ready (scripted readiness)
    max_running: int
    members: list[Member] = field(default_factory=list)
    mode: str = "alive"  # alive | leave (alive, about to be deregistered) | exit | hang | unready
    event_at: float = 0.0  # monotonic time of the last scripted event
    in_flight: int = 0  # requests this process is answering for the unit
    background: int = 0  # requests other routers keep in flight there (scripted random walk)
    keys: list[int] = field(default_factory=list)  # routing keys of the latest background requests
    keys_seen: int = 0  # background requests ever admitted (each a key in the watch lines, as the node's)
    # each one's completion prompt as the node lists it ([key, bytes, tokens, tail], and its marks), or None
    prompts: list[tuple[list[int], list[int]] | None] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)  # monotonic arrival time of every API request
    refused_after_event: int = 0  # API requests answered 503 or dropped after the event
    tombstone: list[tuple[float, str]] = field(default_factory=list)  # (time, "api" | "watch") after exit
    watchers: list[Watcher] = field(default_factory=list)

    @property
    def state(self) -> str:
        if self.mode == "unready":
            return "broken"
        return "ready" if time.monotonic() >= self.ready_at else "forming"

    def body(self, member: Member) -> dict:
        leader = self.members[0]
        state = self.state
        ready = state == "ready"
        rank = member.rank
        return {
            "ready": ready,
            "state": state,
            "unit": self.name,
            "revision": "1",
            "rank": rank,
            "world_size": len(self.members),
            "role": "leader" if rank == 0 else "follower",
            "cell": self.cell,
            "load": {
                "queue_depth": max(0, self.in_flight + self.background - self.max_running),
                "running": min(self.max_running, self.in_flight + self.background),
                "max_running": self.max_running,
                "kv_cache_used": 0.0,
                "in_flight": (self.in_flight + self.background) if rank == 0 else 0,
                # prompt tokens waiting for a first token, as a leader reports them (docs/routing.md)
                "prefill_tokens": 1000 * max(0, self.in_flight + self.background - self.max_running)
                if rank == 0
                else 0,
            },
            "members": (
                [
                    {"rank": m.rank, "address": m.address, "state": state, "ready": ready, "revision": "1"}
                    for m in self.members[1:]
                ]
                if rank == 0
                else []
            ),
            "leader": "" if rank == 0 else leader.address,
        }

    def signature(self) -> tuple:
        return (self.state, self.in_flight + self.background)


@dataclass
class Member:
    unit: Unit
    rank: int
    port: int
    server: asyncio.base_events.Server | None = None
    connections: set[asyncio.Transport] = field(default_factory=set)
    polls: int = 0  # GET /health/ready answered
    api_requests: int = 0  # API requests that reached this member (a follower's must stay 0)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


@dataclass
class Watcher:
    transport: asyncio.Transport
    interval: float
    changes: float
    last_rest: bytes = b""
    last_load: bytes = b""
    last_sent: float = -1e9
    last_signature: tuple | None = None
    keys_sent: int = 0  # the unit's keys_seen when this watcher's last line went


def _split(body: dict) -> tuple[bytes, bytes]:
    """A ready body as (everything but the load, the load), each as compact JSON."""
    body = dict(body)
    load = json.dumps(body.pop("load"), separators=(",", ":")).encode()
    return json.dumps(body, separators=(",", ":")).encode(), load


class Fleet:
    def __init__(self, *, latency_ms: float, latency_cv: float, seed: int) -> None:
        self.units: list[Unit] = []
        self.latency_s = latency_ms / 1000
        self.latency_cv = latency_cv
        self.rng = random.Random(seed)
        self.changes_per_s = 0.0  # background load changes per unit per second
        # of the admitted background requests, the share that are completion prompts: the node lists
        # each one's size, tail hash and checkpoint hashes beside its key (`prompts` and `marks`)
        self.prompt_share = 0.0
        self.watch_lines = 0

    # --- serving ---------------------------------------------------------------------------
    async def listen(self, member: Member) -> None:
        loop = asyncio.get_running_loop()
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", member.port))
        member.port = sock.getsockname()[1]
        member.server = await loop.create_server(lambda: _Http(self, member), sock=sock, backlog=512)

    def latency(self) -> float:
        if self.latency_cv <= 0:
            return self.latency_s
        return self.rng.lognormvariate(0, self.latency_cv) * self.latency_s

    # --- the script ------------------------------------------------------------------------
    async def kill(self, unit: Unit, mode: str) -> float:
        unit.mode, unit.event_at = mode, time.monotonic()
        if mode == "exit":
            for m in unit.members:
                if m.server is not None:
                    m.server.close()
                for t in list(m.connections):
                    t.abort()
                m.connections.clear()
            unit.watchers.clear()
            loop = asyncio.get_running_loop()
            for m in unit.members:  # the port now resets whatever connects
                sock = socket.socket()
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind(("127.0.0.1", m.port))
                m.server = await loop.create_server(functools.partial(_Tombstone, unit), sock=sock, backlog=512)
        return unit.event_at

    async def ticker(self, tick: float) -> None:
        """Scripted background load, and every watcher's next line."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(tick)
            now = loop.time()
            p = self.changes_per_s * tick
            for unit in self.units:
                if unit.mode in ("exit", "hang"):
                    continue  # a dead or hung member sends nothing
                if unit.mode in ("alive", "leave") and p > 0 and self.rng.random() < p:
                    step = 1 if self.rng.random() < 0.5 else -1
                    before = unit.background
                    unit.background = min(unit.max_running, max(0, unit.background + step))
                    if unit.background > before:  # admitted: the node lists its routing key
                        key = self.rng.getrandbits(64)
                        unit.keys.append(key)
                        unit.prompts.append(self.prompt(key) if self.rng.random() < self.prompt_share else None)
                        unit.keys_seen += 1
                        del unit.keys[:-256], unit.prompts[:-256]
                if not unit.watchers:
                    continue
                sig = unit.signature()
                parts: tuple[bytes, bytes] | None = None
                for w in list(unit.watchers):
                    if w.transport.is_closing():
                        unit.watchers.remove(w)
                        continue
                    if sig == w.last_signature and now - w.last_sent < w.interval - tick / 2:
                        continue
                    if parts is None:
                        parts = _split(unit.body(unit.members[0]))
                    rest, load = parts
                    new = min(unit.keys_seen - w.keys_sent, len(unit.keys))
                    more = b""
                    if new > 0:
                        more = b',"keys":' + json.dumps(unit.keys[-new:], separators=(",", ":")).encode()
                        listed = [p for p in unit.prompts[-new:] if p is not None]
                        if listed:  # as the node's watch: the prompts, and their marks in the same order
                            more += b',"prompts":' + json.dumps([e for e, _ in listed], separators=(",", ":")).encode()
                            more += b',"marks":' + json.dumps([m for _, m in listed], separators=(",", ":")).encode()
                    w.keys_sent = unit.keys_seen
                    # as the node's watch: the whole body, a load-only line, or a heartbeat
                    if rest != w.last_rest:
                        w.transport.write(rest[:-1] + b',"load":' + load + more + b"}\n")
                    elif load != w.last_load or more:
                        w.transport.write(b'{"load":' + load + more + b"}\n")
                    else:
                        w.transport.write(b"\n")
                    w.last_rest, w.last_load, w.last_sent, w.last_signature = rest, load, now, sig
                    self.watch_lines += 1

    def prompt(self, key: int) -> tuple[list[int], list[int]]:
        """A completion prompt as a leader lists it: [key, bytes, tokens, tail hash] and the hashes of
        its checkpoints (balance.PROMPT_CHECKPOINTS of them, each a 64-bit hash as the tail's)."""
        length = self.rng.randrange(256, 32768)
        marks = [self.rng.getrandbits(64) for _ in range(PROMPT_CHECKPOINTS)]
        return [key, length, length // 4, self.rng.getrandbits(64)], marks

    # --- the report ------------------------------------------------------------------------
    def stats(self) -> dict:
        return {
            "watch_lines": self.watch_lines,
            "units": [
                {
                    "unit": u.name,
                    "decoy": u.decoy,
                    "mode": u.mode,
                    "event_at": u.event_at,
                    "requests": len(u.arrivals),
                    "arrivals_after_event": [a - u.event_at for a in u.arrivals if u.event_at and a >= u.event_at],
                    "refused_after_event": u.refused_after_event,
                    "tombstone": [(t - u.event_at, kind) for t, kind in u.tombstone],
                    "watchers": len(u.watchers),
                    "leader_polls": u.members[0].polls,
                    "follower_polls": sum(m.polls for m in u.members[1:]),
                    "follower_api_requests": sum(m.api_requests for m in u.members[1:]),
                }
                for u in self.units
            ],
        }

    def arrivals_since(self, unit: Unit, t: float) -> list[float]:
        return [a - t for a in unit.arrivals if a >= t]


class _Tombstone(asyncio.Protocol):
    """A dead member's port: read what the router tried, count it, reset the connection."""

    def __init__(self, unit: Unit) -> None:
        self.unit = unit
        self.buf = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if b"\r\n" in self.buf:
            if self.buf.startswith(b"POST "):
                kind = "api"
            elif self.buf.startswith(b"GET " + WATCH_PATH.encode()):
                kind = "watch"
            else:
                kind = "poll"
            self.unit.tombstone.append((time.monotonic(), kind))
            self.transport.abort()


class _Http(asyncio.Protocol):
    """HTTP/1.1 keep-alive for the API and /health/ready; /health/watch answers as HTTP/1.0 (the body
    ends when the connection does), as the node's aiohttp server does for an HTTP/1.0 request."""

    def __init__(self, fleet: Fleet, member: Member) -> None:
        self.fleet = fleet
        self.member = member
        self.buf = bytearray()
        self.watching = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.member.connections.add(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.member.connections.discard(self.transport)

    def data_received(self, data: bytes) -> None:
        if self.watching:
            return
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buf) > _MAX_HEAD:
                    self.transport.abort()
                return
            head = bytes(self.buf[:end]).decode("latin-1")
            lines = head.split("\r\n")
            method, target, _ = (lines[0].split(" ", 2) + ["", ""])[:3]
            length = 0
            for line in lines[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value.strip())
            if len(self.buf) < end + 4 + length:
                return
            del self.buf[: end + 4 + length]
            self.handle(method, target)
            if self.watching:
                return

    def handle(self, method: str, target: str) -> None:
        unit, member = self.member.unit, self.member
        path = urlsplit(target).path
        if unit.mode == "hang":
            if method == "POST" and member.rank == 0:
                unit.arrivals.append(time.monotonic())  # a request the router still sent it
            return  # the host is gone without a word
        if method == "GET" and path == READY_PATH:
            member.polls += 1
            body = unit.body(member)
            self.respond(200 if body["ready"] else 503, json.dumps(body).encode())
        elif method == "GET" and path == WATCH_PATH:
            query = parse_qs(urlsplit(target).query)
            interval = float(query.get("interval", ["0.25"])[0])
            changes = float(query.get("changes", [str(interval)])[0])
            self.watching = True
            self.transport.write(b"HTTP/1.0 200 OK\r\nContent-Type: application/x-ndjson\r\n\r\n")
            rest, load = _split(unit.body(member))
            self.transport.write(rest[:-1] + b',"load":' + load + b"}\n")
            if member.rank == 0:
                unit.watchers.append(
                    Watcher(
                        self.transport,
                        interval,
                        min(interval, changes),
                        rest,
                        load,
                        asyncio.get_running_loop().time(),
                        unit.signature(),
                        unit.keys_seen,
                    )
                )
        elif method == "POST" and path.startswith("/v1/"):
            member.api_requests += 1
            if member.rank != 0:
                self.respond(421, b'{"error": {"message": "a follower", "code": "not_leader"}}')
                return
            now = time.monotonic()
            unit.arrivals.append(now)
            if unit.mode == "unready" or unit.state != "ready":
                if unit.event_at and now >= unit.event_at:
                    unit.refused_after_event += 1
                self.respond(503, b'{"error": {"message": "not ready", "code": "unit_unavailable"}}')
                return
            unit.in_flight += 1
            asyncio.get_running_loop().call_later(self.fleet.latency(), self.complete)
        else:
            self.respond(404, b'{"error": {"message": "unknown path"}}')

    def complete(self) -> None:
        unit = self.member.unit
        unit.in_flight -= 1
        if unit.mode in ("exit", "hang"):
            return  # died with the request in flight: no answer
        body = (
            b'{"id":"cmpl-standin","object":"text_completion","model":"standin",'
            b'"choices":[{"index":0,"text":"ok","finish_reason":"length"}]}'
        )
        self.respond(200, body, unit=unit.name)

    def respond(self, status: int, body: bytes, *, unit: str = "") -> None:
        reason = {200: "OK", 404: "Not Found", 421: "Misdirected Request", 503: "Service Unavailable"}[status]
        extra = f"X-Flotilla-Unit: {unit}\r\nX-Flotilla-Revision: 1\r\n" if unit else ""
        if status == 503:
            extra += "Retry-After: 1\r\n"
        head = (
            f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            f"{extra}\r\n"
        ).encode()
        if not self.transport.is_closing():
            self.transport.write(head + body)


async def start_fleet(
    *,
    units: int,
    nodes: int,
    units_per_cell: int = 20,
    decoys: int = 0,
    max_running: int = 16,
    latency_ms: float = 20.0,
    latency_cv: float = 0.5,
    ready_over: float = 0.0,
    tick: float = 0.05,
    seed: int = 1,
) -> tuple[Fleet, asyncio.Task[None]]:
    """Every member listening on its own 127.0.0.1 port, and the ticker that drives load and watches."""
    fleet = Fleet(latency_ms=latency_ms, latency_cv=latency_cv, seed=seed)
    start = time.monotonic()
    rng = random.Random(seed)
    for i in range(units + decoys):
        decoy = i >= units
        cell = "decoys" if decoy else f"cell{i // units_per_cell}"
        index = i % units_per_cell if not decoy else i - units
        unit = Unit(
            name=f"{cell}-unit{index}",
            cell=cell,
            ecs_service=f"flotilla-{cell}-unit{index}",
            decoy=decoy,
            ready_at=start + rng.random() * ready_over,
            max_running=max_running,
        )
        unit.members = [Member(unit, rank, 0) for rank in range(nodes)]
        for m in unit.members:
            await fleet.listen(m)
        fleet.units.append(unit)
    return fleet, asyncio.get_running_loop().create_task(fleet.ticker(tick))


async def close_fleet(fleet: Fleet, ticker: asyncio.Task[None]) -> None:
    ticker.cancel()
    for unit in fleet.units:
        for m in unit.members:
            if m.server is not None:
                m.server.close()
            for t in list(m.connections):
                t.abort()


async def main_async(args: argparse.Namespace) -> None:
    # The control port first: thousands of member ports bound from the ephemeral range could take it.
    holder: dict[str, Fleet] = {}

    async def members(_: web.Request) -> web.Response:
        fleet = holder["fleet"]
        return web.json_response(
            [
                {
                    "unit": u.name,
                    "cell": u.cell,
                    "ecs_service": u.ecs_service,
                    "decoy": u.decoy,
                    "rank": m.rank,
                    "port": m.port,
                }
                for u in fleet.units
                for m in u.members
            ]
        )

    async def kill(request: web.Request) -> web.Response:
        doc = await request.json()
        fleet = holder["fleet"]
        unit = next(u for u in fleet.units if u.name == doc["unit"])
        return web.json_response({"at": await fleet.kill(unit, doc["mode"])})

    async def load(request: web.Request) -> web.Response:
        doc = await request.json()
        fleet = holder["fleet"]
        fleet.changes_per_s = float(doc["changes_per_s"])
        fleet.prompt_share = float(doc.get("prompt_share", fleet.prompt_share))
        return web.json_response({"changes_per_s": fleet.changes_per_s, "prompt_share": fleet.prompt_share})

    async def stats(_: web.Request) -> web.Response:
        return web.json_response(holder["fleet"].stats())

    app = web.Application()
    app.router.add_get("/control/members", members)
    app.router.add_post("/control/kill", kill)
    app.router.add_post("/control/load", load)
    app.router.add_get("/control/stats", stats)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", args.control_port)
    await site.start()
    fleet, _ = await start_fleet(
        units=args.units,
        nodes=args.nodes,
        units_per_cell=args.units_per_cell,
        decoys=args.decoys,
        max_running=args.max_running,
        latency_ms=args.latency_ms,
        latency_cv=args.latency_cv,
        ready_over=args.ready_over,
        tick=args.tick,
        seed=args.seed,
    )
    fleet.changes_per_s = args.load_changes
    holder["fleet"] = fleet
    print(json.dumps({"control_port": args.control_port, "members": sum(len(u.members) for u in fleet.units)}))
    sys.stdout.flush()
    await asyncio.Event().wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--units", type=int, required=True)
    ap.add_argument("--nodes", type=int, default=8, help="members per unit (rank 0 leads)")
    ap.add_argument("--units-per-cell", type=int, default=20)
    ap.add_argument("--decoys", type=int, default=2, help="ready units never registered in Cloud Map")
    ap.add_argument("--max-running", type=int, default=16)
    ap.add_argument("--latency-ms", type=float, default=20.0, help="median time to answer a completion")
    ap.add_argument("--latency-cv", type=float, default=0.5)
    ap.add_argument("--ready-over", type=float, default=2.0, help="units become ready over this many seconds")
    ap.add_argument("--load-changes", type=float, default=0.0, help="background load changes per unit per s")
    ap.add_argument("--tick", type=float, default=0.05, help="seconds between watch checks")
    ap.add_argument("--control-port", type=int, required=True)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    asyncio.run(main_async(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
