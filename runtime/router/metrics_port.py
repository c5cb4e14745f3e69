"""The router's metrics port: Prometheus `/metrics` for whatever runs beside the router (a scraper in
its task, `make local`, the tests), on its own listener, loopback by default. The public port serves
only the API and the ALB's health check, so no listener rule or path trick reaches the metrics, which
name the units' private addresses, revisions, load and key ids."""

from __future__ import annotations

import socket

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

import contract


class MetricsServer:
    """GET /metrics on host:port (port 0: any free port, then `port` says which)."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int) -> None:
        self._registry, self.host, self.port = registry, host, port
        self._runner: web.AppRunner | None = None

    async def handle(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self._registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get(contract.METRICS_PATH, self.handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        sock.setblocking(False)
        self.port = sock.getsockname()[1]
        await web.SockSite(self._runner, sock).start()

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}{contract.METRICS_PATH}"

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
