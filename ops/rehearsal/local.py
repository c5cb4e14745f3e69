"""Local stand-ins for what ECS runs on EC2: each task a real `python -m runtime node` process on
127.0.0.1, Cloud Map a units file the real router re-reads, and the router itself.

The tasks of one deployment of a unit find each other by static rendezvous on ports the deployment
holds (ECS rendezvous groups tasks by task definition and deployment the same way): a replacement
task takes its predecessor's rank and port. The runtime is started as a program, the way `make local`
starts it; only the router's command line is built from its settings (runtime.router.settings).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

import contract
from ops.rehearsal.ecs import Deployment, TaskHandle
from ops.rehearsal.template import UnitService
from runtime.router.settings import router_command

REPO = Path(__file__).resolve().parents[2]

# Kept from the task definition's environment: identity and the model's name and strategies. The
# rest is local: static rendezvous, 127.0.0.1 ports, the local engine.
_FROM_TEMPLATE = (
    contract.ENV_UNIT_ID,
    contract.ENV_CELL_ID,
    contract.ENV_MODEL_NAME,
    contract.ENV_PREFILL_STRATEGY,
    contract.ENV_DECODE_STRATEGY,
)


def free_port(avoid: set[int]) -> int:
    """A loopback port that is free now and not in `avoid` (which it joins)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in avoid:
            avoid.add(port)
            return port
    raise RuntimeError("no free loopback port found")


@dataclass(frozen=True)
class LocalSettings:
    log_dir: Path
    scale: float  # real seconds per emulated second: drain timeouts scale with the stop timeout
    engine: str = "echo"
    model: str = "tiny"
    ready_settle_s: float = 0.5  # real seconds; the router polls every ROUTER_POLL_S
    env: Mapping[str, str] = field(default_factory=dict)  # extra settings for every node


ROUTER_POLL_S = 0.05  # real seconds between the router's health polls of a member
ROUTER_DISCOVERY_S = 0.1  # real seconds between its re-reads of the units file (Cloud Map)


class NodeProcess:
    """One task: a node process in its own process group, logging to its own file."""

    def __init__(self, name: str, port: int, cmd: list[str], env: Mapping[str, str], log: Path) -> None:
        self.name, self.port, self.log = name, port, log
        with open(log, "ab") as out:
            self.popen = subprocess.Popen(
                cmd, env=dict(env), cwd=str(REPO), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def running(self) -> bool:
        return self.popen.poll() is None

    def terminate(self) -> None:
        if self.running():
            self.popen.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL to the node's process group, like the end of a container. The engine process runs in
        a session of its own, so the group does not reach it: it exits within a second of its node,
        when it sees its parent gone (runtime/node/engine_host.py)."""
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.popen.wait(timeout=10)


class LocalFleet:
    """Launches node processes for the emulated ECS services and keeps the Cloud Map stand-in."""

    def __init__(self, settings: LocalSettings, units_file: Path) -> None:
        self.s = settings
        self.units_file = units_file
        self.ports: set[int] = set()
        self._slots: dict[tuple[str, str], tuple[list[int], int]] = {}  # (unit, deployment) -> ports, dist
        self._registered: dict[str, str] = {}  # task name -> URL
        self.processes: list[NodeProcess] = []
        self._session: aiohttp.ClientSession | None = None
        units_file.write_text("")

    def _deployment_ports(self, service: UnitService, dep: Deployment) -> tuple[list[int], int]:
        key = (service.unit_id, dep.deployment_id)
        if key not in self._slots:
            ports = [free_port(self.ports) for _ in range(service.desired_count)]
            self._slots[key] = (ports, free_port(self.ports))
        return self._slots[key]

    def node_env(self, service: UnitService, dep: Deployment, slot: int) -> dict[str, str]:
        ports, dist = self._deployment_ports(service, dep)
        env = {k: v for k, v in os.environ.items() if k != contract.ENV_PORT}
        env.update({k: service.environment[k] for k in _FROM_TEMPLATE if k in service.environment})
        env.update(
            {
                contract.ENV_REVISION: dep.revision.label,
                contract.ENV_RENDEZVOUS: "static",
                contract.ENV_PEERS: ",".join(f"127.0.0.1:{p}" for p in ports),
                contract.ENV_RANK: str(slot),
                contract.ENV_PORT: str(ports[slot]),
                "FLOTILLA_DIST_PORT": str(dist),
                "FLOTILLA_BIND_HOST": "127.0.0.1",
                contract.ENV_ENGINE: self.s.engine,
                contract.ENV_MODEL: self.s.model,
                # The node's drain must end inside the scaled stop timeout, as on ECS.
                contract.ENV_DRAIN_TIMEOUT: f"{service.drain_timeout_s * self.s.scale:.3f}",
                "FLOTILLA_ECHO_LOAD_S": f"{dep.revision.load_s:g}",
                "FLOTILLA_READY_SETTLE_S": f"{self.s.ready_settle_s:g}",
                "FLOTILLA_TORCH_THREADS": "1",
                "PYTHONPATH": os.pathsep.join(x for x in (str(REPO), os.environ.get("PYTHONPATH", "")) if x),
                **self.s.env,
            }
        )
        return env

    def launch(self, service: UnitService, deployment: Deployment, slot: int) -> TaskHandle:
        ports, _ = self._deployment_ports(service, deployment)
        n = sum(1 for p in self.processes if p.name.startswith(f"{service.unit_id}/"))
        name = f"{service.unit_id}/{deployment.revision.label}/rank{slot}#{n}"
        proc = NodeProcess(
            name,
            ports[slot],
            [sys.executable, "-m", "runtime", "node"],
            self.node_env(service, deployment, slot),
            self.s.log_dir / f"{name.replace('/', '_').replace('#', '-')}.log",
        )
        self.processes.append(proc)
        return proc

    def _write_units_file(self) -> None:
        # Written whole and renamed: the router never reads half a file.
        tmp = self.units_file.with_suffix(".tmp")
        tmp.write_text("".join(f"{url}\n" for url in sorted(self._registered.values())))
        tmp.replace(self.units_file)

    def register(self, handle: TaskHandle) -> None:
        assert isinstance(handle, NodeProcess)
        self._registered[handle.name] = handle.url
        self._write_units_file()

    def deregister(self, handle: TaskHandle) -> None:
        if self._registered.pop(handle.name, None) is not None:
            self._write_units_file()

    async def probe(self, handle: TaskHandle, path: str, timeout_s: float) -> bool:
        """The health check command's GET: exit 0 on a 2xx/3xx answer (urlopen raises on >= 400)."""
        assert isinstance(handle, NodeProcess)
        if self._session is None:
            self._session = aiohttp.ClientSession()
        try:
            async with self._session.get(handle.url + path, timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
                return r.status < 400
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def close(self) -> None:
        """Kill whatever is still running (the services stop their tasks first)."""
        for proc in self.processes:
            if proc.running():
                proc.kill()
        if self._session is not None:
            await self._session.close()


@dataclass(frozen=True)
class DrainLog:
    """A stopped node's own account of its drain, from its log lines."""

    in_flight: int  # requests it held at SIGTERM (drain_started)
    handed_over: int  # requests it ended by handing them over to the router (request lines)
    unfinished: int | None  # still open when its drain timeout ran out (drain_finished); None: killed first


def drain_log(handle: TaskHandle) -> DrainLog | None:
    """What the node's log says of its drain; None when it never started one."""
    assert isinstance(handle, NodeProcess)
    started: dict[str, Any] | None = None
    finished: dict[str, Any] | None = None
    handed_over = 0
    for text in handle.log.read_text(errors="replace").splitlines():
        try:
            line = json.loads(text)
        except ValueError:
            continue  # not a log line (a crash's traceback): the lines around it still count
        event = line.get("event") if isinstance(line, dict) else None
        if event == "drain_started":
            started = line
        elif event == "drain_finished":
            finished = line
        elif event == "request" and line.get("handed_over"):
            handed_over += 1
    if started is None:
        return None
    return DrainLog(
        in_flight=int(started.get("in_flight", 0)),
        handed_over=handed_over,
        unfinished=int(finished["unfinished"]) if finished is not None else None,
    )


class RouterProcess:
    """The real router, discovering members from the units file as it would from Cloud Map."""

    def __init__(self, units_file: Path, log: Path, ports: set[int], *, max_moves: int | None = None) -> None:
        self.port = free_port(ports)
        cmd = router_command(
            host="127.0.0.1",
            port=self.port,
            metrics_port=0,  # several rehearsals may run on one host; none reads the router's metrics
            discovery="static",
            units_file=units_file,
            discovery_interval_s=ROUTER_DISCOVERY_S,
            poll_interval_s=ROUTER_POLL_S,
            drain_grace_s=0,
            access_log="off",
            max_moves=max_moves,  # 0: no stream moves, so a draining leader waits for its answers; None: the default
        )
        env = {k: v for k, v in os.environ.items() if k != contract.ENV_PORT}
        env["PYTHONPATH"] = os.pathsep.join(x for x in (str(REPO), os.environ.get("PYTHONPATH", "")) if x)
        self.proc = NodeProcess("router", self.port, cmd, env, log)

    @property
    def url(self) -> str:
        return self.proc.url

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.popen.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
