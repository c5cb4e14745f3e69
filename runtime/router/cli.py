"""`python -m runtime router`: build RouterSettings from flags and environment, serve, drain on SIGTERM.

Every flag, its environment variable and its default are declared in runtime/router/settings.py.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
import sys
from typing import Callable

from runtime.logs import setup_logging
from runtime.router.access import make_access
from runtime.router.admission import AdmissionControl, ParameterSource
from runtime.router.discovery import CloudMapDiscovery, StaticDiscovery
from runtime.router.proxy import Router
from runtime.router.settings import RouterSettings, SettingsError

log = logging.getLogger("flotilla.router")


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("router", help="run the proxy layer in front of the units")
    RouterSettings.add_arguments(p)
    p.set_defaults(func=run)
    return p


def make_discovery(settings: RouterSettings):
    if settings.discovery == "cloudmap":
        assert settings.cloudmap_namespace, "RouterSettings requires a namespace with cloudmap discovery"
        return CloudMapDiscovery(
            namespace=settings.cloudmap_namespace, services=settings.cloudmap_services, region=settings.cloudmap_region
        )
    return StaticDiscovery(units=settings.units, units_file=settings.units_file)


def make_admission(settings: RouterSettings) -> AdmissionControl | None:
    if not settings.admission_parameter:
        return None
    source = ParameterSource(settings.admission_parameter, region=settings.cloudmap_region)
    return AdmissionControl(source.read, interval_s=settings.admission_interval_s, name=source.name)


async def serve(settings: RouterSettings) -> int:
    router = Router(
        settings=settings,
        discovery=make_discovery(settings),
        admission=make_admission(settings),
        access=make_access(settings),
    )
    await router.start()
    # Start-up objects (imports, boto3 models) never die: keep them out of every later full
    # collection, which would otherwise walk them all and show up as tail latency.
    gc.collect()
    gc.freeze()
    # The line tests and `make local` wait for; the port matters when it was 0.
    print(f"router listening on http://{settings.host}:{router.port}", flush=True)
    print(f"router metrics on {router.metrics_server.url}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    drained = await router.drain()
    await router.close()
    return 0 if drained else 1


def event_loop_factory(choice: str) -> tuple[Callable[[], asyncio.AbstractEventLoop] | None, str]:
    """The loop the router runs on and how to say so at start: uvloop when `choice` allows it and it
    imports, else asyncio's own loop (factory None). Raises ImportError when `choice` is "uvloop" and
    uvloop is not installed.

    uvloop's README (MagicStack/uvloop, "Using uvloop") gives this form for Python 3.11:
    `asyncio.Runner(loop_factory=uvloop.new_event_loop)`; it measured about a fifth cheaper per
    watch line than asyncio's loop at 625 units (docs/benchmarks.md, Fleet)."""
    if choice == "asyncio":
        return None, "asyncio (--event-loop asyncio)"
    try:
        import uvloop  # noqa: PLC0415 - optional; the asyncio loop is the fallback
    except ImportError:
        if choice == "uvloop":
            raise
        return None, "asyncio (uvloop is not installed)"
    return uvloop.new_event_loop, f"uvloop {uvloop.__version__}"


def run(args: argparse.Namespace) -> int:
    try:
        settings = RouterSettings.from_args(args, os.environ)
    except SettingsError as exc:
        print(f"router: {exc}", file=sys.stderr)
        return 2
    setup_logging(settings.log_level)
    try:
        loop_factory, loop_name = event_loop_factory(settings.event_loop)
    except ImportError:
        print("router: --event-loop uvloop needs the uvloop package (pip install uvloop)", file=sys.stderr)
        return 2
    # Said at start, as a warning when the image lacks uvloop: the router then costs more per report.
    log.log(
        logging.WARNING if loop_factory is None and settings.event_loop == "auto" else logging.INFO,
        "router event loop: %s",
        loop_name,
    )
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(serve(settings))
