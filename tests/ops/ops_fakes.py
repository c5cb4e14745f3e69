"""Stand-ins for unit members in the ops tests: an HTTP server on 127.0.0.1 (port chosen at run time)
that answers /health/ready with the JSON the node runtime serves (contract: ready, state, unit,
revision, rank, world_size, role, cell, load)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import contract
from ops.fleet import Unit


class HealthServer:
    """One node's HTTP server: /health/ready answers `body` with `status` (tests edit both)."""

    def __init__(self, body: dict, status: int = 200) -> None:
        self.body, self.status = body, status
        self.hits = 0  # /health/ready requests answered
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                if self.path != contract.NODE_READY_PATH:
                    self.send_response(404)
                    self.end_headers()
                    return
                server.hits += 1
                data = json.dumps(server.body).encode()
                self.send_response(server.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def set(self, **fields) -> None:
        self.body = {**self.body, **fields}

    def close(self) -> None:
        if self.thread.is_alive():
            self.httpd.shutdown()
            self.httpd.server_close()


def ready_body(
    *,
    unit: str,
    rank: int,
    world_size: int,
    revision: str = "1",
    ready: bool = True,
    state: str = "ready",
    queue_depth: int = 0,
    running: int = 1,
    max_running: int = 16,
    kv_cache_used: float = 0.25,
    cell: str = "cell0",
) -> dict:
    return {
        "ready": ready,
        "state": state,
        "unit": unit,
        "revision": revision,
        "rank": rank,
        "world_size": world_size,
        "role": "leader" if rank == 0 else "follower",
        "cell": cell,
        "load": {
            "queue_depth": queue_depth,
            "running": running,
            "max_running": max_running,
            "kv_cache_used": kv_cache_used,
        },
    }


def bare_unit(**fields) -> Unit:
    """An ops.fleet.Unit with no AWS behind it: cell0-unit0 of one node, with the fields a test names."""
    base = {
        "cell_id": "cell0",
        "unit_id": "cell0-unit0",
        "cluster_arn": "c",
        "service_name": "s",
        "service_arn": "a",
        "desired": 1,
        "task_definition_arn": "td:1",
        "revision": "1",
        "nodes_per_unit": 1,
    }
    return Unit(**{**base, **fields})
