"""Trace replay against `make local`: the Mooncake conversation trace, scaled to SmolLM2, through the
router under each routing policy in turn; TTFT p50/p90/p99, TPOT, prefix-cache hit rate and goodput.

Run: `make bench-trace` (`python -m bench.trace.replay`; BENCH_ARGS passes flags; `--requests 12 --rates 1,2`
is a short run; --tiny: 4 requests on one unit of the tiny model under one policy). For each
rate and policy it starts `python -m runtime.local --balance POLICY` (fresh units: no run inherits
another's warm cache), replays the same requests open-loop at their scaled arrival times, and stops it.
The defaults (100 requests of whole conversations at 0.5 and 1 req/s, three policies) are one quiet run
of about 20 minutes: the plan is printed first. Results are appended to bench/results/trace_replay.json with the scaling
beside every figure, and the table for docs/benchmarks.md is printed at the end.

Sampling (printed with the figures): by default whole conversations drawn at random from the whole hour
until `--requests` (`--sample conversations`): three units of a fleet that keeps conversations together
see every turn of theirs, where the hour's first N requests are mostly first turns whose follow-ups
come after them (the first 100 requests reuse 5 % of their prompt tokens at best, the whole hour 39 %);
`--sample first` replays the first N.

Scaling (printed with the figures): each 512-token block hash of the trace becomes a fixed run of
`--block-tokens` token ids (the same run wherever the hash appears, so requests that share a prefix in
the trace share it token for token); a request's prompt is its blocks' runs, at most
`--max-input-tokens`; its output is the trace's divided by 512 / block tokens, at least 1 and at most
`--max-output-tokens`; arrivals are compressed to each of `--rates` requests/s on average. A later
turn resends its previous turn's prompt whole, as a client that renders its conversation does
(`resent`: the trace's hash of a partial last block changes once the next turn fills it, so as the
trace has them most later turns share all but their previous prompt's last block; `--no-resend` replays
them so). Each request names its
conversation (its first two blocks) in X-Session-Id, as a client that knows its conversations does:
token-id prompts carry no messages to key on. Goodput: requests answered 200 within both targets,
rejected and failed requests counted as misses. Each result line also says where the conversation hits
a run missed went (missed_hits): routing, timing or eviction.

A load generator of our own: aiperf 0.13.0 (aiperf/dataset/loader/mooncake_trace.py) and guidellm 0.8.1
(guidellm/data/deserializers/trace_mooncake.py) both replay Mooncake traces, but each pulls dozens of
packages into the environment (aiperf: dash, kubernetes, pandas, pyarrow, optuna; guidellm: datasets,
sanic, httpx, transformers) and turns hash ids into text through a tokenizer, where this benchmark
needs exact token runs; inference-perf 0.7.0 has no distribution installable here.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
import contract  # noqa: E402
from bench.fleet.trace_sim import shared_blocks  # noqa: E402
from bench.measure import TINY_RESULTS, append_run, results_file, tiny_mode  # noqa: E402
from runtime.engines.base import DEFAULT_MAX_PREFILL_TOKENS  # noqa: E402
from runtime.ports import free_port  # noqa: E402
from traces import mooncake_rows, unreadable  # noqa: E402

TRACE_BLOCK_TOKENS = 512
# A run's start (3 units loading SmolLM2, then routable) and drain (the last requests, bounded by the
# node's 25 s queue timeout): about 25 s and 15 s on the shared 2-core machine.
RUN_OVERHEAD_S = 40.0
# today's policy, then by work, then by cache and work: the order of the comparison
POLICIES = tuple(reversed(contract.ROUTER_BALANCE_POLICIES))


@dataclass(frozen=True)
class Scaled:
    at: float
    prompt: list[int]
    max_tokens: int
    session: str
    blocks: tuple[int, ...]


def resent(rows: list[dict]) -> list[tuple[int, ...]]:
    """Each request's block hashes with its conversation's previous prompt resent whole, as a client
    that renders its conversation sends it. The trace hashes 512-token blocks, so a prompt's partial last
    block gets another hash once the next turn fills it: a later turn that repeats every block of the
    turn before but that one (3,825 of the conversation trace's 4,658 later turns; 122 repeat all) takes
    the earlier hash there, and its prompt then begins with the earlier prompt token for token."""
    last: dict[tuple[int, ...], tuple[list[int], int]] = {}  # conversation -> its last blocks, as resent, and tokens
    renamed: dict[tuple[int, ...], dict[int, int]] = {}  # conversation -> hashes taken back, for its later turns
    out = []
    for r in rows:
        conv = conversation_of(r)
        names = renamed.setdefault(conv, {})
        blocks = [names.get(h, h) for h in r["hash_ids"]]
        if conv in last:
            prev, tokens = last[conv]
            n = len(prev)
            if tokens % TRACE_BLOCK_TOKENS and len(blocks) >= n and blocks[: n - 1] == prev[: n - 1]:
                if blocks[n - 1] != prev[n - 1]:
                    names[r["hash_ids"][n - 1]] = prev[n - 1]
                    blocks[n - 1] = prev[n - 1]
        last[conv] = (blocks, r["input_length"])
        out.append(tuple(blocks))
    return out


def scale(
    rows: list[dict],
    *,
    block_tokens: int,
    max_input: int,
    max_output: int,
    rate: float,
    vocab: int = 40000,
    resend: bool = False,
) -> list[Scaled]:
    span = max(1.0, (rows[-1]["timestamp"] - rows[0]["timestamp"]) / 1000.0)
    # The trace's own rate is len(rows) / span; times are divided by how much faster `rate` is than that
    # (before, this was the inverse: a higher --rate replayed slower, and a lower one far faster).
    compress = rate / (len(rows) / span)
    hashes = resent(rows) if resend else [tuple(r["hash_ids"]) for r in rows]
    out = []
    for r, all_blocks in zip(rows, hashes):
        blocks = all_blocks[: max(1, max_input // block_tokens)]
        prompt: list[int] = []
        for h in blocks:
            rng = random.Random(h)  # the same run wherever the hash appears
            prompt += [rng.randrange(vocab // 40, vocab) for _ in range(block_tokens)]
        out_tokens = max(1, min(max_output, round(r["output_length"] * block_tokens / TRACE_BLOCK_TOKENS)))
        out.append(
            Scaled(
                at=(r["timestamp"] - rows[0]["timestamp"]) / 1000.0 / compress,
                prompt=prompt[:max_input],
                max_tokens=out_tokens,
                session=f"conv-{'-'.join(str(h) for h in blocks[:2])}",
                blocks=blocks,
            )
        )
    return out


def conversation_of(row: dict) -> tuple[int, ...]:
    """A request's conversation: its first two prefix blocks (every request of the conversation trace
    starts with the same block 0, the service's own preamble; the second is the conversation's first turn)."""
    return tuple(row["hash_ids"][:2])


def select(rows: list[dict], n: int, sample: str, seed: int = 0) -> list[dict]:
    """The requests to replay. `first`: the trace's first n. `conversations`: whole conversations drawn at
    random (seeded) from the whole trace until they hold at least n requests, every turn of each, in the
    trace's order: what a few units of a large fleet see when the router keeps conversations together,
    where the first n requests of the hour are mostly first turns whose follow-ups come later."""
    if sample == "first":
        return rows[:n]
    by_conv: dict[tuple[int, ...], list[int]] = {}
    for i, r in enumerate(rows):
        by_conv.setdefault(conversation_of(r), []).append(i)
    convs = list(by_conv)
    random.Random(seed).shuffle(convs)
    chosen: list[int] = []
    for c in convs:
        if len(chosen) >= n:
            break
        chosen += by_conv[c]
    return [rows[i] for i in sorted(chosen)]


def oracle_reuse(requests: list[Scaled], block_tokens: int) -> list[tuple[int, int]]:
    """Each request's (prompt tokens a single infinite cache could reuse, prompt tokens): its leading
    blocks seen before in the replay. No policy beats it."""
    seen: set[tuple[int, ...]] = set()
    out = []
    for q in requests:
        n = 0
        for i in range(1, len(q.blocks) + 1):
            if q.blocks[:i] not in seen:
                break
            n = i
        for i in range(1, len(q.blocks) + 1):
            seen.add(q.blocks[:i])
        out.append((min(len(q.prompt), n * block_tokens), len(q.prompt)))
    return out


def oracle_hit_rate(requests: list[Scaled], block_tokens: int) -> float:
    """The oracle's share of all prompt tokens reused."""
    reuse = oracle_reuse(requests, block_tokens)
    total = sum(t for _, t in reuse)
    return sum(h for h, _ in reuse) / total if total else 0.0


def oracle_median_share(requests: list[Scaled], block_tokens: int) -> float:
    """The median request's share of its own prompt the oracle reuses: what caching can take off a
    typical request's prefill at best (the token-weighted oracle_hit_rate leans on long prompts)."""
    shares = [h / t for h, t in oracle_reuse(requests, block_tokens) if t]
    return statistics.median(shares) if shares else 0.0


async def one(session: aiohttp.ClientSession, url: str, model: str, q: Scaled, t0: float, timeout_s: float) -> dict:
    await asyncio.sleep(max(0.0, t0 + q.at - time.monotonic()))
    body = {
        "model": model,
        "prompt": q.prompt,
        "max_tokens": q.max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    sent = time.monotonic()
    rec: dict = {
        "sent_s": sent - t0,  # from the replay's start
        "status": 0,
        "ttft_s": None,
        "tpot_s": None,
        "cached": 0,
        "prompt_tokens": len(q.prompt),
        "engine_prompt_tokens": None,  # usage.prompt_tokens as the engine counted them (None: no usage chunk)
    }
    try:
        async with asyncio.timeout(timeout_s):
            async with session.post(
                url + "/v1/completions", json=body, headers={contract.SESSION_HEADER: q.session}
            ) as resp:
                rec["status"] = resp.status
                rec["unit"] = resp.headers.get(contract.UNIT_HEADER, "")
                first = last = None
                tokens = 0
                async for raw in resp.content:
                    line = raw.strip()
                    if not line.startswith(b"data:") or line == b"data: [DONE]":
                        continue
                    chunk = json.loads(line[5:])
                    if "error" in chunk:  # the stream ended with an error event: a failed request, and why
                        rec["status"] = 599
                        err = chunk["error"]
                        rec["error"] = str(err.get("message") if isinstance(err, dict) else err)[:200]
                        break
                    if chunk.get("choices") and chunk["choices"][0].get("text"):
                        now = time.monotonic()
                        first = first or now
                        last = now
                        tokens += 1
                    usage = chunk.get("usage") or {}
                    details = usage.get("prompt_tokens_details") or {}
                    rec["cached"] = int(details.get("cached_tokens") or 0)
                    if "prompt_tokens" in usage:
                        rec["engine_prompt_tokens"] = int(usage["prompt_tokens"])
                if first is not None:
                    rec["ttft_s"] = first - sent
                    if tokens > 1 and last is not None:
                        rec["tpot_s"] = (last - first) / (tokens - 1)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        rec["error"] = repr(exc)
    return rec


def missed_hits(requests: list[Scaled], recs: list[dict], block_tokens: int) -> dict:
    """Where the oracle's hits that a run did not get went, in prompt tokens, per request that reuses
    part of its conversation's earlier prompt: `elsewhere`, it went to another unit than its
    conversation's previous request; `too_soon`, to the same unit before that request's first token
    (its prompt not yet in the cache); `evicted`, to the same unit after it, so the unit no longer had
    it. Hits the oracle finds in other conversations' prompts (the shared preamble) are not counted."""
    out = {"elsewhere": 0, "too_soon": 0, "evicted": 0}
    last: dict[str, int] = {}
    for i, ((reuse, _), q, r) in enumerate(zip(oracle_reuse(requests, block_tokens), requests, recs)):
        j = last.get(q.session)
        last[q.session] = i
        if j is None or r.get("status") != 200:
            continue
        prev = recs[j]
        shared = shared_blocks(q.blocks, requests[j].blocks)
        missed = min(reuse, shared * block_tokens) - r["cached"]
        if missed <= 0:
            continue
        if prev.get("unit") != r.get("unit"):
            out["elsewhere"] += missed
        elif prev.get("ttft_s") is None or prev["sent_s"] + prev["ttft_s"] > r["sent_s"]:
            out["too_soon"] += missed
        else:
            out["evicted"] += missed
    return out


def write_records(path: Path, requests: list[Scaled], recs: list[dict]) -> None:
    """One line per request, in the trace's order: what it was (its conversation, its turn, its prompt
    tokens, the blocks it shares with its conversation's previous request) and how it went (unit,
    status, TTFT, TPOT, cached tokens): what a late or missed request is traced back with."""
    path.parent.mkdir(parents=True, exist_ok=True)
    last: dict[str, Scaled] = {}
    turns: dict[str, int] = {}
    with path.open("w") as f:
        for q, r in zip(requests, recs):
            prev = last.get(q.session)
            shared = shared_blocks(q.blocks, prev.blocks) if prev else 0
            turns[q.session] = turns.get(q.session, 0) + 1
            last[q.session] = q
            line = {"at_s": round(q.at, 3), "session": q.session, "turn": turns[q.session], "shared_blocks": shared}
            f.write(json.dumps(line | r) + "\n")


def quantile(xs: list[float], x: float) -> float | None:
    """The x-quantile of sorted xs, nearest rank (the median of 100 values is the 51st)."""
    return xs[min(len(xs) - 1, int(len(xs) * x))] if xs else None


def answered(recs: list[dict]) -> list[dict]:
    """The requests answered 200 with a first token: those the TTFT percentiles count."""
    return [r for r in recs if r["status"] == 200 and r["ttft_s"] is not None]


def summarize(recs: list[dict], ttft_target_s: float, tpot_target_s: float) -> dict:
    ok = answered(recs)
    ttfts = sorted(r["ttft_s"] for r in ok)
    tpots = sorted(r["tpot_s"] for r in ok if r["tpot_s"] is not None)
    good = sum(1 for r in ok if r["ttft_s"] <= ttft_target_s and (r["tpot_s"] or 0.0) <= tpot_target_s)
    prompt = sum(r["prompt_tokens"] for r in recs)
    counted = [r for r in recs if r.get("engine_prompt_tokens") is not None]
    return {
        "requests": len(recs),
        "ok": len(ok),
        "rejected_or_failed": len(recs) - len(ok),
        "prompt_tokens": prompt,
        # Answers whose usage says the engine saw a prompt of another length than the one sent (and
        # so than the oracle's): 0 when the hit rates compare the same tokens.
        "engine_prompt_mismatches": sum(1 for r in counted if r["engine_prompt_tokens"] != r["prompt_tokens"]),
        "engine_prompt_counted": len(counted),
        "ttft_p50_s": quantile(ttfts, 0.5),
        "ttft_p90_s": quantile(ttfts, 0.9),
        "ttft_p99_s": quantile(ttfts, 0.99),
        "tpot_mean_s": sum(tpots) / len(tpots) if tpots else None,
        "hit_rate": sum(r["cached"] for r in recs) / prompt if prompt else 0.0,
        "goodput": good / len(recs) if recs else 0.0,
        # Answered requests past each target (one can be past both), and the slowest TPOT among them.
        "late": {
            "ttft": sum(1 for r in ok if r["ttft_s"] > ttft_target_s),
            "tpot": sum(1 for r in ok if (r["tpot_s"] or 0.0) > tpot_target_s),
        },
        "tpot_max_s": tpots[-1] if tpots else None,
        "units_used": len({r.get("unit") for r in ok}),
        "failures": [{k: r.get(k) for k in ("status", "error")} for r in recs if r not in ok][:3],
    }


def _wait_routable(url: str, units: int, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"bench-trace: make local exited with {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(url + contract.ROUTER_HEALTH_PATH, timeout=2) as r:  # noqa: S310
                if int(json.load(r).get("routable_units", 0)) >= units:
                    return
        except (OSError, ValueError):
            pass
        time.sleep(1.0)
    raise SystemExit(f"bench-trace: {units} units not routable within {timeout_s:.0f} s (--ready-timeout)")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)  # the launcher drains and stops its units and router
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def _start_local(policy: str, a: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    """`make local` with the policy, waited until every unit is routable. A start that fails (two
    processes on this shared machine picked the same free port) is tried again, at most 3 times."""
    state = Path(a.state_dir) / policy
    state.mkdir(parents=True, exist_ok=True)
    for attempt in range(3):
        port = free_port()
        cmd = [sys.executable, "-m", "runtime.local", "--units", str(a.units), "--nodes", str(a.nodes)]
        cmd += ["--model", a.model, "--balance", policy, "--port", str(port), "--state-dir", str(state)]
        env = {**os.environ, "FLOTILLA_MAX_PREFILL_TOKENS": str(a.max_prefill_tokens)}  # every node inherits it
        with open(state / "launcher.log", "ab") as log:
            proc = subprocess.Popen(
                cmd, cwd=str(REPO), env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_routable(url, a.units, proc, a.ready_timeout)
            return proc, url
        except SystemExit as exc:
            _stop(proc)
            if attempt == 2:
                raise
            print(f"  {policy}: {exc}; starting again (log: {state / 'launcher.log'})", flush=True)
    raise AssertionError("unreachable")


def run_policy(policy: str, requests: list[Scaled], a: argparse.Namespace, rate: float = 0.0) -> dict:
    proc, url = _start_local(policy, a)
    try:

        async def replay() -> list[dict]:
            conn = aiohttp.TCPConnector(limit=0)
            async with aiohttp.ClientSession(connector=conn) as s:
                t0 = time.monotonic() + 0.5
                model = os.path.basename(a.model.rstrip("/"))
                return await asyncio.gather(*(one(s, url, model, q, t0, a.request_timeout) for q in requests))

        recs = asyncio.run(replay())
    finally:
        _stop(proc)
    if a.records:
        write_records(Path(a.records) / f"{policy}-{rate:g}.jsonl", requests, recs)
    return summarize(recs, a.ttft_target, a.tpot_target) | {"missed": missed_hits(requests, recs, a.block_tokens)}


def parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The replay's flags (bound.py takes them too, to select the same requests); `argv` says whether
    --tiny's defaults apply."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--trace", default="conversation", help="conversation, synthetic (shipped in traces/) or a Mooncake JSONL path"
    )
    ap.add_argument("--requests", type=int, default=100, help="how many requests (see --sample)")
    ap.add_argument(
        "--sample",
        choices=("conversations", "first"),
        default="conversations",
        help="conversations: whole conversations drawn from the whole hour until N requests; first: the first N",
    )
    ap.add_argument("--seed", type=int, default=0, help="which conversations --sample conversations draws")
    ap.add_argument(
        "--rates", default="0.5,1", help="mean arrivals per second after scaling, comma-separated: one run per rate"
    )
    ap.add_argument("--block-tokens", type=int, default=16)
    ap.add_argument(
        "--resend",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="a later turn resends its previous turn's prompt whole, as a client rendering its conversation does "
        "(the trace's partial last block changes hash when the next turn fills it: replay.resent); --no-resend: "
        'the trace\'s hashes as they are (results whose scaling has no "resend": true)',
    )
    ap.add_argument("--max-input-tokens", type=int, default=512)
    ap.add_argument("--max-output-tokens", type=int, default=16)
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--units", type=int, default=3)
    ap.add_argument("--nodes", type=int, default=1, help="members per unit (1 keeps 3 units within 2 cores)")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument(
        "--max-prefill-tokens",
        type=int,
        default=DEFAULT_MAX_PREFILL_TOKENS,
        help="each engine's prompt tokens per step (longer prompts are prefilled in chunks)",
    )
    ap.add_argument("--vocab", type=int, default=40000, help="token ids are drawn below this (smollm2: 49,152)")
    ap.add_argument("--ttft-target", type=float, default=2.0, help="goodput: seconds to first token at most")
    ap.add_argument("--tpot-target", type=float, default=0.5, help="goodput: seconds per output token at most")
    ap.add_argument("--request-timeout", type=float, default=120.0)
    ap.add_argument("--ready-timeout", type=float, default=600.0)
    ap.add_argument("--state-dir", default=str(REPO / ".flotilla" / "bench-trace"))
    ap.add_argument("--label", default="")
    ap.add_argument("--records", default="", help="a directory: each run's requests, one JSON line each")
    ap.add_argument("--out", default=str(results_file("trace_replay.json", tiny=False)))
    tiny_mode(
        ap,
        argv,
        requests=4,
        sample="first",
        rates="4",
        policies=POLICIES[-1],
        units=1,
        model="tiny",
        vocab=261,  # the tiny model's vocabulary
        max_input_tokens=32,
        max_output_tokens=2,
        ready_timeout=300.0,
        state_dir=str(TINY_RESULTS / "bench-trace"),
        out=str(results_file("trace_replay.json", tiny=True)),
    )
    return ap


def selected_rows(ap: argparse.ArgumentParser, a: argparse.Namespace) -> list[dict]:
    """The trace's requests that --trace, --requests, --sample and --seed select (a trace that cannot
    be read is refused naming the flag)."""
    try:
        rows = mooncake_rows(a.trace)
    except OSError as exc:
        ap.error(unreadable("--trace", a.trace, exc))
    return select(rows, a.requests, a.sample, a.seed)


def main(argv: list[str] | None = None) -> int:
    ap = parser(argv)
    a = ap.parse_args(argv)
    try:
        a.rates = [float(r) for r in a.rates.split(",")]
    except ValueError:
        ap.error(f"--rates {a.rates}: give requests per second, comma-separated, e.g. 0.5,1")
    policies = tuple(a.policies.split(","))
    bad = [p for p in policies if p not in POLICIES]
    if bad:
        ap.error(f"--policies {bad[0]}: one of {', '.join(POLICIES)}")
    if a.requests < 1 or min(a.rates) <= 0 or a.block_tokens < 1 or a.max_prefill_tokens < 1:
        ap.error("--requests, --block-tokens and --max-prefill-tokens must be at least 1 and every --rates above 0")
    if a.records and Path(a.records).exists() and not Path(a.records).is_dir():
        ap.error(f"--records {a.records}: a file is there; give a directory (it is made if missing)")
    rows = selected_rows(ap, a)
    load_before = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else []
    runs = len(a.rates) * len(policies)
    arrivals_s = sum(len(rows) / r for r in a.rates) * len(policies)
    print(
        f"plan: {runs} runs ({', '.join(policies)} at {', '.join(f'{r:g}' for r in a.rates)} req/s): "
        f"{arrivals_s / 60:.1f} min of arrivals, about {(arrivals_s + runs * RUN_OVERHEAD_S) / 60:.0f} min with "
        f"each run's start and drain",
        flush=True,
    )
    entries = []
    for rate in a.rates:
        requests = scale(
            rows,
            block_tokens=a.block_tokens,
            max_input=a.max_input_tokens,
            max_output=a.max_output_tokens,
            rate=rate,
            vocab=a.vocab,
            resend=a.resend,
        )
        scaling = {
            "trace": a.trace,
            "requests": len(requests),
            "sample": a.sample,
            "seed": a.seed,
            "block_tokens": a.block_tokens,
            "resend": a.resend,
            "max_input_tokens": a.max_input_tokens,
            "max_output_tokens": a.max_output_tokens,
            "output_divisor": TRACE_BLOCK_TOKENS / a.block_tokens,
            "rate_per_s": rate,
            "mean_prompt_tokens": sum(len(q.prompt) for q in requests) / len(requests),
            "prompt_tokens": sum(len(q.prompt) for q in requests),
            "requests_digest": requests_digest(requests),
            "oracle_hit_rate": oracle_hit_rate(requests, a.block_tokens),
            "oracle_median_share": oracle_median_share(requests, a.block_tokens),
            "units": a.units,
            "nodes": a.nodes,
            "model": a.model,
            "max_prefill_tokens": a.max_prefill_tokens,
            "ttft_target_s": a.ttft_target,
            "tpot_target_s": a.tpot_target,
        }
        print(scaling_line(scaling), flush=True)
        results = {}
        for policy in policies:
            r = run_policy(policy, requests, a, rate)
            # The oracle's figure and the policy's are over the same requests: the same prompts sent
            # (digest), the same token total, and the engine counted each prompt as sent.
            r["requests_digest"] = requests_digest(requests)
            results[policy] = r
            print(result_line(policy, r, scaling), flush=True)
        entries.append(
            {
                "label": a.label,
                "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "loadavg_before": load_before,
                "loadavg": Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else [],
                "scaling": scaling,
                "args": {k: v for k, v in vars(a).items() if k not in ("out", "records")},
                "results": results,
            }
        )
        append_run(a.out, entries[-1])
    print()
    print("\n".join(table(entries)))
    return 0


def requests_digest(requests: list[Scaled]) -> str:
    """What was asked, independent of when: the prompts and output lengths, in order."""
    h = hashlib.sha256()
    for q in requests:
        h.update(json.dumps([q.prompt, q.max_tokens]).encode())
    return h.hexdigest()[:16]


def _ms(x: float | None) -> str:
    return f"{1000 * x:,.0f}" if x is not None else "-"


def _sampled(sc: dict) -> str:
    if sc.get("sample", "first") == "first":
        return f"first {sc['requests']} requests"
    return f"{sc['requests']} requests of whole conversations drawn from the hour (seed {sc.get('seed', 0)})"


def scaling_line(sc: dict) -> str:
    return (
        f"trace {sc['trace']}: {_sampled(sc)}, 512-token blocks -> {sc['block_tokens']} tokens"
        + (", later turns resending their previous prompt whole" if sc.get("resend") else "")
        + ", "
        f"prompts <= {sc['max_input_tokens']} (mean {sc['mean_prompt_tokens']:.0f}), outputs / "
        f"{sc['output_divisor']:.0f} <= {sc['max_output_tokens']}, {sc['rate_per_s']:g} req/s; {sc['units']} units x "
        f"{sc['nodes']} node(s) of {sc['model']}"
        + (f", {sc['max_prefill_tokens']} prompt tokens per step" if "max_prefill_tokens" in sc else "")
        + "; oracle (infinite cache) hit rate "
        f"{100 * sc['oracle_hit_rate']:.1f} % of {sc['prompt_tokens']} prompt tokens"
        + (f", {100 * sc['oracle_median_share']:.0f} % of the median request's" if "oracle_median_share" in sc else "")
        + f" (requests {sc['requests_digest']})"
    )


def result_line(policy: str, r: dict, sc: dict) -> str:
    same = (
        "same requests as the oracle"
        if r["requests_digest"] == sc["requests_digest"]
        and r["prompt_tokens"] == sc["prompt_tokens"]
        and r["engine_prompt_mismatches"] == 0
        else f"NOT the oracle's requests ({r['engine_prompt_mismatches']} prompts counted otherwise by the engine)"
    )
    return (
        f"  {policy:15s} TTFT p50 {_ms(r['ttft_p50_s'])} p90 {_ms(r['ttft_p90_s'])} p99 {_ms(r['ttft_p99_s'])} ms  "
        f"TPOT {_ms(r['tpot_mean_s'])} ms  hit {100 * r['hit_rate']:.1f} %  goodput {100 * r['goodput']:.1f} % "
        f"(TTFT <= {sc['ttft_target_s']:g} s, TPOT <= {sc['tpot_target_s']:g} s)  ok {r['ok']}/{r['requests']}  "
        f"units used {r['units_used']}; {same} ({r['engine_prompt_counted']} usage chunks)"
        + (
            f"; answered late: TTFT {r['late']['ttft']}, TPOT {r['late']['tpot']} "
            f"(slowest TPOT {_ms(r['tpot_max_s'])} ms)"
            if "late" in r
            else ""
        )
        + (
            "; conversation hits missed (tokens): " + ", ".join(f"{k} {v}" for k, v in r["missed"].items())
            if "missed" in r
            else ""
        )
    )


def table(entries: list[dict]) -> list[str]:
    """The docs/benchmarks.md table: one row per rate and policy, the scaling of each rate above it."""
    out = []
    for e in entries:
        sc = e["scaling"]
        out.append(
            f"Scaling: {scaling_line(sc)}; goodput targets TTFT <= {sc['ttft_target_s']:g} s, "
            f"TPOT <= {sc['tpot_target_s']:g} s; load average {' '.join(e['loadavg_before'])} before, "
            f"{' '.join(e['loadavg'])} after."
        )
        out.append("")
        out.append(
            "| rate (req/s) | policy | TTFT p50 (ms) | p90 | p99 | TPOT (ms) | hit | oracle hit | hit / oracle "
            "| goodput | answered 200 (rejected or failed) |"
        )
        out.append("|---|---|---|---|---|---|---|---|---|---|---|")
        oracle = sc["oracle_hit_rate"]
        for policy, r in e["results"].items():
            share = f"{r['hit_rate'] / oracle:.0%}" if oracle else "-"
            out.append(
                f"| {sc['rate_per_s']:g} | {policy} | {_ms(r['ttft_p50_s'])} | {_ms(r['ttft_p90_s'])} | "
                f"{_ms(r['ttft_p99_s'])} | {_ms(r['tpot_mean_s'])} | {100 * r['hit_rate']:.1f} % | "
                f"{100 * oracle:.1f} % | {share} | {100 * r['goodput']:.1f} % | "
                f"{r['ok']} / {r['requests']} ({r['rejected_or_failed']}) |"
            )
        out.append("")
    return out


if __name__ == "__main__":
    sys.exit(main())
