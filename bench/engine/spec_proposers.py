"""Which proposer the reference engine's speculative decoding uses, measured: prompt lookup against the
model's own first layers (early exit), on SmolLM2's greedy answers to both benchmark workloads.

`python bench/engine/spec_proposers.py [--tiny] [--max-tokens N] [--sweep]`. For every position of each answer it
counts the draft tokens a proposer would have had accepted (the run of its proposals that equal the
model's own next tokens, at most k): deterministic counts, the same on any machine. Costs are CPU time
(time.process_time, one thread): a forward of 1 + k rows against one of 1 row at the same context, and
a draft token of the first m layers plus the LM head; CPU time, not wall-clock, because the machines
this was written on were shared. A smaller draft model is not measured: the only other model the
project ships (`tiny`) has random weights and a 256-token vocabulary, not SmolLM2's. Results:
bench/results/spec_proposers.json; docs/engine.md says what was decided from them.

--sweep: prompt lookup's settings instead (draft tokens k, shortest and longest n-gram), replayed on the
same greedy answers: tokens per step, acceptance, and the decode speed-up predicted from the CPU time of
a step of 1 + d rows for each step's draft length d; and each workload's quote share, the share of its
answer tokens that sit in a run of 4 or more tokens found in its prompt (what the workload is: answers
that quote their prompts or not). Results: bench/results/spec_sweep.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
# This folder's bench.py would shadow the bench folder that bench.engine.shopping is in.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

from bench.engine.shopping import comparing_messages, free_messages, quoting_messages  # noqa: E402
from bench.measure import cpu_model  # noqa: E402
from runtime.engines.llama import Segment, UnsplitLlama, decoder_layer, positions_of  # noqa: E402
from runtime.engines.speculative import Lookup  # noqa: E402
from runtime.models import resolve_model  # noqa: E402

K = 4  # draft tokens per step, the engine's default
EXIT_LAYERS = (4, 8, 15)
SWEEP_K = (2, 4, 6, 8, 12)
QUOTE_RUN = 4  # tokens: a shorter common run is as often a phrase ("of the") as a quote
SWEEP_NGRAMS = ((1, 3), (1, 4), (2, 4), (2, 6), (3, 5))


def greedy(m: UnsplitLlama, prompt: list[int], n: int) -> list[int]:
    kv = m.new_kv(len(prompt) + n + 1)
    tok = int(m.forward(prompt, kv).argmax())
    out = [tok]
    for _ in range(n - 1):
        tok = int(m.forward([tok], kv).argmax())
        out.append(tok)
    return out


def quote_share(prompt: list[int], answer: list[int], run: int = QUOTE_RUN) -> float:
    """The share of the answer's tokens inside a run of at least `run` tokens that occurs in the prompt."""
    grams = {tuple(prompt[i : i + run]) for i in range(len(prompt) - run + 1)}
    quoted = [False] * len(answer)
    for i in range(len(answer) - run + 1):
        if tuple(answer[i : i + run]) in grams:
            quoted[i : i + run] = [True] * run
    return sum(quoted) / max(1, len(answer))


def run_lengths(match: list[bool], k: int) -> list[int]:
    """At each position, how many consecutive matches start there (at most k)."""
    out = []
    for t in range(len(match)):
        n = 0
        while n < k and t + n < len(match) and match[t + n]:
            n += 1
        out.append(n)
    return out


def replay(prompt: list[int], answer: list[int], k: int, min_n: int = 2, max_n: int = 4) -> list[tuple[int, int]]:
    """Each decode step's (draft length, draft tokens kept) replaying the greedy answer with prompt lookup."""
    look = Lookup(prompt, min_n, max_n)
    steps = []
    t = 1  # the first answer token comes from the prefill
    while t < len(answer):
        draft = look.propose(answer[:t], min(k, len(answer) - t))
        kept = 0
        for d, want in zip(draft, answer[t:]):
            if d != want:
                break
            kept += 1
        steps.append((len(draft), kept))
        t += kept + 1
    return steps


def lookup_accepted(prompt: list[int], answer: list[int], k: int) -> tuple[int, int, int]:
    """(steps that proposed, draft tokens proposed, draft tokens accepted) replaying the answer."""
    steps = [s for s in replay(prompt, answer, k) if s[0]]
    return len(steps), sum(s[0] for s in steps), sum(s[1] for s in steps)


def row_costs(m: UnsplitLlama, context: int, most: int) -> list[float]:
    """CPU ms of a decode step of 1..most rows at `context` positions (index r - 1 for r rows)."""
    kv = m.new_kv(context + most + 1)
    m.forward(list(range(1, context + 1)), kv)

    def step(rows: int):
        kv.length = context
        m.forward(list(range(1, rows + 1)), kv)

    return [cpu_ms(lambda r=r: step(r)) for r in range(1, most + 1)]


def sweep(m: UnsplitLlama, workloads: dict[str, tuple[list[list[int]], list[list[int]]]]) -> dict:
    """Prompt lookup's settings on the same greedy answers: tokens per step and acceptance (exact
    counts), and the speed-up the per-row CPU costs predict (answer tokens at one row a step against
    the steps taken, each costing a step of 1 + its draft's rows)."""
    costs = row_costs(m, 400, 1 + max(SWEEP_K))
    out: dict = {"cpu_ms_by_rows": [round(c, 2) for c in costs], "settings": [], "quote_share": {}}
    for name, (prompts, answers) in workloads.items():
        shares = [quote_share(p, a) for p, a in zip(prompts, answers)]
        out["quote_share"][name] = {"mean": round(sum(shares) / len(shares), 3), "each": [round(x, 3) for x in shares]}
    print(json.dumps(out["quote_share"]), flush=True)
    for k in SWEEP_K:
        for lo, hi in SWEEP_NGRAMS:
            row: dict = {"k": k, "min_ngram": lo, "max_ngram": hi}
            for name, (prompts, answers) in workloads.items():
                steps = [s for p, a in zip(prompts, answers) for s in replay(p, a, k, lo, hi)]
                tokens = sum(len(a) - 1 for a in answers)
                drafted, kept = sum(s[0] for s in steps), sum(s[1] for s in steps)
                spent = sum(costs[d] for d, _ in steps)
                row[name] = {
                    "tokens_per_step": round(tokens / len(steps), 3),
                    "acceptance": round(kept / drafted, 3) if drafted else 0.0,
                    "predicted_speedup": round(tokens * costs[0] / spent, 3),
                }
            out["settings"].append(row)
            print(json.dumps(row), flush=True)
    return out


def early_exit_matches(m: UnsplitLlama, prompt: list[int], answer: list[int], layers: int) -> list[bool]:
    """Teacher-forced: whether the first `layers` layers + final norm + LM head predict each answer token."""
    ids = prompt + answer
    kv = m.new_kv(len(ids))
    seg = Segment(kv=kv, start=0, n=len(ids))
    x = m.head.embed[torch.tensor(ids)]
    cos, sin = m.rope(positions_of([seg]), len(ids))
    for n in range(layers):
        x = decoder_layer(m.shape, n, m.layers[n], x, [seg], cos, sin)
    pred = m.head.logits(m.shape, x).argmax(-1).tolist()
    # position len(prompt) - 1 + i predicts answer[i]; the first answer token comes from the prefill
    return [pred[len(prompt) - 1 + i] == answer[i] for i in range(1, len(answer))]


def cpu_ms(fn, repeats: int = 5) -> float:
    best = float("inf")
    for _ in range(repeats):
        t = time.process_time()
        fn()
        best = min(best, time.process_time() - t)
    return best * 1000


def costs(m: UnsplitLlama, context: int) -> dict:
    """CPU ms of a decode step of 1 row and of 1 + K rows at `context` positions, and of one early-exit
    draft token per exit depth (its layers at 1 row, then the LM head)."""
    kv = m.new_kv(context + K + 2)
    m.forward(list(range(1, context + 1)), kv)

    def step(rows: int):
        kv.length = context
        m.forward(list(range(1, rows + 1)), kv)

    out = {"step_1_row_ms": cpu_ms(lambda: step(1)), f"step_{1 + K}_rows_ms": cpu_ms(lambda: step(1 + K))}
    x = m.head.embed[torch.tensor([1])]
    seg = Segment(kv=kv, start=context, n=1)
    cos, sin = m.rope(positions_of([seg]), context + 1)

    def exit_draft(layers: int):
        h = x
        for n in range(layers):
            h = decoder_layer(m.shape, n, m.layers[n], h, [seg], cos, sin)
        m.head.logits(m.shape, h)

    for layers in EXIT_LAYERS:
        out[f"early_exit_{layers}_layers_draft_token_ms"] = cpu_ms(lambda layers=layers: exit_draft(layers))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="two prompts of each workload, 24 tokens: a check that it runs")
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--sweep", action="store_true", help="prompt lookup's settings, not the proposers")
    args = ap.parse_args()
    torch.set_num_threads(1)
    load = os.getloadavg()[0]
    src = resolve_model("smollm2")
    m = UnsplitLlama(src.shape, src.weights)
    tok: Any = src.make_tokenizer()
    n = 24 if args.tiny else args.max_tokens
    result: dict = {"k": K, "max_tokens": n, "workloads": {}}
    replays: dict = {}
    named = (("quoting", quoting_messages()), ("comparing", comparing_messages()), ("free", free_messages()))
    for name, messages in named:
        chosen = messages[:2] if args.tiny else messages
        prompts = [tok.apply_chat_template(msgs) for msgs in chosen]
        answers = [greedy(m, p, n) for p in prompts]
        replays[name] = (prompts, answers)
        if args.sweep:
            continue
        w: dict = {"prompts": len(prompts), "answer_tokens": sum(len(a) for a in answers)}
        prop = [lookup_accepted(p, a, K) for p, a in zip(prompts, answers)]
        w["lookup"] = {
            "steps_proposing": sum(p[0] for p in prop),
            "draft_tokens": sum(p[1] for p in prop),
            "accepted": sum(p[2] for p in prop),
        }
        for layers in EXIT_LAYERS:
            runs = [x for p, a in zip(prompts, answers) for x in run_lengths(early_exit_matches(m, p, a, layers), K)]
            w[f"early_exit_{layers}"] = {"positions": len(runs), "mean_accepted_of_k": sum(runs) / max(1, len(runs))}
        result["workloads"][name] = w
        print(name, json.dumps(w), flush=True)
    if args.sweep:
        found = {"max_tokens": n, "cpu_model": cpu_model(), "load_average_at_start": load, **sweep(m, replays)}
        if not args.tiny:
            (REPO / "bench" / "results" / "spec_sweep.json").write_text(json.dumps(found, indent=1) + "\n")
        return
    result["cpu_costs"] = costs(m, 400)
    print(json.dumps(result["cpu_costs"]), flush=True)
    if not args.tiny:
        (REPO / "bench" / "results" / "spec_proposers.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
