"""`make bench-scaler-local`: `make local` with the scaler against static provisioning for the peak,
under the same load ramp up and down (closed-loop streaming clients, their number stepping through
--steps). Reports for each: every request answered (200) or shed (429 with Retry-After), the ones
that failed otherwise (a scale-in that cut a stream would show here), unit-seconds paid, and p50 /
p99 time to first token. Wall-clock figures: run it on a quiet machine (docs/benchmarks.md, "Scaling,
locally"). `--tiny` runs a short ramp of the scaler alone on one-node `tiny` units (figures in
.cache/bench-tiny/).

Every run keeps what explains a failure in a run directory it prints (--run-dir, by default
.cache/bench-scaler-local/<UTC time>/): per mode, the router's and every unit member's log, the
scaler's decisions and its units' comings and goings (scaler.jsonl, units.jsonl), and every request
(answers.jsonl: its id and unit, when it was sent, its first event and end, and for a failure the
stream's last bytes).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
import contract  # noqa: E402 - after the path to this checkout is known
from bench.measure import append_run, pct, process_tree, results_file, tiny_mode  # noqa: E402
from runtime.ports import free_port  # noqa: E402

RESULTS = "scaler_local.json"
READY_BANNER = "Ctrl-C stops everything"


@dataclass
class Answer:
    sent: float  # monotonic
    sent_unix: float = 0.0  # the same instant in the logs' clock
    status: int = 0
    ttft_s: float | None = None  # to the first data event (a token, or an error event)
    end_s: float | None = None  # to the end of the body
    events: int = 0  # data events received
    request_id: str = ""  # the router's X-Request-Id: its access log and the units' logs name it
    unit: str = ""  # the unit that answered first (a moved stream's later units are in the router's log)
    retry_after: bool = False
    ok: bool = False
    error: str = ""
    tail: str = ""  # a failed stream's last bytes


class Launcher:
    """`python -m runtime.local` as a child process on a free port, state in a temporary directory."""

    def __init__(self, args: list[str], state: Path) -> None:
        self.port = free_port()
        self.state = state
        self.out: list[str] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "runtime.local", *args, "--state-dir", str(state), "--port", str(self.port)],
            cwd=str(REPO),
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        threading.Thread(target=lambda: self.out.extend(self.proc.stdout or []), daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float) -> float:
        deadline = time.monotonic() + timeout
        while not any(READY_BANNER in line for line in self.out):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"local mode did not start:\n{''.join(self.out)[-3000:]}")
            time.sleep(0.2)
        return time.monotonic()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                for pid in reversed(process_tree(self.proc.pid)):
                    os.kill(pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


def stream_verdict(data: bytes) -> tuple[bool, int, str]:
    """(whole, data events, why not) of an SSE body: whole when it ends with [DONE] and carries no
    error event; otherwise which of the two it lacks (an error event's code and message)."""
    events = [e[6:] for e in data.split(b"\n\n") if e.startswith(b"data: ")]
    for e in events:
        if e.startswith(b'{"error"'):
            try:
                err = json.loads(e)["error"]
                return False, len(events), f"error event: {err.get('code')}: {str(err.get('message'))[:200]}"
            except (ValueError, KeyError, TypeError, AttributeError):
                return False, len(events), f"error event: {e[:200]!r}"
    if not events or events[-1] != b"[DONE]":
        return False, len(events), "stream ended without [DONE] and without an error event"
    return True, len(events), ""


async def one(session: aiohttp.ClientSession, url: str, model: str, max_tokens: int) -> Answer:
    out = Answer(sent=time.monotonic(), sent_unix=time.time())
    body = {"model": model, "prompt": "scale with the load", "max_tokens": max_tokens, "stream": True}
    body["ignore_eos"] = True
    data = b""
    try:
        async with session.post(url + "/v1/completions", json=body) as r:
            out.status = r.status
            out.retry_after = "Retry-After" in r.headers
            out.request_id = r.headers.get(contract.REQUEST_ID_HEADER, "")
            out.unit = r.headers.get(contract.UNIT_HEADER, "")
            if r.status != 200:
                out.error = (await r.text())[:200]
                return out
            async for piece in r.content.iter_any():
                if out.ttft_s is None and b"data: " in piece:
                    out.ttft_s = time.monotonic() - out.sent
                data += piece
            out.ok, out.events, out.error = stream_verdict(data)
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        out.error = f"{exc.__class__.__name__}: {exc}"
    out.end_s = time.monotonic() - out.sent
    if not out.ok:
        out.tail = data[-600:].decode(errors="replace")
    return out


async def ramp(url: str, model: str, steps: list[int], step_s: float, max_tokens: int) -> list[Answer]:
    """Closed-loop clients: steps[k] of them send back to back during step k."""
    answers: list[Answer] = []
    wanted = [0]

    async def client(i: int, session: aiohttp.ClientSession) -> None:
        while wanted[0] >= 0:
            if i >= wanted[0]:
                await asyncio.sleep(0.1)
                continue
            answer = await one(session, url, model, max_tokens)
            answers.append(answer)
            if answer.status == contract.BUSY_STATUS:
                await asyncio.sleep(0.5)  # what a client does with Retry-After, shortened

    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
        tasks = [asyncio.create_task(client(i, session)) for i in range(max(steps))]
        for clients in steps:
            wanted[0] = clients
            await asyncio.sleep(step_s)
        wanted[0] = -1
        await asyncio.gather(*tasks)
    return answers


def summarize(mode: str, answers: list[Answer], unit_seconds: float, extra: dict) -> dict:
    ttfts = sorted(a.ttft_s for a in answers if a.ok and a.ttft_s is not None)
    shed = [a for a in answers if a.status == contract.BUSY_STATUS]
    failed = [a for a in answers if not a.ok and a.status != contract.BUSY_STATUS]
    return {
        "mode": mode,
        "requests": len(answers),
        "answered": sum(a.ok for a in answers),
        "shed_429": len(shed),
        "shed_without_retry_after": sum(not a.retry_after for a in shed),
        "failed": len(failed),
        "failures": [asdict(a) for a in failed[:10]],
        "unit_seconds": round(unit_seconds, 1),
        "ttft_p50_s": round(pct(ttfts, 50), 3) if ttfts else None,
        "ttft_p99_s": round(pct(ttfts, 99), 3) if ttfts else None,
        **extra,
    }


def run_mode(mode: str, a: argparse.Namespace, steps: list[int], run_dir: Path) -> dict:
    state = run_dir / mode  # make local's state: its logs/, the scaler's files, local.json while it runs
    state.mkdir(parents=True, exist_ok=True)
    common = ["--model", a.model, "--nodes", str(a.nodes), "--drain-timeout", "30"]
    if mode == "scaler":
        args = [*common, "--scaler", "--units", "1", "--max-units", str(a.max_units)]
        args += ["--scaler-interval", f"{a.scaler_interval:g}"]
        args += ["--cold-start", f"{a.cold_start:g}"] if a.cold_start else []
    else:
        args = [*common, "--units", str(a.max_units)]
    launcher = Launcher(args, state)
    try:
        ready = launcher.wait_ready(timeout=900)
        answers = asyncio.run(ramp(launcher.url, a.model, steps, a.step_seconds, a.max_tokens))
        done = time.monotonic()
    finally:
        launcher.stop()
        (state / "launcher.log").write_text("".join(launcher.out))
    with (state / "answers.jsonl").open("w") as f:
        for answer in answers:
            f.write(json.dumps(asdict(answer)) + "\n")
    extra: dict = {}
    if mode == "scaler":
        lines = (state / "scaler.jsonl").read_text().splitlines() if (state / "scaler.jsonl").exists() else []
        decisions = [json.loads(line) for line in lines]
        summary = json.loads((state / "scaler-summary.json").read_text())
        unit_seconds = summary["unit_seconds"]
        extra = {"added": summary["added"], "removed": summary["removed"], "changes": len(decisions) - 1}
    else:
        unit_seconds = a.max_units * (done - ready)  # every unit up for the whole ramp
    return summarize(mode, answers, unit_seconds, extra)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.scaler.local_ramp", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--max-units", type=int, default=3)
    p.add_argument("--steps", default="1,4,12,24,24,12,4,1,1", help="clients at each step of the ramp")
    p.add_argument("--step-seconds", type=float, default=45.0)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--label", default="")
    p.add_argument("--scaler-interval", type=float, default=3.0, help="seconds between the scaler's passes")
    p.add_argument(
        "--cold-start",
        type=float,
        default=None,
        help="the scaler's cold start, which sets its hold (default: what the first unit took)",
    )
    p.add_argument(
        "--run-dir",
        default=None,
        help="where to keep the run's logs and requests (default .cache/bench-scaler-local/<UTC time>)",
    )
    # Tiny: the scaler alone on one-node tiny units, a ramp of fifteen seconds (after the flags: its
    # defaults win).
    tiny = tiny_mode(p, argv, model="tiny", nodes=1, max_units=2, steps="1,24,1", step_seconds=5.0, max_tokens=16)
    a = p.parse_args(argv)
    steps = [int(x) for x in a.steps.split(",")]
    modes = ["scaler"] if tiny else ["scaler", "static"]
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    run_dir = Path(a.run_dir) if a.run_dir else REPO / ".cache" / "bench-scaler-local" / stamp
    print(f"run directory (logs, decisions, every request): {run_dir}", flush=True)
    results = [run_mode(mode, a, steps, run_dir) for mode in modes]
    for r in results:
        print(json.dumps(r))
    bad = [r for r in results if r["failed"] or r["shed_without_retry_after"]]
    append_run(
        results_file(RESULTS, tiny),
        {
            "label": a.label,
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "load_average": os.getloadavg()[0],
            "settings": {k: v for k, v in vars(a).items() if k not in ("tiny", "run_dir")},
            "results": results,
        },
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
