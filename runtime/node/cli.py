"""`python -m runtime node` / `flotilla-node`: run one member of a unit until drained.

Exit codes (contract/node_exit.py): 0 drained cleanly, 1 the unit's restart budget ran out, 2 bad
settings, 3-5 the engine can never serve this model here (layout refused, model not published as its
manifest says, model unreadable).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from typing import Callable, Sequence

from aiohttp import web

from contract import node_exit
from contract.bad_input import BadInput
from runtime.logs import jlog, setup_logging
from runtime.node.metrics import NodeMetrics
from runtime.node.settings import NodeSettings, SettingsError, build_parser, load_settings, settings_from_args
from runtime.node.speculation import speculation_from_env
from runtime.node.supervisor import UnitSupervisor
from runtime.rendezvous import Rendezvous, RendezvousError


def make_rendezvous(s: NodeSettings) -> Rendezvous:
    if s.rendezvous == "static":
        from runtime.rendezvous.static import StaticRendezvous  # noqa: PLC0415 - imported where used, so other subcommands and roles load less

        assert s.rank is not None
        return StaticRendezvous(
            unit_id=s.unit_id,
            revision=s.revision,
            rank=s.rank,
            dist_port=s.dist_port,
            peers=[(p.host, p.port) for p in s.peers],
        )
    import boto3  # noqa: PLC0415 - only the ecs backend needs AWS clients

    from runtime.rendezvous.ecs import EcsRendezvous, read_task_metadata  # noqa: PLC0415 - imported where used, so other subcommands and roles load less

    md = read_task_metadata()
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or md["AvailabilityZone"][:-1]
    return EcsRendezvous(
        unit_id=s.unit_id,
        revision=s.revision,
        world_size=s.world_size,
        api_port=s.api_port,
        dist_port=s.dist_port,
        ecs_client=boto3.client("ecs", region_name=region),
        ec2_client=boto3.client("ec2", region_name=region),
        metadata=lambda: md,
        timeout_s=s.rendezvous_timeout_s,
    )


async def serve(s: NodeSettings) -> int:
    metrics = NodeMetrics()
    try:
        rendezvous = make_rendezvous(s)
    except (RendezvousError, OSError) as e:
        print(f"flotilla-node: error: {s.rendezvous} rendezvous cannot start: {e}", file=sys.stderr)
        return node_exit.BAD_SETTINGS
    sup = UnitSupervisor(settings=s, rendezvous=rendezvous, metrics=metrics)
    from runtime.node.server import build_app  # noqa: PLC0415

    # auto_decompress=False: the API decodes a compressed body itself, within its size bound, and
    # answers a coding it does not support in OpenAI's error shape (runtime/node/protocol.py).
    runner = web.AppRunner(
        build_app(sup=sup, metrics=metrics), handler_cancellation=True, access_log=None, auto_decompress=False
    )
    await runner.setup()
    site = web.TCPSite(runner, host=s.bind_host, port=s.api_port, reuse_address=True)
    await site.start()
    jlog(
        "node_listening",
        unit=s.unit_id,
        revision=s.revision,
        rank=s.rank,
        host=s.bind_host,
        port=s.api_port,
        rendezvous=s.rendezvous,
        engine=s.engine,
        model=s.neuron.model_uri if s.neuron else s.model,
        pid=os.getpid(),
    )
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, sup.begin_drain)
    try:
        rc = await sup.run()
    finally:
        await runner.cleanup()
    jlog("node_exit", unit=s.unit_id, rank=sup.rank, code=rc)
    return rc


def _run(load: Callable[[], NodeSettings]) -> int:
    setup_logging()
    try:
        s = load()
        speculation_from_env(os.environ, s)  # refused now, not at every formation
    except (SettingsError, BadInput) as e:
        print(f"flotilla-node: error: {e}", file=sys.stderr)
        return node_exit.BAD_SETTINGS
    return asyncio.run(serve(s))


def main(argv: Sequence[str] | None = None) -> int:
    """The `flotilla-node` console script."""
    return _run(lambda: load_settings(argv))


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `node` on `python -m runtime`."""
    p = sub.add_parser(
        "node",
        help="run one member (leader or follower) of a unit",
        description="Run one member of a flotilla unit. Every flag can also be given as "
        "the environment variable named in its help.",
    )
    build_parser(p)
    p.set_defaults(func=lambda args: _run(lambda: settings_from_args(args)))


if __name__ == "__main__":
    sys.exit(main())
