"""A SimPy model of routers in front of hundreds of units with prefix caches, driven by a production
request trace: which routing policy gives the lowest time to first token without hot units.

Run: `python -m bench.fleet.trace_sim` (a step of `make bench-fleet`; --tiny: 300 requests on 8 units;
beside policy_sim.py, whose step-function history it reuses); the table goes to docs/benchmarks.md
(Routing by cache).
tests/router/test_router_cache_routing.py runs it small in `make test`.

The model (each choice a stated assumption, not a measurement of Trainium):
- The trace is Mooncake's (`traces/`, FAST '25): arrival, input and output tokens and the
  hashes of 512-token prefix blocks of each request. To load hundreds of units it is replayed as
  `copies` copies with disjoint block hashes, copy k shifted by k/copies of the trace's span (wrapped
  round), and time compressed by a factor chosen so the offered prefill work, with no cache at all,
  is `load` of the fleet's prefill capacity. Both factors are printed beside every figure.
- A unit has `slots` batch slots and one prefill line. A request takes a slot (waits FIFO for one),
  then prefills FIFO at `prefill_tps` tokens/s the tokens its unit's cache lacks, then decodes its
  output at `tpot_s` a token holding the slot. TTFT = arrival to the end of its prefill.
- A unit's prefix cache holds `cache_blocks` blocks, least recently used evicted; a request reuses its
  longest run of leading blocks present when its prefill starts, and leaves all its blocks cached.
- Each router knows each unit's report as of its last watch tick (every `report_s`, its own phase per
  router and unit): requests held, sequences running, prompt tokens waiting for their first token
  (less what the unit's cache held of each when it arrived, as a leader reports them; `--report-whole`:
  whole prompts), plus its own sends since, whole. Requests reach one of `routers` routers at random.
- The router's key of a request is its first `key_blocks` block hashes: what hashing a chat's leading
  messages (system prompt and first user turn) gives when they end within that many blocks. Its
  expected cached tokens are the blocks it shares with the key's previous request (a chat's earlier
  turns), and the key's own blocks on the unit that took the key's last request (a prefix key's lead
  tokens).
- A later turn keeps the trace's block hashes. The trace hashes whole 512-token blocks, so the previous
  turn's partial last block (k tokens) has another hash once this turn fills it: the model counts the
  k tokens as not cached, for every policy and the oracle alike. Taking that hash back, as the replay
  does to resend prompts token for token (bench/trace/replay.py `resent`), would count all 512 tokens
  of the filled block as cached where the unit holds k of them; of the two errors the model keeps the
  smaller reuse. Routers credit the blocks shared with the previous turn either way.
Policies, all but the oracle runtime/router/balance.py's code: `p4c` (the least requests held of four
sampled units), `least_work` (the lowest estimated TTFT of four sampled units, no cache knowledge),
`affinity` (the key's unit on the ring under the load bound, else least_work), `cache_aware` (the unit
that took the key's last request, else the key's unit on the ring, against least_work of
CACHE_CHOICES sampled units by estimated TTFT: `balance.by_cache_and_work`), `oracle` (exact cache
contents and exact queues of every unit: the lowest true TTFT estimate).
- Routers learn which unit took a key's request at once for their own sends and one report interval
  later for other routers' (the unit lists the keys it admitted in its next watch line).
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from collections import OrderedDict, deque
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import simpy

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
from bench.fleet.policy_sim import _History  # noqa: E402 - after the path to this checkout is known
from bench.measure import append_run, results_file, tiny_mode  # noqa: E402
from runtime.router import balance  # noqa: E402
from traces import mooncake_rows, unreadable  # noqa: E402

BLOCK_TOKENS = 512  # the trace's block size (its README)
POLICIES = ("p4c", "least_work", "affinity", "cache_aware", "oracle")


@dataclass(frozen=True)
class Params:
    trace: str = "conversation"  # conversation | synthetic, or a path to a Mooncake-format JSONL file
    units: int = 128
    routers: int = 10
    copies: int = 4
    load: float = 0.8  # offered prefill work without any cache, as a fraction of the fleet's capacity
    prefill_tps: float = 8000.0
    tpot_s: float = 0.03
    slots: int = 16
    cache_blocks: int = 4000  # 2M tokens of KV cache per unit
    report_s: float = 0.05
    key_blocks: int = 2
    eps: float = balance.BOUND_EPS
    walk: int = balance.WALK
    slack: float = balance.AFFINITY_SLACK
    choices: int = balance.CACHE_CHOICES
    # Which unit took each key's last request, as routers learn it (balance.KeyHolders): "reported" (its
    # own sends, and units' watch lines report every router's), "own" (its own sends only), "none".
    holders: str = "reported"
    # Units report prefill tokens net of what their cache holds at arrival, as runtime/node does (else
    # whole prompts, as it did before); routers count their own sends whole, as runtime/router does.
    report_uncached: bool = True
    limit: int = 0  # replay only the first `limit` requests of each copy (0: all); for quick runs
    seed: int = 1


@dataclass(frozen=True)
class Request:
    at: float
    tokens: int
    output: int
    blocks: tuple[int, ...]
    router: int


def shared_blocks(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """How many leading blocks two prompts share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def load_trace(p: Params) -> tuple[list[Request], dict[str, float]]:
    """The replayed requests, in arrival order, and the scaling applied to the trace."""
    try:
        rows = mooncake_rows(p.trace, p.limit)
    except OSError as exc:
        raise SystemExit(unreadable("--traces", p.trace, exc)) from None
    span = max(r["timestamp"] for r in rows) / 1000.0 + 1.0
    offered = sum(r["input_length"] for r in rows) * p.copies / span  # prefill tokens/s, uncompressed
    compress = p.load * p.units * p.prefill_tps / offered
    stride = max((max(r["hash_ids"], default=0) for r in rows), default=0) + 1
    rng = random.Random(p.seed)
    out = []
    for k in range(p.copies):
        shift = span * k / p.copies
        for r in rows:
            t = (r["timestamp"] / 1000.0 + shift) % span
            out.append(
                Request(
                    at=t / compress,
                    tokens=max(1, int(r["input_length"])),
                    output=max(1, int(r["output_length"])),
                    blocks=tuple(h + k * stride for h in r["hash_ids"]),
                    router=rng.randrange(p.routers),
                )
            )
    out.sort(key=lambda q: q.at)
    scaling = {"copies": p.copies, "time_compression": compress, "requests": len(out), "span_s": span / compress}
    return out, scaling


class _Unit:
    __slots__ = ("cache", "held", "prefill", "prefill_queue", "prefill_work", "running", "slots", "busy", "history")

    def __init__(self, env: simpy.Environment, slots: int) -> None:
        self.slots = simpy.Resource(env, capacity=slots)
        self.prefill = simpy.Resource(env, capacity=1)
        self.cache: OrderedDict[int, None] = OrderedDict()
        self.held = 0  # requests on the unit (waiting, prefilling, decoding)
        self.running = 0  # sequences holding a slot
        self.prefill_queue = 0  # prompt tokens of requests not yet at their first token (what it reports)
        self.prefill_work = 0.0  # exact seconds of prefill ahead (the oracle's knowledge)
        self.busy = 0.0  # seconds its prefill line was busy
        self.history = _History((0, 0, 0))  # (held, running, prefill_queue) over time

    def hit_blocks(self, blocks: tuple[int, ...]) -> int:
        n = 0
        for b in blocks:
            if b not in self.cache:
                break
            n += 1
        return n


class _View:
    """One router's knowledge of one unit, in the shape runtime/router/balance.py reads."""

    __slots__ = (
        "index",
        "name",
        "in_flight",
        "queue_depth",
        "running",
        "max_running",
        "kv_cache_used",
        "prefill_tokens",
        "outstanding",
        "outstanding_at_report",
        "sent_tokens",
        "sent_tokens_at_report",
        "tokens_per_step",
    )

    def __init__(self, index: int, slots: int) -> None:
        self.index = index
        self.name = f"unit-{index}"
        self.in_flight = self.queue_depth = self.running = self.prefill_tokens = 0
        self.max_running = slots
        self.kv_cache_used = 0.0
        self.outstanding = self.outstanding_at_report = 0
        self.sent_tokens = self.sent_tokens_at_report = 0
        self.tokens_per_step = 0.0  # the simulated units decode one token per step


def _percentiles(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    n = len(xs)

    def q(x: float) -> float:
        return xs[min(n - 1, int(n * x))]

    return {"mean_s": sum(xs) / n, "p50_s": q(0.5), "p90_s": q(0.9), "p99_s": q(0.99)}


def simulate(p: Params, policy: str, requests: list[Request]) -> dict[str, float]:
    if policy not in POLICIES:
        raise ValueError(f"policy {policy!r}: one of {', '.join(POLICIES)}")
    env = simpy.Environment()
    rng = random.Random(p.seed + 7)
    units = [_Unit(env, p.slots) for _ in range(p.units)]
    views = [[_View(u, p.slots) for u in range(p.units)] for _ in range(p.routers)]
    sent = [[_History((0, 0)) for _ in range(p.units)] for _ in range(p.routers)]  # own (outstanding, tokens)
    phase = [[rng.random() * p.report_s for _ in range(p.units)] for _ in range(p.routers)]
    points = [balance.ring_points(f"unit-{u}") for u in range(p.units)]
    rings = [balance.Ring(views[r], lambda v: points[v.index]) for r in range(p.routers)]
    # A sequence waiting for a slot waits about a slot's share of one request's decode.
    slot_wait_s = sum(q.output for q in requests) / max(1, len(requests)) * p.tpot_s / p.slots
    ttfts: list[float] = []
    reused = [0, 0]  # prompt tokens taken from the cache, prompt tokens in all
    total_held = [0]
    previous: dict[tuple[int, ...], tuple[int, ...]] = {}  # a conversation's last request's blocks
    # Each router's KeyHolders; a unit's report of a key it admitted reaches the other routers one
    # report interval later (the longest a watch line waits).
    holders: list[balance.KeyHolders[int]] = [balance.KeyHolders() for _ in range(p.routers)]
    reported: deque[tuple[float, int, int, int]] = deque()

    def refresh(r: int, v: _View) -> None:
        u = v.index
        ph = phase[r][u]
        if env.now < ph:
            v.in_flight = v.running = v.prefill_tokens = v.outstanding_at_report = v.sent_tokens_at_report = 0
            return
        last = env.now - ((env.now - ph) % p.report_s)
        v.in_flight, v.running, v.prefill_tokens = units[u].history.at(last)  # type: ignore[misc]
        v.outstanding_at_report, v.sent_tokens_at_report = sent[r][u].at(last)  # type: ignore[misc]

    def usable_for(r: int):
        def usable(v: _View) -> bool:
            refresh(r, v)
            return True

        return usable

    def note(u: _Unit) -> None:
        u.history.set(env.now, (u.held, u.running, u.prefill_queue))

    def pick(q: Request) -> int:
        r = q.router
        vs = views[r]
        if policy == "p4c":
            chosen = balance.sample_choices(vs, usable_for(r), rng)
        elif policy == "least_work":
            chosen = balance.least_work(vs, usable_for(r), rng, q.tokens)
        elif policy == "affinity":
            key = balance.key_hash(repr(q.blocks[: p.key_blocks]).encode())
            mean = total_held[0] / p.units
            chosen = balance.by_key(rings[r], key, usable_for(r), mean, eps=p.eps, walk=p.walk)
            if chosen is None:
                chosen = balance.least_work(vs, usable_for(r), rng, q.tokens)
        elif policy == "cache_aware":
            lead = q.blocks[: p.key_blocks]
            key = balance.key_hash(repr(lead).encode())
            # What the request resends of its conversation's previous turn: the router reads it from
            # the messages before the last user message; here, the blocks it shares with that turn.
            shared = shared_blocks(previous.get(lead, ()), q.blocks)
            previous[lead] = q.blocks
            while reported and reported[0][0] <= env.now:  # units' reports of the keys they admitted
                _, k, name, by = reported.popleft()
                for j in range(p.routers):
                    if j != by:
                        holders[j].note(k, name)
            held_by = holders[r].get(key)
            chosen = balance.by_cache_and_work(
                rings[r],
                vs,
                usable_for(r),
                rng,
                key=key,
                tokens=q.tokens,
                cached=min(q.tokens, shared * BLOCK_TOKENS),
                mean_load=total_held[0] / p.units,
                holder=None if held_by is None else vs[held_by],
                lead=min(q.tokens, len(lead) * BLOCK_TOKENS),  # the key's blocks, which its holder holds
                eps=p.eps,
                walk=p.walk,
                slack=p.slack,
                choices=p.choices,
            )
            if chosen is not None:
                if p.holders != "none":
                    holders[r].note(key, chosen.index)  # its own send, known at once
                if p.holders == "reported":
                    reported.append((env.now + p.report_s, key, chosen.index, r))
        else:  # oracle: exact caches, exact queues
            best, best_key = 0, (math.inf, 0.0)
            for i, u in enumerate(units):
                uncached = max(1, q.tokens - u.hit_blocks(q.blocks) * BLOCK_TOKENS)
                wait_slot = max(0, u.held - p.slots + 1)
                score = (u.prefill_work + uncached / p.prefill_tps + wait_slot * slot_wait_s, rng.random())
                if score < best_key:
                    best, best_key = i, score
            return best
        assert chosen is not None
        return chosen.index

    def serve(q: Request, r: int, ui: int):
        u = units[ui]
        v = views[r][ui]
        u.held += 1
        total_held[0] += 1
        uncached_now = max(1, q.tokens - u.hit_blocks(q.blocks) * BLOCK_TOKENS)
        reported = uncached_now if p.report_uncached else q.tokens
        u.prefill_queue += reported
        guess = uncached_now / p.prefill_tps
        u.prefill_work += guess
        note(u)
        with u.slots.request() as slot:
            yield slot
            u.running += 1
            note(u)
            with u.prefill.request() as line:
                yield line
                hit = min(q.tokens, u.hit_blocks(q.blocks) * BLOCK_TOKENS)
                uncached = max(1, q.tokens - hit)
                reused[0] += hit
                reused[1] += q.tokens
                seconds = uncached / p.prefill_tps
                yield env.timeout(seconds)
                u.busy += seconds
                for b in q.blocks:
                    u.cache[b] = None
                    u.cache.move_to_end(b)
                while len(u.cache) > p.cache_blocks:
                    u.cache.popitem(last=False)
            ttfts.append(env.now - q.at)
            u.prefill_queue -= reported
            u.prefill_work = max(0.0, u.prefill_work - guess)
            note(u)
            yield env.timeout(q.output * p.tpot_s)
            u.running -= 1
        u.held -= 1
        total_held[0] -= 1
        note(u)
        v.outstanding -= 1
        sent[r][ui].set(env.now, (v.outstanding, v.sent_tokens))

    def source():
        for q in requests:
            yield env.timeout(q.at - env.now)
            ui = pick(q)
            v = views[q.router][ui]
            v.outstanding += 1
            v.sent_tokens += q.tokens
            sent[q.router][ui].set(env.now, (v.outstanding, v.sent_tokens))
            env.process(serve(q, q.router, ui))

    env.process(source())
    env.run()
    busy = [u.busy for u in units]
    mean_busy = sum(busy) / len(busy)
    span = requests[-1].at if requests else 1.0
    out = _percentiles(ttfts)
    out.update(
        hit_rate=reused[0] / reused[1] if reused[1] else 0.0,
        utilization_mean=mean_busy / span,
        utilization_max=max(busy) / span,
        busiest_over_mean=max(busy) / mean_busy if mean_busy > 0 else 1.0,
    )
    return out


def compare(p: Params, policies: tuple[str, ...] = POLICIES) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    requests, scaling = load_trace(p)
    return {policy: simulate(p, policy, requests) for policy in policies}, scaling


def main(argv: list[str] | None = None) -> int:
    d = Params()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", default="conversation,synthetic", help="conversation, synthetic or JSONL paths")
    ap.add_argument("--units", type=int, default=d.units)
    ap.add_argument("--routers", type=int, default=d.routers)
    ap.add_argument("--copies", type=int, default=d.copies)
    ap.add_argument("--loads", default="0.8")
    ap.add_argument("--prefill-tps", type=float, default=d.prefill_tps)
    ap.add_argument("--tpot", type=float, default=d.tpot_s)
    ap.add_argument("--slots", type=int, default=d.slots)
    ap.add_argument("--cache-blocks", type=int, default=d.cache_blocks)
    ap.add_argument("--eps", type=float, default=d.eps)
    ap.add_argument("--walk", type=int, default=d.walk)
    ap.add_argument("--slack", type=float, default=d.slack)
    ap.add_argument("--choices", type=int, default=d.choices, help="units sampled per cache_aware pick")
    ap.add_argument(
        "--holders",
        choices=("reported", "own", "none"),
        default=d.holders,
        help="how routers learn which unit took each key's last request",
    )
    ap.add_argument(
        "--report-whole",
        action="store_true",
        help="units report whole prompts rather than net of their cache (the former code)",
    )
    ap.add_argument("--limit", type=int, default=0, help="first N requests of each copy only (quick runs)")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--label", default="")
    ap.add_argument("--out", default=str(results_file("trace_sim.json", tiny=False)))
    tiny_mode(
        ap,
        argv,
        traces="conversation",
        units=8,
        copies=1,
        limit=300,
        out=str(results_file("trace_sim.json", tiny=True)),
    )
    args = ap.parse_args(argv)
    policies = tuple(args.policies.split(","))
    bad = [x for x in policies if x not in POLICIES]
    if bad:
        ap.error(f"--policies {bad[0]}: one of {', '.join(POLICIES)}")
    runs = []
    for trace in args.traces.split(","):
        for load in (float(x) for x in args.loads.split(",")):
            p = replace(
                d,
                trace=trace,
                units=args.units,
                routers=args.routers,
                copies=args.copies,
                load=load,
                prefill_tps=args.prefill_tps,
                tpot_s=args.tpot,
                slots=args.slots,
                cache_blocks=args.cache_blocks,
                eps=args.eps,
                walk=args.walk,
                slack=args.slack,
                choices=args.choices,
                holders=args.holders,
                limit=args.limit,
                report_uncached=not args.report_whole,
                seed=args.seed,
            )
            started = time.monotonic()
            results, scaling = compare(p, policies)
            print(
                f"trace {trace} x{scaling['copies']} copies, time compressed {scaling['time_compression']:.2f}x, "
                f"{scaling['requests']} requests over {scaling['span_s']:.0f} s; {p.units} units, load {load:.2f}",
                flush=True,
            )
            base = results.get("p4c", {}).get("mean_s")
            oracle = results.get("oracle", {}).get("mean_s")
            for name, r in results.items():
                vs = f"  /p4c {r['mean_s'] / base:5.2f}" if base else ""
                vs += f"  /oracle {r['mean_s'] / oracle:5.2f}" if oracle else ""
                print(
                    f"  {name:12s} TTFT mean {r['mean_s']:7.3f} s p50 {r['p50_s']:7.3f} p90 {r['p90_s']:7.3f} "
                    f"p99 {r['p99_s']:7.3f}  hit {100 * r['hit_rate']:5.1f} %  util mean "
                    f"{100 * r['utilization_mean']:5.1f} % busiest/mean {r['busiest_over_mean']:5.2f}{vs}",
                    flush=True,
                )
            runs.append(
                {"params": asdict(p), "scaling": scaling, "results": results, "seconds": time.monotonic() - started}
            )
    append_run(
        args.out, {"label": args.label, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "runs": runs}
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
