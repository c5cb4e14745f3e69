"""`make local` / `python -m runtime.local`: units of node processes (and the router) on 127.0.0.1.

The same code paths as on AWS, with static rendezvous and gloo. Writes .flotilla/local.json
(every process: unit, rank, role, pid, ports) while running; Ctrl-C drains and stops everything.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import contract
from contract import Engine
from runtime.ports import free_port, port_free
from runtime.router.settings import router_command
from runtime.scaler import local_cli as local_scaler
from runtime.scaler.local_units import Member

REPO = Path(__file__).resolve().parents[1]
DEFAULT_PUBLIC_PORT = 8080
QUESTION = "Which waterproof hiking boots are best for wet trails?"


@dataclass
class Proc:
    role: str  # leader | follower | router
    unit: str | None
    rank: int | None
    ports: dict[str, int]
    cmd: list[str]
    env: dict[str, str]
    log: Path
    popen: subprocess.Popen | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def start(self) -> None:
        self.extra["started"] = time.monotonic()
        with open(self.log, "ab") as f:
            # Own process group (setsid): Ctrl-C reaches only this launcher, which stops everything in order.
            self.popen = subprocess.Popen(
                self.cmd, env=self.env, cwd=str(REPO), stdout=f, stderr=subprocess.STDOUT, start_new_session=True
            )

    def describe(self) -> dict[str, Any]:
        return {
            "unit": self.unit,
            "rank": self.rank,
            "role": self.role,
            "pid": self.popen.pid if self.popen else None,
            "ports": self.ports,
            "log": str(self.log),
        }

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    @property
    def process(self) -> subprocess.Popen:
        """The started process; asking before start() is a bug in this launcher."""
        if self.popen is None:
            raise RuntimeError(f"local: the {self.role} process was never started")
        return self.popen


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:  # noqa: S310 - http://127.0.0.1 URLs we build
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


def _routable_units(router_url: str) -> int:
    """How many units the router would route to now (its /health body), 0 when it cannot say."""
    try:
        with urllib.request.urlopen(router_url + contract.ROUTER_HEALTH_PATH, timeout=2) as r:  # noqa: S310
            return int(json.load(r).get("routable_units", 0))
    except (OSError, ValueError):
        return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    router_available = importlib.util.find_spec("runtime.router.cli") is not None
    p = argparse.ArgumentParser(prog="python -m runtime.local", description=__doc__)
    p.add_argument("--units", type=int, default=1, help="units to start (default 1)")
    p.add_argument("--nodes", type=int, default=2, help="members per unit (default 2)")
    p.add_argument("--model", default="smollm2", help="tiny | smollm2 | checkpoint directory (default smollm2)")
    p.add_argument("--engine", default="reference", help="reference (default) | echo (plumbing only, no model)")
    p.add_argument(
        "--router",
        choices=("auto", "on", "off"),
        default="auto",
        help="put the router in front of the units (auto, the default: when runtime/router/cli.py "
        f"is present{'' if router_available else ', which it is not in this checkout'})",
    )
    p.add_argument(
        "--port", type=int, default=None, help=f"public port (default ${contract.ENV_PORT} or {DEFAULT_PUBLIC_PORT})"
    )
    p.add_argument(
        "--balance",
        choices=contract.ROUTER_BALANCE_POLICIES,
        default=None,
        help="the router's policy (default: the router's own, cache_aware; docs/routing.md)",
    )
    p.add_argument("--state-dir", default=str(REPO / ".flotilla"), help="where local.json and logs go")
    p.add_argument("--ready-timeout", type=float, default=900.0, help="seconds to wait for readiness")
    p.add_argument("--drain-timeout", type=float, default=30.0, help="seconds in-flight requests get on stop")
    local_scaler.add_arguments(p)
    a = p.parse_args(argv)
    if a.units < 1 or a.nodes < 1:
        p.error("--units and --nodes must be at least 1")
    if a.router == "on" and not router_available:
        p.error("--router on: runtime/router/cli.py is not in this checkout; use --router off")
    a.use_router = a.router == "on" or (a.router == "auto" and router_available)
    if os.environ.get(contract.ENV_API_KEY) and not a.use_router:
        p.error(f"{contract.ENV_API_KEY} (make local API_KEY=...) is checked by the router: drop --router off")
    local_scaler.check_arguments(p, a)
    if a.port is None:
        raw = os.environ.get(contract.ENV_PORT) or str(DEFAULT_PUBLIC_PORT)
        try:
            a.port = int(raw)
        except ValueError:
            p.error(f"{contract.ENV_PORT}={raw!r} is not a port number: give e.g. PORT=8080")
    if not 1 <= a.port <= 65535:
        p.error(f"public port {a.port} is out of range 1..65535")
    return a


def base_environment() -> dict[str, str]:
    """What every process inherits: this environment without the public port and the API key (the
    key goes to the router alone: it is the only one that checks it), with the checkout importable."""
    env = {k: v for k, v in os.environ.items() if k not in (contract.ENV_PORT, contract.ENV_API_KEY)}
    env["PYTHONPATH"] = os.pathsep.join(x for x in (str(REPO), os.environ.get("PYTHONPATH", "")) if x)
    return env


def unit_processes(
    a: argparse.Namespace,
    unit_id: str,
    logs: Path,
    taken: set[int],
    base_env: dict[str, str],
    public_port: int | None = None,
) -> list[Proc]:
    """The members of one unit on free ports (added to `taken`), rank 0 leading; with public_port the
    leader listens there (no router in front)."""
    ports: list[int] = []
    for _ in range(a.nodes):
        ports.append(free_port(avoid=taken))
        taken.add(ports[-1])
    if public_port is not None:
        ports[0] = public_port
    dist = free_port(avoid=taken)
    taken.add(dist)
    peers = ",".join(f"127.0.0.1:{p}" for p in ports)
    procs = []
    for r in range(a.nodes):
        env = {
            **base_env,
            contract.ENV_UNIT_ID: unit_id,
            contract.ENV_REVISION: "local",
            contract.ENV_PEERS: peers,
            contract.ENV_RANK: str(r),
            contract.ENV_ENGINE: a.engine,
            contract.ENV_MODEL: a.model,
            "FLOTILLA_DIST_PORT": str(dist),
            "FLOTILLA_BIND_HOST": "127.0.0.1",
            contract.ENV_DRAIN_TIMEOUT: str(a.drain_timeout),
        }
        procs.append(
            Proc(
                role="leader" if r == 0 else "follower",
                unit=unit_id,
                rank=r,
                ports={"api": ports[r], **({"dist": dist} if r == 0 else {})},
                cmd=[sys.executable, "-m", "runtime", "node"],
                env=env,
                log=logs / f"{unit_id}-rank{r}.log",
            )
        )
    return procs


def plan_processes(a: argparse.Namespace, logs: Path) -> list[Proc]:
    base_env = base_environment()
    procs: list[Proc] = []
    leaders: list[str] = []
    taken = {a.port}  # every port handed out must differ
    for u in range(a.units):
        members = unit_processes(
            a, f"local-unit{u}", logs, taken, base_env, public_port=a.port if u == 0 and not a.use_router else None
        )
        leaders.append(f"http://127.0.0.1:{members[0].ports['api']}")
        procs.extend(members)
    if a.use_router:
        env = {
            **base_env,
            contract.ENV_PORT: str(a.port),
            contract.ENV_DISCOVERY: "static",
            contract.ENV_DRAIN_TIMEOUT: str(a.drain_timeout),
        }
        # With the scaler the units come and go: the router re-reads them from a file.
        discovery = local_scaler.router_discovery(a, leaders) if a.scaler else {}
        if not a.scaler:
            env[contract.ENV_UNITS] = ",".join(leaders)
        if os.environ.get(contract.ENV_API_KEY):
            env[contract.ENV_API_KEY] = os.environ[contract.ENV_API_KEY]
        metrics = free_port(avoid=taken)
        procs.append(
            Proc(
                role="router",
                unit=None,
                rank=None,
                ports={"http": a.port, "metrics": metrics},
                # no load balancer watches a local router's /health: no drain grace
                cmd=router_command(
                    host="127.0.0.1",
                    metrics_port=metrics,
                    drain_grace_s=0,
                    poll_timeout_s=5,  # a laptop busy with the model answers polls late: not "unit gone"
                    balance=a.balance or None,
                    **discovery,
                ),
                env=env,
                log=logs / "router.log",
            )
        )
    return procs


def prepare_model(model: str, engine: str) -> None:
    """Convert smollm2 once, up front, with progress on the terminal (the nodes then just load it)."""
    if engine != Engine.REFERENCE or model != "smollm2":
        return
    print(
        "preparing smollm2 (converted once to safetensors and cached; the first time takes about a minute) ...",
        flush=True,
    )
    code = "from runtime.models.registry import resolve_model; resolve_model('smollm2', progress=print)"
    subprocess.run([sys.executable, "-c", code], cwd=str(REPO), check=True, env={**os.environ, "PYTHONPATH": str(REPO)})


def stop_all(procs: Sequence[Member], timeout_s: float) -> None:
    # Router first (stop taking requests), then leaders (drain), then followers.
    for role in ("router", "leader", "follower"):
        group = [p for p in procs if p.role == role and p.alive()]
        for p in group:
            p.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for p in group:
            try:
                p.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.process.kill()
                p.process.wait(timeout=10)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    state = Path(a.state_dir)
    logs = state / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    if not port_free(a.port):
        print(
            f"local: port {a.port} on 127.0.0.1 is busy: stop what uses it or run with PORT=<another port>",
            file=sys.stderr,
        )
        return 2
    try:
        prepare_model(a.model, a.engine)
    except subprocess.CalledProcessError as e:
        print(f"local: preparing model {a.model} failed (exit {e.returncode}); see the messages above", file=sys.stderr)
        return 1
    procs = plan_processes(a, logs)
    base_env = base_environment()
    stopping = {"flag": False}

    def on_signal(signum, frame):  # noqa: ARG001
        stopping["flag"] = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    manifest = state / "local.json"
    url = f"http://127.0.0.1:{a.port}"
    scaler = None
    try:
        for p in procs:
            p.start()
        manifest.write_text(
            json.dumps(
                {
                    "url": url,
                    "model": a.model,
                    "units": a.units,
                    "nodes": a.nodes,
                    "router": a.use_router,
                    "launcher_pid": os.getpid(),
                    "processes": [p.describe() for p in procs],
                },
                indent=2,
            )
            + "\n"
        )
        print(f"started {len(procs)} processes (logs in {logs}); waiting for the units to be ready ...", flush=True)
        deadline = time.monotonic() + a.ready_timeout
        members = [p for p in procs if p.role in ("leader", "follower")]
        while True:
            if stopping["flag"]:
                return 0
            dead = [p for p in procs if not p.alive()]
            if dead:
                d = dead[0]
                tail = d.log.read_text(errors="replace")[-3000:] if d.log.exists() else ""
                print(
                    f"local: {d.role} {d.unit or ''} rank {d.rank} exited with {d.process.returncode} during start-up; "
                    f"its log ({d.log}) ends with:\n{tail}",
                    file=sys.stderr,
                )
                return 1
            ready = all(_get(f"http://127.0.0.1:{p.ports['api']}{contract.NODE_READY_PATH}") == 200 for p in members)
            if ready and a.use_router:
                # Ready units are not enough: the URL we print must already route, so wait until
                # the router's own polls have seen every unit ready.
                ready = _routable_units(url) >= a.units
            if ready:
                break
            if time.monotonic() > deadline:
                print(f"local: not ready after {a.ready_timeout:.0f}s; see the logs in {logs}", file=sys.stderr)
                return 1
            time.sleep(0.5)
        model_name = os.path.basename(a.model.rstrip("/"))
        body = json.dumps(
            {
                "model": model_name,
                "stream": True,
                "max_tokens": 200,
                "temperature": 0.2,
                "messages": [{"role": "user", "content": QUESTION}],
            }
        )
        keyed = a.use_router and bool(os.environ.get(contract.ENV_API_KEY))
        auth = "-H 'Authorization: Bearer <API_KEY>' " if keyed else ""
        print(
            f"\nflotilla is serving {a.model} at {url}/v1  ({a.units} unit(s) x {a.nodes} nodes"
            f"{', behind the router' if a.use_router else ''}"
            f"{', API key required' if keyed else ', open: no API key'}; processes in {manifest})\n\n"
            f"try:\n  curl -N {url}/v1/chat/completions -H 'Content-Type: application/json' {auth}\\\n"
            f"       -d '{body}'\n\nCtrl-C stops everything.",
            flush=True,
        )
        if a.scaler:
            scaler = local_scaler.start(
                a, procs, url, manifest, plan=lambda unit_id, taken: unit_processes(a, unit_id, logs, taken, base_env)
            )
        while not stopping["flag"]:
            watched = procs if scaler is None else [p for p in procs if p.role == "router"]
            for p in watched:
                if p.popen is not None and p.popen.poll() is not None and not p.extra.get("reported"):
                    p.extra["reported"] = True
                    print(
                        f"local: {p.role} {p.unit or ''} rank {p.rank} exited with {p.popen.returncode}; see {p.log}",
                        file=sys.stderr,
                        flush=True,
                    )
            if scaler is not None:
                scaler.tick()
            time.sleep(0.3)
        return 0
    finally:
        print("stopping (draining in-flight requests) ...", flush=True)
        held = local_scaler.finish(scaler) if scaler is not None else []
        stop_all([*procs, *(p for p in held if p not in procs)], a.drain_timeout + 15)
        manifest.unlink(missing_ok=True)
        print("stopped.", flush=True)


if __name__ == "__main__":
    sys.exit(main())
