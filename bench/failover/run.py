"""Failures the client never sees, measured on `make local` (2 units of 2 nodes behind the router).

Three scenarios, each on a fresh local fleet (runtime.local):
  kill9    concurrent greedy streams; kill -9 a member of one unit mid-answer (leader, then follower):
           failed requests, streams that differ from the same fleet's answers before the kill, and
           each stream's longest pause between two events (what a move adds).
  sigstop  the same load; SIGSTOP a follower (and its engine process): how long until the router
           stops routing to its unit, whether its streams complete elsewhere, and after SIGCONT how
           long until the unit is back in rotation.
  drain    long answers in flight; SIGTERM a leader (drain timeout 300 s): how long until it exits,
           and failed requests.

    python -m bench.failover.run                # full: smollm2, 32 streams, 1,500-token drain answers
    python -m bench.failover.run --short        # tiny model, 8 streams, short answers, every scenario
    python -m bench.failover.run --tiny         # one blow (kill -9 of a follower), 4 streams: the command runs
    python -m bench.failover.run --scenarios kill9-follower --streams 16 --diagnose   # one blow, where it differs

Each unit gets --max-running batch slots (full run: 48, so the unit that survives a blow has a slot for
every stream, the headroom the goals assume; --short: 16) and a KV budget for them (--kv-budget-tokens);
every row carries both settings.

Wall-clock figures depend on the machine's load: the results record the load average and the CPU.
Results: bench/results/failover.json (appended).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench.measure import cpu_model, process_tree, results_file, tiny_mode  # noqa: E402
from runtime.ports import free_port  # noqa: E402


class Fleet:
    """`python -m runtime.local --units 2 --nodes 2` in a scratch state directory."""

    def __init__(self, a: argparse.Namespace, drain_timeout: float) -> None:
        self.state = Path(tempfile.mkdtemp(prefix="flotilla-failover-"))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "runtime.local", "--units", "2", "--nodes", "2", "--model", a.model]
        cmd += ["--port", str(self.port), "--state-dir", str(self.state), "--drain-timeout", str(drain_timeout)]
        # The node settings' environment variables (runtime/node/settings.py) reach every node of the fleet.
        env = {**os.environ, "FLOTILLA_MAX_RUNNING": str(a.max_running)}
        env["FLOTILLA_KV_BUDGET_TOKENS"] = str(a.kv_budget_tokens)
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, text=True, start_new_session=True)
        self.processes: list[dict] = []

    def wait_serving(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"runtime.local exited ({self.proc.poll()}); logs in {self.state}/logs")
            if line.startswith("flotilla is serving"):
                self.processes = json.loads((self.state / "local.json").read_text())["processes"]
                return
        raise RuntimeError(f"the local fleet did not serve within {timeout:g} s; logs in {self.state}/logs")

    @property
    def metrics_url(self) -> str:
        """The router's /metrics: its own port (runtime.local lists it), not the public one."""
        (router,) = [p for p in self.processes if p["role"] == "router"]
        return f"http://127.0.0.1:{router['ports']['metrics']}/metrics"

    def member(self, unit: str, role: str) -> dict:
        return next(p for p in self.processes if p["unit"] == unit and p["role"] == role)

    async def routable(self, unit: str) -> bool:
        async with aiohttp.ClientSession() as s, s.get(self.metrics_url) as r:
            text = await r.text()
        return any(
            line.startswith("flotilla_router_unit_routable{") and f'unit="{unit}"' in line and line.endswith(" 1.0")
            for line in text.splitlines()
        )

    async def moves(self) -> int:
        async with aiohttp.ClientSession() as s, s.get(self.metrics_url) as r:
            text = await r.text()
        return int(
            sum(
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith("flotilla_router_retries_total{") and 'reason="move_' in line
            )
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
        for p in self.processes:  # a member the scenario froze must not stay frozen
            try:
                for pid in process_tree(p["pid"]):
                    os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass


class Result:
    def __init__(self) -> None:
        self.text = ""
        self.ok = False
        self.error = ""
        self.events = 0
        self.gaps: list[float] = []
        self.pieces: list[str] = []  # each event's text, in order (one token per event)
        self.top: list[dict] = []  # each event's top logprobs (--diagnose)

    def pause_at(self) -> int:
        """Events read before the longest pause: where a moved stream moved."""
        return max(range(len(self.gaps)), key=self.gaps.__getitem__) + 1 if self.gaps else 0


async def one_stream(
    session: aiohttp.ClientSession, url: str, model: str, prompt: str, max_tokens: int, logprobs: int | None = None
) -> Result:
    out = Result()
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    body["ignore_eos"] = True
    if logprobs:
        body["logprobs"] = logprobs
    last = None
    try:
        async with session.post(url + "/v1/completions", json=body) as r:
            if r.status != 200:
                out.error = f"{r.status}: {(await r.text())[:200]}"
                return out
            buf = b""
            async for piece in r.content.iter_any():
                now = time.monotonic()
                if last is not None:
                    out.gaps.append(now - last)
                last = now
                buf += piece
                while b"\n\n" in buf:
                    raw, buf = buf.split(b"\n\n", 1)
                    if raw == b"data: [DONE]":
                        out.ok = True
                    elif raw.startswith(b"data: "):
                        ev = json.loads(raw[6:])
                        if "error" in ev:
                            out.error = ev["error"].get("code") or "error"
                        else:
                            out.events += 1
                            text = "".join(c.get("text") or "" for c in ev.get("choices", []))
                            out.text += text
                            out.pieces.append(text)
                            for c in ev.get("choices", []):
                                out.top += (c.get("logprobs") or {}).get("top_logprobs") or []
    except (aiohttp.ClientError, asyncio.TimeoutError) as e:
        out.error = type(e).__name__
    return out


def prompts(n: int) -> list[str]:
    return [f"Question {i}: which waterproof hiking boots are best for wet trails, and why?" for i in range(n)]


async def load(
    fleet: Fleet, model: str, n: int, max_tokens: int, blow=None, logprobs: int | None = None
) -> list[Result]:
    """n concurrent streams; `blow()` runs alongside them (it waits its own delay into the load)."""
    timeout = aiohttp.ClientTimeout(total=1800)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as s:
        tasks = [asyncio.create_task(one_stream(s, fleet.url, model, p, max_tokens, logprobs)) for p in prompts(n)]
        if blow is not None:
            await blow()
        return list(await asyncio.gather(*tasks))


def first_difference(a: str, b: str) -> int | None:
    """The index of the first character where two texts differ (None: the same text)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def token_at(pieces: list[str], char: int) -> int:
    """The index of the event (one token each) whose text holds character `char`."""
    seen = 0
    for i, piece in enumerate(pieces):
        seen += len(piece)
        if seen > char:
            return i
    return len(pieces)


def divergences(results: list[Result], reference: list[Result]) -> list[dict]:
    """Each stream that differs from the fleet's answer before the blow: the token where it first
    differs, the tokens it had read before its longest pause (its move), and with --diagnose the
    answer-before-the-blow's likeliest tokens there and the logprob margin between the first two."""
    out: list[dict] = []
    for i, (r, ref) in enumerate(zip(results, reference, strict=True)):
        char = first_difference(r.text, ref.text)
        if char is None:
            continue
        at = token_at(ref.pieces, char)
        row: dict = {"stream": i, "first_difference_at": at, "moved_after": r.pause_at()}
        row |= {"tokens": len(r.pieces), "tokens_before": len(ref.pieces), "error": r.error or ref.error or None}
        row["before"], row["after"] = ref.pieces[at : at + 1], r.pieces[token_at(r.pieces, char) :][:1]
        if at < len(ref.top) and ref.top[at]:
            best = sorted(ref.top[at].values(), reverse=True)
            row["top_logprobs_before"] = ref.top[at]
            row["margin"] = round(best[0] - best[1], 6) if len(best) > 1 else None
        out.append(row)
    return out


def summary(results: list[Result], reference: list[Result] | None) -> dict:
    gaps = sorted(max(r.gaps, default=0.0) for r in results)
    p99 = gaps[min(len(gaps) - 1, int(0.99 * len(gaps)))] if gaps else 0.0
    return {
        "requests": len(results),
        "failed": sum(not r.ok for r in results),
        "errors": sorted({r.error for r in results if r.error}),
        "differ_from_before_the_blow": (
            None if reference is None else sum(r.text != t.text for r, t in zip(results, reference, strict=True))
        ),
        # An answer before the blow that failed or moved (a loaded machine can stall a step past the
        # router's stall bound) is no reference: the row says how many there were.
        **({} if reference is None else {"reference_failed": sum(not r.ok for r in reference)}),
        **({} if reference is None else {"differences": divergences(results, reference)}),
        "longest_pause_s_p99": round(p99, 3),
        "longest_pause_s_max": round(gaps[-1], 3) if gaps else 0.0,
    }


async def wait_until(pred, timeout: float, every: float = 0.05) -> float | None:
    """Seconds until pred() is true, None if it never was within timeout."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if await pred():
            return time.monotonic() - t0
        await asyncio.sleep(every)
    return None


async def scenario_kill9(a, model_name: str, role: str) -> dict:
    fleet = Fleet(a, drain_timeout=30)
    try:
        await asyncio.to_thread(fleet.wait_serving, a.ready_timeout)
        reference = await load(fleet, model_name, a.streams, a.max_tokens, logprobs=a.logprobs)
        victim = fleet.member("local-unit0", role)

        async def blow() -> None:
            await asyncio.sleep(a.blow_after_s)
            os.kill(victim["pid"], signal.SIGKILL)

        results = await load(fleet, model_name, a.streams, a.max_tokens, blow, logprobs=a.logprobs)
        return {
            "scenario": f"kill -9 {role}",
            **settings(a),
            **summary(results, reference),
            "moves": await fleet.moves(),
        }
    finally:
        fleet.stop()


async def scenario_sigstop(a, model_name: str) -> dict:
    fleet = Fleet(a, drain_timeout=30)
    try:
        await asyncio.to_thread(fleet.wait_serving, a.ready_timeout)
        reference = await load(fleet, model_name, a.streams, a.max_tokens, logprobs=a.logprobs)
        victim = fleet.member("local-unit0", "follower")
        timing: dict[str, float | None] = {}

        async def blow() -> None:
            await asyncio.sleep(a.blow_after_s)
            for pid in process_tree(victim["pid"]):
                os.kill(pid, signal.SIGSTOP)
            timing["out_of_routing_s"] = await wait_until(lambda: _not(fleet.routable("local-unit0")), 60)

        results = await load(fleet, model_name, a.streams, a.max_tokens, blow, logprobs=a.logprobs)
        for pid in process_tree(victim["pid"]):
            os.kill(pid, signal.SIGCONT)
        timing["back_in_routing_after_sigcont_s"] = await wait_until(lambda: fleet.routable("local-unit0"), 600)
        return {
            "scenario": "SIGSTOP follower",
            **settings(a),
            **summary(results, reference),
            "moves": await fleet.moves(),
            **{k: None if v is None else round(v, 2) for k, v in timing.items()},
        }
    finally:
        fleet.stop()


def settings(a: argparse.Namespace) -> dict:
    """The fleet's settings a row's figures depend on, printed beside them."""
    return {"max_running": a.max_running, "kv_budget_tokens": a.kv_budget_tokens, "streams": a.streams}


async def _not(coro) -> bool:
    return not await coro


async def scenario_drain(a, model_name: str) -> dict:
    fleet = Fleet(a, drain_timeout=300)
    try:
        await asyncio.to_thread(fleet.wait_serving, a.ready_timeout)
        victim = fleet.member("local-unit0", "leader")
        timing: dict[str, float | None] = {}

        async def blow() -> None:
            await asyncio.sleep(a.blow_after_s)
            t0 = time.monotonic()
            os.kill(victim["pid"], signal.SIGTERM)
            gone = await wait_until(lambda: _exited(victim["pid"]), 400)
            timing["drain_s"] = None if gone is None else time.monotonic() - t0

        results = await load(fleet, model_name, a.streams, a.drain_tokens, blow)
        drain_s = timing.get("drain_s")
        return {
            "scenario": f"drain with {a.drain_tokens}-token answers in flight",
            **settings(a),
            **summary(results, None),
            "moves": await fleet.moves(),
            "drain_s": None if drain_s is None else round(drain_s, 2),
        }
    finally:
        fleet.stop()


async def _exited(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie (exited, not yet reaped by runtime.local) counts as exited.
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--short", action="store_true", help="tiny model, 8 streams, short answers")
    p.add_argument("--model", default=None, help="smollm2 (default) or tiny")
    p.add_argument("--streams", type=int, default=None, help="concurrent streams (default 32; --short 8)")
    p.add_argument("--max-tokens", type=int, default=None, help="tokens per stream (default 256; --short 64)")
    p.add_argument("--drain-tokens", type=int, default=None, help="drain answers' length (1500; --short 200)")
    p.add_argument("--blow-after", dest="blow_after_s", type=float, default=None, help="seconds into the load")
    p.add_argument("--ready-timeout", type=float, default=900.0)
    p.add_argument(
        "--max-running",
        type=int,
        default=None,
        help="batch slots per unit (FLOTILLA_MAX_RUNNING; default 48, --short 16)",
    )
    p.add_argument(
        "--kv-budget-tokens",
        type=int,
        default=None,
        help="KV-cache tokens per unit (FLOTILLA_KV_BUDGET_TOKENS; default: room for --max-running drain answers)",
    )
    p.add_argument(
        "--diagnose",
        dest="logprobs",
        action="store_const",
        const=2,
        default=None,
        help="ask for the two likeliest tokens' logprobs, so each differing stream shows the margin where it differs",
    )
    p.add_argument(
        "--scenarios",
        default="kill9,sigstop,drain",
        help="comma-separated: kill9 (leader, then follower), kill9-leader, kill9-follower, sigstop, drain",
    )
    p.add_argument("--out", default=str(results_file("failover.json", tiny=False)))
    tiny_mode(
        p,
        argv,
        short=True,
        streams=4,
        max_tokens=128,  # long enough on the tiny model that the blow lands mid-stream
        drain_tokens=32,
        blow_after_s=0.3,
        max_running=8,
        scenarios="kill9-follower",
        ready_timeout=300.0,
        out=str(results_file("failover.json", tiny=True)),
    )
    a = p.parse_args(argv)
    short = a.short
    a.model = a.model or ("tiny" if short else "smollm2")
    a.streams = a.streams or (8 if short else 32)
    a.max_tokens = a.max_tokens or (64 if short else 256)
    a.drain_tokens = a.drain_tokens or (200 if short else 1500)
    a.blow_after_s = a.blow_after_s if a.blow_after_s is not None else (1.0 if short else 5.0)
    a.max_running = a.max_running or (16 if short else 48)
    # Every slot full of drain answers (prompt ~20 tokens), in whole 1,024-token steps.
    a.kv_budget_tokens = a.kv_budget_tokens or -(-a.max_running * (a.drain_tokens + 64) // 1024) * 1024
    if a.max_running < 1 or a.kv_budget_tokens < 16:
        p.error("--max-running must be at least 1 and --kv-budget-tokens at least 16")
    known = ("kill9", "kill9-leader", "kill9-follower", "sigstop", "drain")
    unknown = [n for n in a.scenarios.split(",") if n not in known]
    if unknown:
        p.error(f"--scenarios: unknown scenario(s) {', '.join(unknown)}; give some of {', '.join(known)}")
    model_name = os.path.basename(a.model.rstrip("/"))  # the name runtime.local serves it under
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    rows: list[dict] = []

    async def go() -> None:
        for name in a.scenarios.split(","):
            if name == "kill9":
                rows.append(await scenario_kill9(a, model_name, "leader"))
                print(json.dumps(rows[-1]), flush=True)
                rows.append(await scenario_kill9(a, model_name, "follower"))
            elif name in ("kill9-leader", "kill9-follower"):
                rows.append(await scenario_kill9(a, model_name, name.split("-")[1]))
            elif name == "sigstop":
                rows.append(await scenario_sigstop(a, model_name))
            elif name == "drain":
                rows.append(await scenario_drain(a, model_name))
            print(json.dumps(rows[-1]), flush=True)

    asyncio.run(go())
    record = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpu": cpu_model(),
        "loadavg_before": load_before,
        "loadavg_after": Path("/proc/loadavg").read_text().split()[:3],
        "model": a.model,
        "short": short,
        "fleet": "2 units x 2 nodes (make local)",
        "rows": rows,
    }
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    history = json.loads(out.read_text()) if out.exists() else []
    history.append(record)
    out.write_text(json.dumps(history, indent=2) + "\n")
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
