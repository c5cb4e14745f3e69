"""Fleet benchmark: one real router process against a stand-in fleet registered in Cloud Map as ECS
registers it, at 160 units / 1,280 members and 625 units / 5,000 members.

Measures, per size: router CPU per second spent on discovery and health (an idle fleet, then one whose
load changes as a loaded fleet's does, its leaders listing each admitted request's routing key and,
for the --prompt-share of them that are completion prompts, the prompt's size and checkpoints, as a
node's watch does), router memory, time from a unit's death (process exit, hung
host, unit turned unready, unit deregistered) to no new requests, routing errors, requests to members
that are not in the fleet or not leaders, and request throughput. Run: `make bench-fleet` (its tiny mode,
--tiny: 6 units of 2 members for a few seconds, is part of `make test`); results are appended to
bench/results/fleet.json and bench/fleet/table.py prints them.

Set-up: Cloud Map is moto's, with the documented quotas, caps and revisions (bench/fleet/cloudmap.py),
served over HTTP on 127.0.0.1; the router (`python -m runtime router --discovery cloudmap`, default
settings otherwise) is pinned to core 0; the stand-in fleet (bench/fleet/standin.py), Cloud Map and the
load generator share core 1.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
import contract  # noqa: E402 - after the path to this checkout is known
from bench.fleet.cloudmap import documented_cloud_map, ecs_attributes, serve_http  # noqa: E402
from bench.measure import (  # noqa: E402
    append_run,
    cpu_seconds,
    cpu_split,
    pct,
    pin_self,
    pinned,
    results_file,
    start_router,
    tiny_mode,
)
from runtime.ports import free_port  # noqa: E402

NAMESPACE = "flotilla.internal"
perf_counter = time.perf_counter


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def get_json(url: str, data: dict | None = None, timeout: float = 30.0) -> object:
    req = urllib.request.Request(  # noqa: S310 - 127.0.0.1 only
        url,
        data=json.dumps(data).encode() if data is not None else None,
        headers={"Content-Type": "application/json"},
        method="POST" if data is not None else "GET",
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310 - 127.0.0.1 only
        return json.loads(r.read())


class Client(asyncio.Protocol):
    """One keep-alive connection, one request at a time; any status counts (errors included)."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.done: asyncio.Future[int] | None = None
        self.head_end = -1
        self.length = -1
        self.status = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def send(self, data: bytes) -> asyncio.Future[int]:
        self.buf.clear()
        self.head_end = self.length = -1
        self.done = asyncio.get_running_loop().create_future()
        self.transport.write(data)
        return self.done

    def data_received(self, data: bytes) -> None:
        assert self.done is not None
        self.buf += data
        if self.head_end < 0:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            self.head_end = end + 4
            head = bytes(self.buf[:end]).lower()
            self.status = int(head.split(b" ", 2)[1])
            at = head.find(b"content-length:")
            self.length = int(head[at + 15 :].split(b"\r\n", 1)[0]) if at >= 0 else 0
        if len(self.buf) >= self.head_end + self.length and not self.done.done():
            self.done.set_result(self.status)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_exception(ConnectionError("connection lost"))


class Load:
    """Closed-loop clients through the router; counts statuses and latencies while `measuring`."""

    def __init__(self, port: int, concurrency: int) -> None:
        body = json.dumps({"model": "standin", "prompt": "hello", "max_tokens": 2}).encode()
        self.request = (
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        self.port, self.concurrency = port, concurrency
        self.statuses: dict[int, int] = {}
        self.latencies: list[float] = []
        self.stop = False
        self.tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self.tasks = [asyncio.get_running_loop().create_task(self.worker()) for _ in range(self.concurrency)]

    def reset(self) -> None:
        self.statuses, self.latencies = {}, []

    async def worker(self) -> None:
        loop = asyncio.get_running_loop()
        client: Client | None = None
        while not self.stop:
            if client is None or client.transport.is_closing():
                _, client = await loop.create_connection(Client, "127.0.0.1", self.port)
            t0 = perf_counter()
            try:
                status = await client.send(self.request)
            except ConnectionError:
                status = 599  # the router closed the connection on us
                client = None
            self.statuses[status] = self.statuses.get(status, 0) + 1
            self.latencies.append(perf_counter() - t0)
        if client is not None:
            client.transport.close()

    async def close(self) -> None:
        self.stop = True
        await asyncio.gather(*self.tasks, return_exceptions=True)


def register(members: list[dict], sd) -> dict[str, list[tuple[str, str]]]:
    """Register every non-decoy member in its cell's service as ECS would; {unit: [(service id, instance id)]}."""
    sd.create_http_namespace(Name=NAMESPACE)
    ns = next(n["Id"] for n in sd.list_namespaces()["Namespaces"] if n["Name"] == NAMESPACE)
    services: dict[str, str] = {}
    out: dict[str, list[tuple[str, str]]] = {}
    for m in members:
        if m["decoy"]:
            continue
        name = f"{contract.CLOUDMAP_UNITS_SERVICE_PREFIX}{m['cell']}"
        if name not in services:
            services[name] = sd.create_service(Name=name, NamespaceId=ns)["Service"]["Id"]
        instance = f"task-{m['unit']}-{m['rank']}"
        sd.register_instance(
            ServiceId=services[name],
            InstanceId=instance,
            Attributes=ecs_attributes(
                ip="127.0.0.1",
                port=m["port"],
                ecs_service=m["ecs_service"],
                cluster=f"flotilla-{m['cell']}",
                task_family=f"flotilla-{m['unit']}",
                instance_id=f"i-{abs(hash(instance)) % 16**12:012x}",
                az="us-east-1a",
            ),
        )
        out.setdefault(m["unit"], []).append((services[name], instance))
    return out


def routable_units(port: int) -> int:
    try:
        return int(get_json(f"http://127.0.0.1:{port}{contract.ROUTER_HEALTH_PATH}", timeout=5)["routable_units"])  # type: ignore[index]
    except OSError:
        return -1


def scrape(metrics_port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}{contract.METRICS_PATH}", timeout=30) as r:  # noqa: S310
        return r.read().decode()


def metric_sum(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def run_size(args: argparse.Namespace, units: int, sd) -> dict:
    control = free_port()
    fleet = subprocess.Popen(
        pinned(
            args.load_cpu,
            sys.executable,
            "-m",
            "bench.fleet.standin",
            "--units",
            str(units),
            "--nodes",
            str(args.nodes),
            "--decoys",
            str(args.decoys),
            "--control-port",
            str(control),
            "--latency-ms",
            str(args.latency_ms),
        ),
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    router: subprocess.Popen[bytes] | None = None
    record: dict = {"units": units, "members": units * args.nodes, "nodes_per_unit": args.nodes}
    try:
        assert fleet.stdout is not None
        ready = fleet.stdout.readline()  # a JSON line once every member listens
        if not ready:
            raise RuntimeError(f"the stand-in fleet exited ({fleet.wait()}) before listening")
        members = get_json(f"http://127.0.0.1:{control}/control/members")
        assert isinstance(members, list)
        t0 = time.monotonic()
        registered = register(members, sd)
        record["register_s"] = round(time.monotonic() - t0, 1)
        cells = sorted({m["cell"] for m in members if not m["decoy"]}, key=lambda c: int(c[4:]))
        services = ",".join(f"{contract.CLOUDMAP_UNITS_SERVICE_PREFIX}{c}" for c in cells)
        port = free_port(avoid={control})
        metrics_port = free_port(avoid={control, port})
        env = {
            **os.environ,
            "AWS_ENDPOINT_URL_SERVICEDISCOVERY": f"http://127.0.0.1:{args.cloudmap_port}",
            "AWS_DISABLE_HOST_PREFIX_INJECTION": "true",
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
        }
        router_log = tempfile.TemporaryFile()
        router = start_router(
            cpus=args.router_cpu,
            port=port,
            settings={"discovery": "cloudmap", "cloudmap_namespace": NAMESPACE, "cloudmap_services": services},
            router_args=args.router_args,
            cwd=REPO,
            env=env,
            stderr=router_log,
            metrics_port=metrics_port,
        )
        t0 = time.monotonic()
        deadline = t0 + args.startup_timeout
        while routable_units(port) < units:
            if time.monotonic() > deadline or router.poll() is not None:
                router_log.seek(0)
                tail = router_log.read().decode(errors="replace")[-3000:]
                raise RuntimeError(f"router did not see {units} routable units (saw {routable_units(port)}):\n{tail}")
            time.sleep(0.2)
        record["startup_s"] = round(time.monotonic() - t0, 1)
        time.sleep(args.settle)
        before = get_json(f"http://127.0.0.1:{control}/control/stats")

        # Discovery and health with no traffic: heartbeats, revision checks, nothing else.
        c0, w0 = cpu_seconds(router.pid), time.monotonic()
        time.sleep(args.idle_seconds)
        record["idle_cpu_pct"] = round(100 * (cpu_seconds(router.pid) - c0) / (time.monotonic() - w0), 2)
        record["rss_mib"] = round(rss_mib(router.pid), 1)
        # The same while every unit's load changes as a fleet's under load does (other routers' traffic).
        get_json(
            f"http://127.0.0.1:{control}/control/load",
            {"changes_per_s": args.load_changes, "prompt_share": args.prompt_share},
        )
        time.sleep(1.0)
        # Watch lines read in the window: on a loaded machine the stand-in fleet sends fewer than asked,
        # so CPU per line is the figure that compares runs; the percentage is the goal's.
        lines0 = metric_sum(scrape(metrics_port), "flotilla_router_watch_lines")
        (u0, s0), w0 = cpu_split(router.pid), time.monotonic()
        time.sleep(args.idle_seconds)
        (u1, s1), busy_wall = cpu_split(router.pid), time.monotonic() - w0
        busy_cpu = (u1 - u0) + (s1 - s0)
        lines = metric_sum(scrape(metrics_port), "flotilla_router_watch_lines") - lines0
        record["busy_fleet_cpu_pct"] = round(100 * busy_cpu / busy_wall, 2)
        # Python's share (user) and the kernel's (system: socket reads): which one a change can cut.
        record["busy_fleet_user_pct"] = round(100 * (u1 - u0) / busy_wall, 2)
        record["busy_fleet_sys_pct"] = round(100 * (s1 - s0) / busy_wall, 2)
        record["busy_fleet_watch_lines_per_s"] = round(lines / busy_wall, 1)
        record["router_cpu_us_per_watch_line"] = round(1e6 * busy_cpu / lines, 1) if lines else None
        record["load_changes_per_unit_s"] = args.load_changes
        record["prompt_share"] = args.prompt_share
        after = get_json(f"http://127.0.0.1:{control}/control/stats")
        record["follower_polls_steady"] = sum(u["follower_polls"] for u in after["units"]) - sum(  # type: ignore[index]
            u["follower_polls"]
            for u in before["units"]  # type: ignore[index]
        )
        record["leader_polls_steady"] = sum(u["leader_polls"] for u in after["units"]) - sum(  # type: ignore[index]
            u["leader_polls"]
            for u in before["units"]  # type: ignore[index]
        )
        record["rss_mib_after"] = round(rss_mib(router.pid), 1)
        record.update(asyncio.run(traffic_and_failover(args, port, control, registered, sd, router.pid)))
        record["rss_mib_end"] = round(rss_mib(router.pid), 1)
        metrics = scrape(metrics_port)
        record["router_retries"] = metric_sum(metrics, "flotilla_router_retries_total")
        record["router_shed"] = metric_sum(metrics, "flotilla_router_shed_total")
        return record
    finally:
        if router is not None:
            router.terminate()
            try:
                router.wait(30)
            except subprocess.TimeoutExpired:
                router.kill()
        fleet.terminate()
        fleet.wait(30)


async def traffic_and_failover(
    args: argparse.Namespace, port: int, control: int, registered: dict, sd, router_pid: int
) -> dict:
    load = Load(port, args.concurrency)
    load.start()
    await asyncio.sleep(args.warmup)
    load.reset()
    c0, w0 = cpu_seconds(router_pid), time.monotonic()
    await asyncio.sleep(args.seconds)
    elapsed = time.monotonic() - w0
    cpu = cpu_seconds(router_pid) - c0
    served = sum(load.statuses.values())
    out: dict = {
        "rps": round(served / elapsed, 1),
        "router_cpu_pct_traffic": round(100 * cpu / elapsed, 1),
        "router_cpu_us_per_request": round(1e6 * cpu / max(served, 1), 1),
        "p50_ms": round(1000 * pct(load.latencies, 50), 2),
        "p99_ms": round(1000 * pct(load.latencies, 99), 2),
        "statuses": {str(k): v for k, v in sorted(load.statuses.items())},
    }
    # Failover under the same traffic: one unit dies each way, one leaves the fleet alive.
    load.reset()
    rng = random.Random(7)
    victims = rng.sample(sorted(registered), 4)
    events = []
    loop = asyncio.get_running_loop()
    for unit, mode in zip(victims, ("exit", "hang", "unready", "leave")):
        await asyncio.sleep(args.event_gap)
        get_json(f"http://127.0.0.1:{control}/control/kill", {"unit": unit, "mode": mode})
        if mode == "leave":  # still alive and ready; ECS deregisters it (its task is being stopped)
            for service, instance in registered[unit]:
                await loop.run_in_executor(
                    None, functools.partial(sd.deregister_instance, ServiceId=service, InstanceId=instance)
                )
        events.append((unit, mode))
    await asyncio.sleep(args.event_gap + 2)
    await load.close()
    stats = get_json(f"http://127.0.0.1:{control}/control/stats")
    by_unit = {u["unit"]: u for u in stats["units"]}  # type: ignore[index]
    failover = []
    for unit, mode in events:
        u = by_unit[unit]
        if mode == "exit":  # connections its port reset after the death: each a routing attempt
            offsets = [t for t, kind in u["tombstone"] if kind == "api"]
        else:
            offsets = u["arrivals_after_event"]
        failover.append(
            {
                "unit": unit,
                "mode": mode,
                "requests_after": len(offsets),
                "last_request_after_s": round(max(offsets), 3) if offsets else 0.0,
            }
        )
    out["failover"] = failover
    if os.environ.get("FLEET_BENCH_DEBUG"):
        print(json.dumps([by_unit[u] for u, _ in events])[:3000], file=sys.stderr)
    out["failover_statuses"] = {str(k): v for k, v in sorted(load.statuses.items())}
    out["decoy_requests"] = sum(u["requests"] for u in stats["units"] if u["decoy"])  # type: ignore[index]
    out["follower_requests"] = sum(u["follower_api_requests"] for u in stats["units"])  # type: ignore[index]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="160,625", help="units per run; 8 members each by default")
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--decoys", type=int, default=2)
    ap.add_argument("--idle-seconds", type=float, default=20.0)
    ap.add_argument("--seconds", type=float, default=20.0, help="traffic window")
    ap.add_argument("--warmup", type=float, default=2.0, help="seconds of traffic before the window")
    ap.add_argument("--event-gap", type=float, default=3.0, help="seconds between failover events")
    ap.add_argument("--settle", type=float, default=5.0, help="seconds after every unit is routable")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--latency-ms", type=float, default=20.0, help="stand-in completion latency (median)")
    ap.add_argument(
        "--load-changes", type=float, default=6.4, help="background load changes per unit per second (busy fleet)"
    )
    ap.add_argument(
        "--prompt-share",
        type=float,
        default=1.0,
        help="share of the busy fleet's admitted requests that are completion prompts, each listed with its "
        "size and checkpoint hashes in the watch line (1: every one, the heaviest lines)",
    )
    ap.add_argument("--startup-timeout", type=float, default=180.0)
    ap.add_argument("--router-cpu", default="0")
    ap.add_argument("--load-cpu", default="1")
    ap.add_argument("--router-args", default="")
    ap.add_argument("--label", default="")
    ap.add_argument("--out", default=str(results_file("fleet.json", tiny=False)))
    tiny_mode(
        ap,
        argv,
        sizes="6",  # the failover events take four units
        nodes=2,
        decoys=1,
        idle_seconds=0.5,
        seconds=0.5,
        warmup=0.5,
        event_gap=0.5,
        settle=0.2,
        concurrency=4,
        out=str(results_file("fleet.json", tiny=True)),
    )
    args = ap.parse_args(argv)
    if not 0 <= args.prompt_share <= 1:
        ap.error(f"--prompt-share {args.prompt_share:g}: a share of the admitted requests, from 0 to 1")
    pin_self(args.load_cpu)
    load_before = os.getloadavg()
    from moto import mock_aws  # noqa: PLC0415 - the benchmark's own dependency, not the router's

    results = []
    members_total = max(int(s) for s in args.sizes.split(",")) * args.nodes
    with mock_aws(), documented_cloud_map(instances_per_namespace=members_total + 1000, seed=3):
        import boto3  # noqa: PLC0415

        server, args.cloudmap_port = serve_http()
        try:
            for size in (int(s) for s in args.sizes.split(",")):
                sd = boto3.client("servicediscovery", region_name="us-east-1")
                for ns in sd.list_namespaces()["Namespaces"]:  # a fresh Cloud Map per size
                    for svc in sd.list_services()["Services"]:
                        for inst in sd.list_instances(ServiceId=svc["Id"])["Instances"]:
                            sd.deregister_instance(ServiceId=svc["Id"], InstanceId=inst["Id"])
                        sd.delete_service(Id=svc["Id"])
                    sd.delete_namespace(Id=ns["Id"])
                record = run_size(args, size, sd)
                print(json.dumps(record), flush=True)
                results.append(record)
        finally:
            server.shutdown()
    entry = {
        "label": args.label,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "python": platform.python_version(),
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "args": {k: v for k, v in vars(args).items() if k not in ("out",)},
        "results": results,
    }
    append_run(args.out, entry)
    return 0


if __name__ == "__main__":
    sys.exit(main())
