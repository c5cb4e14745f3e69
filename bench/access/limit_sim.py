"""A SimPy model of one API key's requests through the ALB to N routers, each enforcing 1/n of the key's
requests/s with the router's own buckets (runtime/router/access.py KeyLimits, on the simulated clock):
how far the fleet-wide admitted rate strays from the key's limit.

Run: `python -m bench.access.limit_sim`; the table goes to docs/benchmarks.md (Per-key limits).
tests/router/test_router_limit_sim.py runs it small in `make test`.

The model (each choice a stated assumption): the key's requests arrive as a Poisson stream at
`offered` x its limit; the ALB hands each to a router by round robin (the ALB's default routing
algorithm, ELB user guide "Routing algorithms") or uniformly at random (weighted_random with equal
weights); `running` routers serve while each divides the limit by `n` (the Router stack sets n to the
router tier's desired count, so running > n after a scale-out). Refusals are not retried.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import simpy

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from contract.apikeys import KeyEntry  # noqa: E402
from runtime.router.access import KeyLimits  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1] / "results" / "limit_sim.json"


@dataclass(frozen=True)
class Case:
    routing: str  # round_robin | random
    n: int  # routers the limit is divided by
    running: int  # routers the ALB sends to
    offered: float  # offered rate / limit


@dataclass(frozen=True)
class Outcome:
    case: Case
    limit: float
    seconds: float
    admitted_per_limit: float  # admitted rate over the run / limit
    worst_minute_per_limit: float  # the busiest 60 s window's admitted rate / limit
    refused_share: float  # refused / offered


def simulate(case: Case, *, limit: float = 40.0, seconds: float = 600.0, seed: int = 1) -> Outcome:
    env = simpy.Environment()
    rng = random.Random(seed)
    entry = KeyEntry(name="sim", sha256="0" * 64, requests_per_s=limit)
    routers = [KeyLimits(routers=case.n, clock=lambda: env.now) for _ in range(case.running)]
    admitted_at: list[float] = []
    offered = refused = 0

    def arrivals():
        nonlocal offered, refused
        turn = 0
        while True:
            yield env.timeout(rng.expovariate(case.offered * limit))
            if case.routing == "round_robin":
                router, turn = routers[turn % case.running], turn + 1
            else:
                router = rng.choice(routers)
            offered += 1
            if router.take("k", entry, 0) is None:
                admitted_at.append(env.now)
            else:
                refused += 1

    env.process(arrivals())
    env.run(until=seconds)
    worst, lo = 0, 0
    for hi, t in enumerate(admitted_at):
        while admitted_at[lo] <= t - 60.0:
            lo += 1
        worst = max(worst, hi - lo + 1)
    return Outcome(
        case=case,
        limit=limit,
        seconds=seconds,
        admitted_per_limit=len(admitted_at) / seconds / limit,
        worst_minute_per_limit=worst / 60.0 / limit,
        refused_share=refused / offered if offered else 0.0,
    )


CASES = [
    Case(routing, n, running, offered)
    for routing in ("round_robin", "random")
    for n, running in ((4, 4), (4, 8), (2, 10))
    for offered in (0.9, 2.0)
]


def table(outcomes: list[Outcome]) -> str:
    lines = [
        "| ALB routing | limit divided by | routers running | offered / limit | admitted / limit | "
        "busiest minute / limit | refused |",
        "|---|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        c = o.case
        lines.append(
            f"| {c.routing} | {c.n} | {c.running} | {c.offered:g} | {o.admitted_per_limit:.3f} | "
            f"{o.worst_minute_per_limit:.3f} | {100 * o.refused_share:.1f} % |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=600.0, help="simulated seconds per case")
    p.add_argument("--limit", type=float, default=40.0, help="the key's requests/s limit")
    a = p.parse_args(argv)
    outcomes = [simulate(c, limit=a.limit, seconds=a.seconds) for c in CASES]
    RESULTS.write_text(json.dumps([asdict(o) for o in outcomes], indent=1) + "\n")
    print(table(outcomes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
