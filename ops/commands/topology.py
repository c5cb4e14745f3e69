"""`flotilla topology`: where each unit's nodes sit in the AWS network (DescribeInstanceTopology)
and whether the unit's ranks follow that order.

Rendezvous orders ranks by network-node path (spine first), then instance id, so neighbouring
pipeline stages share switches. A unit whose reported ranks differ from that order, or whose nodes
sit under different spines, pays for it on every pipeline hop.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.console import Console
from rich.table import Table

from ops.aws import chunks, clients_for
from ops.commands import Subparsers
from ops.commands.common import add_json_option, cell_id, fleet_from_args, prose_console, select
from ops.fleet import Node, Unit


def add_parser(sub: Subparsers) -> list[argparse.ArgumentParser]:
    p = sub.add_parser(
        "topology",
        help="network placement of each unit's nodes and whether rank order matches",
        description="Show each unit's nodes with their DescribeInstanceTopology network nodes "
        "(spine first) and check that rank order follows them. Exit status 1 when "
        "a unit's ranks are out of topology order.",
    )
    p.add_argument("--unit", help="only this unit")
    p.add_argument("--cell", type=cell_id, metavar="CELL", help="only this cell (cell0 or 0)")
    add_json_option(p, "each unit's nodes, network nodes and problems")
    p.set_defaults(handler=run)
    return [p]


def network_nodes(topology_client: Any, instance_ids: list[str]) -> dict[str, tuple[str, ...]]:
    out: dict[str, tuple[str, ...]] = {}
    for batch in chunks(sorted(set(instance_ids)), 100):  # at most 100 ids per call
        kwargs: dict[str, Any] = {"InstanceIds": batch}
        while True:
            resp = topology_client.describe_instance_topology(**kwargs)
            for inst in resp.get("Instances", []):
                out[inst["InstanceId"]] = tuple(inst.get("NetworkNodes", ()))
            if not resp.get("NextToken"):
                break
            kwargs["NextToken"] = resp["NextToken"]
    return out


def expected_order(nodes: list[Node], paths: dict[str, tuple[str, ...]]) -> list[Node]:
    """The rank order rendezvous gives: network-node path (spine first), then instance id."""
    return sorted(nodes, key=lambda n: (paths.get(n.instance_id or "", ()), n.instance_id or ""))


def check_unit(u: Unit, paths: dict[str, tuple[str, ...]]) -> list[str]:
    located = [(n.instance_id, n) for n in u.nodes if n.instance_id]
    problems = []
    missing = [iid for iid, _ in located if not paths.get(iid)]
    if missing:
        problems.append(f"no topology for {', '.join(missing)} (instance type without topology data?)")
    spines = {paths[iid][0] for iid, _ in located if paths.get(iid)}
    if len(spines) > 1:
        problems.append(f"nodes sit under {len(spines)} different top-layer network nodes {sorted(spines)}")
    ranked = [(n.rank, iid) for iid, n in located if isinstance(n.rank, int)]
    if len(ranked) != len(located):
        problems.append("some nodes report no rank (not answering /health/ready)")
    else:
        want = [n.instance_id for n in expected_order([n for _, n in located], paths)]
        have = [iid for _, iid in sorted(ranked, key=lambda r: r[0])]
        if want != have:
            problems.append(f"rank order {have} does not follow topology order {want}")
    return problems


def as_json(units: list[Unit], paths: dict[str, tuple[str, ...]]) -> list[dict[str, Any]]:
    return [
        {
            "unit": u.unit_id,
            "cell": u.cell_id,
            "nodes": [
                {
                    "rank": n.rank,
                    "role": n.role,
                    "instance_id": n.instance_id,
                    "availability_zone": n.availability_zone,
                    "network_nodes": list(paths.get(n.instance_id or "", ())),
                }
                for n in u.nodes
            ],
            "problems": check_unit(u, paths),
        }
        for u in units
    ]


def run(args: argparse.Namespace, console: Console) -> int:
    aws = clients_for(args)
    fleet = fleet_from_args(args, aws)
    units = select(fleet, cell=args.cell, unit=args.unit)
    if not units:
        prose_console(args, console).print(f"[red]no units found for deployment {args.deployment!r}[/]")
        return 1
    paths = network_nodes(aws.topology, [n.instance_id for u in units for n in u.nodes if n.instance_id])
    if args.json:
        doc = as_json(units, paths)
        console.print_json(json.dumps(doc))
        return 1 if any(u["problems"] for u in doc) else 0
    bad = 0
    for u in units:
        t = Table(title=f"{u.unit_id} ({u.cell_id})", title_justify="left")
        for col in ("rank", "role", "instance", "AZ", "network nodes (top -> bottom)", "topology rank"):
            t.add_column(col)
        order = {n.instance_id: i for i, n in enumerate(expected_order([n for n in u.nodes if n.instance_id], paths))}
        for n in u.nodes:
            t.add_row(
                str(n.rank) if n.rank is not None else "?",
                n.role,
                n.instance_id or "-",
                n.availability_zone or "-",
                " > ".join(paths.get(n.instance_id or "", ())) or "-",
                str(order.get(n.instance_id, "-")),
            )
        console.print(t)
        problems = check_unit(u, paths)
        for p in problems:
            console.print(f"[red]{u.unit_id}[/]: {p}", highlight=False)
        if problems:
            bad += 1
        else:
            console.print(f"{u.unit_id}: rank order follows topology", style="green")
    return 1 if bad else 0
