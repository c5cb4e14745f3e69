"""`python -m runtime router`: build RouterSettings from flags and environment, serve, drain on SIGTERM.

Flags override environment variables (contract.ENV_*); the defaults suit a small fleet.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
import sys

import contract
from runtime.logs import setup_logging
from runtime.router.discovery import CloudMapDiscovery, StaticDiscovery
from runtime.router.proxy import Router
from runtime.router.settings import RouterSettings, SettingsError

log = logging.getLogger("flotilla.router")


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw in (None, ""):
        return default
    try:
        return float(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a number") from None


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("router", help="run the proxy layer in front of the units")
    env = os.environ
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=None,
                   help=f"listen port (default ${contract.ENV_PORT} or {contract.ROUTER_PORT}; 0 = any free port)")
    p.add_argument("--discovery", choices=("static", "cloudmap"),
                   default=env.get(contract.ENV_DISCOVERY) or "static")
    p.add_argument("--units", default=env.get(contract.ENV_UNITS, ""),
                   help=f"comma-separated leader base URLs (default ${contract.ENV_UNITS})")
    p.add_argument("--units-file", default=None,
                   help="file with one leader URL per line, re-read continuously (static discovery)")
    p.add_argument("--cloudmap-namespace", default=env.get(contract.ENV_CLOUDMAP_NAMESPACE))
    p.add_argument("--cloudmap-service", default=env.get(contract.ENV_CLOUDMAP_SERVICE))
    p.add_argument("--poll-interval", type=float, default=None,
                   help=f"seconds between health polls of a unit (default ${contract.ENV_POLL_INTERVAL} or 0.25)")
    p.add_argument("--poll-timeout", type=float, default=None,
                   help="seconds a health poll may take before the unit counts as unreachable "
                        "(default max(1, 2 x poll interval))")
    p.add_argument("--discovery-interval", type=float, default=2.0)
    p.add_argument("--max-outstanding-per-unit", type=int, default=64)
    p.add_argument("--max-queue-depth", type=int, default=32,
                   help="a unit reporting this queue depth is saturated")
    p.add_argument("--drain-grace", type=float, default=5.0,
                   help="seconds to keep serving after /health turns 503 on SIGTERM")
    p.add_argument("--drain-timeout", type=float, default=None,
                   help=f"seconds to wait for in-flight requests (default ${contract.ENV_DRAIN_TIMEOUT} or 120)")
    p.add_argument("--first-byte-timeout", type=float, default=60.0)
    p.add_argument("--idle-stream-timeout", type=float, default=30.0)
    p.add_argument("--event-loop", choices=("auto", "asyncio", "uvloop"), default="auto",
                   help="auto = uvloop when installed (measured faster, docs/benchmarks.md), else asyncio")
    p.add_argument("--access-log", choices=("json", "off"), default="json",
                   help="one JSON line per routed request on stderr (json) or none")
    p.add_argument("--ready-units-interval", type=float, default=60.0,
                   help="seconds between ReadyUnits metric lines (CloudWatch EMF) on stdout")
    p.add_argument("--log-level", default="INFO")
    p.set_defaults(func=run)
    return p


def settings_from_args(args: argparse.Namespace) -> RouterSettings:
    port = args.port
    if port is None:
        port = int(os.environ.get(contract.ENV_PORT) or contract.ROUTER_PORT)
    poll = args.poll_interval if args.poll_interval is not None else _env_float(contract.ENV_POLL_INTERVAL, 0.25)
    drain_timeout = (args.drain_timeout if args.drain_timeout is not None
                     else _env_float(contract.ENV_DRAIN_TIMEOUT, 120.0))
    return RouterSettings(
        host=args.host, port=port, discovery=args.discovery,
        units=tuple(u.strip() for u in args.units.split(",") if u.strip()),
        units_file=args.units_file,
        cloudmap_namespace=args.cloudmap_namespace, cloudmap_service=args.cloudmap_service,
        poll_interval_s=poll,
        poll_timeout_s=args.poll_timeout if args.poll_timeout is not None else max(1.0, 2 * poll),
        discovery_interval_s=args.discovery_interval,
        max_outstanding_per_unit=args.max_outstanding_per_unit, max_queue_depth=args.max_queue_depth,
        drain_grace_s=args.drain_grace, drain_timeout_s=drain_timeout,
        first_byte_timeout_s=args.first_byte_timeout, idle_stream_timeout_s=args.idle_stream_timeout,
        access_log=args.access_log == "json", ready_units_interval_s=args.ready_units_interval)


def make_discovery(settings: RouterSettings):
    if settings.discovery == "cloudmap":
        return CloudMapDiscovery(namespace=settings.cloudmap_namespace,
                                 service=settings.cloudmap_service, region=settings.cloudmap_region)
    return StaticDiscovery(units=settings.units, units_file=settings.units_file)


async def serve(settings: RouterSettings) -> int:
    router = Router(settings=settings, discovery=make_discovery(settings))
    await router.start()
    # Start-up objects (imports, boto3 models) never die: keep them out of every later full
    # collection, which would otherwise walk them all and show up as tail latency.
    gc.collect()
    gc.freeze()
    # The line tests and `make local` wait for; the port matters when it was 0.
    print(f"router listening on http://{settings.host}:{router.port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    drained = await router.drain()
    await router.close()
    return 0 if drained else 1


def run(args: argparse.Namespace) -> int:
    setup_logging(args.log_level)
    try:
        settings = settings_from_args(args)
    except SettingsError as exc:
        print(f"router: {exc}", file=sys.stderr)
        return 2
    loop_factory = None
    if args.event_loop in ("auto", "uvloop"):
        try:
            import uvloop
            loop_factory = uvloop.new_event_loop
        except ImportError:
            if args.event_loop == "uvloop":
                print("router: --event-loop uvloop needs the uvloop package (pip install uvloop)",
                      file=sys.stderr)
                return 2
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(serve(settings))
