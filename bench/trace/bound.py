"""The lowest TTFT any router could give the replayed requests on these units, from a replay's records:
how far a policy's median is from what the cache allows, and how much of the rest is queueing.

Run: `python -m bench.trace.bound --records DIR [the replay's scaling flags]`, DIR being a
`bench/trace/replay.py --records DIR` run's (one `POLICY-RATE.jsonl` per run) and the flags the ones
that run was given (`--requests`, `--seed`, `--no-resend`, ...: the requests are drawn again and each
record's prompt size checked against them).

- The prefill line: a request's TTFT on a unit with nothing ahead of it is about a + b x the prompt
  tokens its cache lacks. a and b are fitted to the lower edge of the lightest rate's records: least
  squares through the fastest answer of each class of uncached sizes one scaled block wide (prompts
  are whole blocks; an answer above the edge waited for another's prefill or step).
- A policy's own line: the median, over its answered requests, of the line at the tokens its unit had
  not cached (usage.prompt_tokens_details.cached_tokens): its TTFT without any queueing.
- The floor: the median of the line at the tokens the oracle (one infinite cache) had not cached:
  every hit found and nothing queued. No router does better; its ratio to least_requests' measured
  median bounds the p50 ratio any policy can reach at that rate.
- What each answer waited for: its TTFT above the line, by what the host was doing while it waited
  for its first token: nothing else ("alone": the line's own scatter, since the line is an edge and a
  typical lone answer sits above it), only other units (the units share the host's cores), its own
  unit serving others, none of them sent before it and still before their first token ("its unit
  busy"), or its own unit still prefilling a request sent before it ("behind a prefill"). A request
  runs from its send to about its first token plus TPOT x (max_tokens - 1): the replay ignores EOS.
  The lone answers' median at the lightest rate added to the floor is a typical answer's floor.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
from bench.measure import cpu_model  # noqa: E402
from bench.trace import replay  # noqa: E402
from bench.trace.replay import answered, oracle_reuse, quantile  # noqa: E402


def prefill_line(points: list[tuple[int, float]], width: int) -> tuple[float, float]:
    """(a, b) of TTFT ~ a + b x uncached tokens along the lower edge of (uncached tokens, TTFT) points:
    least squares through the fastest answer of each `width`-token size class. An answer above the
    edge waited behind other work, which a fit through all of them would count as prefill."""
    fastest: dict[int, tuple[int, float]] = {}
    for x, y in points:
        c = x // width
        if c not in fastest or y < fastest[c][1]:
            fastest[c] = (x, y)
    pts = list(fastest.values())
    n = len(pts)
    if n < 2:
        raise ValueError(f"answers in {n} class(es) of uncached prompt sizes: a line needs two")
    mx = sum(x for x, _ in pts) / n
    my = sum(y for _, y in pts) / n
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    b = sum((x - mx) * (y - my) for x, y in pts) / sxx  # two classes: two distinct sizes, sxx > 0
    return my - b * mx, b


def read_records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def median(xs) -> float:
    """The replay's own median (nearest rank), so that figures match its result lines."""
    m = quantile(sorted(xs), 0.5)
    assert m is not None, "no answered requests"
    return m


WAITS = ("alone", "other units busy", "its unit busy", "behind a prefill")


def waits(recs: list[dict], requests: list[replay.Scaled], line: tuple[float, float]) -> dict[str, list[float]]:
    """Each answered request's TTFT above the line (seconds), by what the host was doing while it waited
    for its first token (WAITS, the module's docstring). Records align with requests by position."""
    spans = []
    for r, q in zip(recs, requests):
        if r["status"] == 200 and r["ttft_s"] is not None:
            first = r["sent_s"] + r["ttft_s"]
            spans.append((r, first, first + (r["tpot_s"] or 0.0) * (q.max_tokens - 1)))
    out: dict[str, list[float]] = {w: [] for w in WAITS}
    for r, first, _ in spans:
        sent = r["sent_s"]
        busy = [(o, o_first) for o, o_first, o_end in spans if o is not r and o["sent_s"] < first and o_end > sent]
        mine = [(o, o_first) for o, o_first in busy if o["unit"] == r["unit"]]
        if any(o["sent_s"] < sent < o_first for o, o_first in mine):
            kind = "behind a prefill"
        elif mine:
            kind = "its unit busy"
        else:
            kind = "other units busy" if busy else "alone"
        out[kind].append(r["ttft_s"] - (line[0] + line[1] * (r["prompt_tokens"] - r["cached"])))
    return out


def ms(seconds: float) -> str:
    """Milliseconds to the nearest one, without the "-0" of a float a hair below zero."""
    return f"{round(1000 * seconds):,}"


def main(argv: list[str] | None = None) -> int:
    ap = replay.parser(argv)
    ap.description = __doc__.splitlines()[0]
    a = ap.parse_args(argv)
    if not a.records:
        ap.error("--records: give the directory a replay run wrote with --records")
    runs: dict[tuple[str, float], list[dict]] = {}
    for path in sorted(Path(a.records).glob("*.jsonl")):
        policy, _, rate_text = path.stem.rpartition("-")
        try:
            runs[(policy, float(rate_text))] = read_records(path)
        except ValueError:
            ap.error(f"--records {a.records}: {path.name} is not POLICY-RATE.jsonl of JSON lines")
    if not runs:
        ap.error(f"--records {a.records}: no POLICY-RATE.jsonl records there")
    requests = replay.scale(
        replay.selected_rows(ap, a),
        block_tokens=a.block_tokens,
        max_input=a.max_input_tokens,
        max_output=a.max_output_tokens,
        rate=1.0,  # the oracle's reuse does not depend on the rate
        vocab=a.vocab,
        resend=a.resend,
    )
    for (policy, rate), recs in runs.items():
        sizes = [r["prompt_tokens"] for r in recs]
        if sizes != [len(q.prompt) for q in requests]:
            ap.error(
                f"--records {a.records}: {policy} at {rate:g} req/s did not replay these requests; "
                "give the flags its run was given (--requests, --seed, --resend or --no-resend, ...)"
            )
    lightest = min(rate for _, rate in runs)
    points = [
        (r["prompt_tokens"] - r["cached"], r["ttft_s"])
        for (_, rate), recs in runs.items()
        if rate == lightest
        for r in answered(recs)
    ]
    try:
        line_a, line_b = prefill_line(points, a.block_tokens)
    except ValueError as exc:
        ap.error(f"--records {a.records}: at {lightest:g} req/s, {exc}; give runs with more answers")
    floor = median(line_a + line_b * (t - h) for h, t in oracle_reuse(requests, a.block_tokens))
    by_run = {
        run: waits(recs, requests, (line_a, line_b))
        for run, recs in runs.items()
        if all("sent_s" in r and "unit" in r for r in answered(recs))
    }
    lone = [x for (_, rate), by in by_run.items() if rate == lightest for x in by["alone"]]
    scatter = median(lone) if lone else None
    print(
        f"{cpu_model()}: prefill line {1000 * line_a:.0f} ms + {1000 * line_b:.2f} ms per uncached token "
        f"(fitted at {lightest:g} req/s, {len(points)} answers); floor p50 (every oracle hit, no queueing) "
        f"{ms(floor)} ms"
    )
    if scatter is not None:
        print(
            f"answers alone on the host at {lightest:g} req/s sit a median {ms(scatter)} ms above the line "
            f"({len(lone)} answers): a typical answer's floor is {ms(floor + scatter)} ms"
        )
    print()
    print(
        "| rate (req/s) | policy | TTFT p50 (ms) | / least_requests' | its line's p50 (no queueing) | p50 above its "
        "line's p50 | its line above the floor (hits missed) | floor / least_requests' p50 | typical floor / "
        "least_requests' p50 |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for rate in sorted({rate for _, rate in runs}):
        base = answered(runs.get(("least_requests", rate), []))
        base_p50 = median(r["ttft_s"] for r in base) if base else None
        for (policy, r_), recs in sorted(runs.items(), key=lambda kv: kv[0][0] != "least_requests"):
            if r_ != rate:
                continue
            ok = answered(recs)
            if not ok:
                print(f"| {rate:g} | {policy} | no request answered | | | | | | |")
                continue
            p50 = median(r["ttft_s"] for r in ok)
            own = median(line_a + line_b * (r["prompt_tokens"] - r["cached"]) for r in ok)
            vs = f"{p50 / base_p50:.2f} x" if base_p50 else ""
            bound = typical = ""
            if base_p50 and policy == "least_requests":
                bound = f"{floor / base_p50:.2f} x"
                typical = f"{(floor + scatter) / base_p50:.2f} x" if scatter is not None else ""
            print(
                f"| {rate:g} | {policy} | {ms(p50)} | {vs} | {ms(own)} | {ms(p50 - own)} | "
                f"{ms(own - floor)} | {bound} | {typical} |"
            )
    print()
    print(
        "What each answer waited for: its TTFT above the line, median ms (answers), by what the host was "
        "doing while it waited for its first token"
    )
    print()
    print("| rate (req/s) | policy | " + " | ".join(WAITS) + " | every answer |")
    print("|---|---|" + "---|" * (len(WAITS) + 1))
    for (policy, rate), recs in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][0] != "least_requests")):
        by = by_run.get((policy, rate))
        if by is None:
            print(f"| {rate:g} | {policy} | records without sent_s or unit: no breakdown |" + " |" * len(WAITS))
            continue
        cells = [f"{ms(median(by[w]))} ({len(by[w])})" if by[w] else "- (0)" for w in WAITS]
        every = [x for w in WAITS for x in by[w]]
        whole = f"{ms(median(every))} ({len(every)})" if every else "- (0)"
        print(f"| {rate:g} | {policy} | " + " | ".join(cells) + f" | {whole} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
