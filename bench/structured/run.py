"""Per-token cost of structured output in the reference engine's sampler: the grammar mask (llguidance
bitmask fill + unpack + apply to the logits) at batch 1 and 16, against plain sampling of the same
logits. Run: `.venv/bin/python -m bench.structured.run` (writes bench/results/structured.json).

The logits are random (the model's forward pass is the same with or without a grammar, so it is left
out); each row samples at temperature 0.7 under a product-attributes JSON schema, and a row whose
document completes starts a new one, so every step measures a live matcher.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from bench.measure import cpu_model  # noqa: E402
from bench.structured.schema import SCHEMA  # noqa: E402
from runtime.engines.base import SamplingParams, StructuredOutput  # noqa: E402
from runtime.engines.grammar import Grammars  # noqa: E402
from runtime.engines.sampling import choose, make_generator  # noqa: E402
from runtime.models.registry import resolve_model  # noqa: E402

STEPS = int(os.environ.get("STEPS", "64"))
REPEATS = int(os.environ.get("REPEATS", "3"))


def measure(model: str, batch: int) -> dict:
    source = resolve_model(model)
    tok: Any = source.make_tokenizer()
    vocab = source.shape.vocab_size
    grammars = Grammars(tok, vocab)
    spec = StructuredOutput("json_schema", json.dumps(SCHEMA))
    t0 = time.perf_counter()
    grammar = grammars.grammar(spec)  # the first call also builds llguidance's view of the vocabulary
    first_compile = time.perf_counter() - t0
    t0 = time.perf_counter()
    grammar = grammars.grammar(spec)
    compile_s = time.perf_counter() - t0
    params = SamplingParams(temperature=0.7, seed=1)
    gen = make_generator(params)
    logits = torch.randn(STEPS, batch, vocab, generator=torch.Generator().manual_seed(0))
    eos = tok.eos_token_id
    plain, masked = [], []
    for rep in range(REPEATS + 1):  # the first pass warms up (first-call allocations) and is dropped
        t0 = time.perf_counter()
        for s in range(STEPS):
            for b in range(batch):
                choose(logits[s, b], params, gen)
        plain_s = (time.perf_counter() - t0) / STEPS
        matchers = [grammars.matcher(grammar) for _ in range(batch)]
        t_mask = 0.0
        t0 = time.perf_counter()
        for s in range(STEPS):
            for b in range(batch):
                m0 = time.perf_counter()
                allowed = matchers[b].allowed()
                t_mask += time.perf_counter() - m0
                token, _ = choose(logits[s, b], params, gen, allowed=allowed)
                if token == eos:
                    matchers[b] = grammars.matcher(grammar)
                    continue
                m0 = time.perf_counter()
                matchers[b].consume(token)
                t_mask += time.perf_counter() - m0
                if matchers[b].done:
                    matchers[b] = grammars.matcher(grammar)
        total = (time.perf_counter() - t0) / STEPS
        if rep:
            plain.append(plain_s)
            masked.append((total, t_mask / STEPS))
    p = statistics.median(plain)
    total, mask = sorted(masked)[len(masked) // 2]
    return {
        "model": model,
        "vocab": vocab,
        "batch": batch,
        "plain_sampling_ms_per_step": round(p * 1e3, 3),
        "structured_sampling_ms_per_step": round(total * 1e3, 3),
        "mask_build_apply_consume_ms_per_step": round(mask * 1e3, 3),
        "overhead_ms_per_token": round((total - p) / batch * 1e3, 4),
        "schema_compile_ms": round(compile_s * 1e3, 2),
        "first_compile_incl_vocabulary_s": round(first_compile, 3),
    }


def main() -> None:
    torch.set_num_threads(1)
    load_before = os.getloadavg()
    rows = [measure(m, b) for m in ("tiny", "smollm2") for b in (1, 16)]
    out = {
        "when_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "machine": f"{os.cpu_count()} cores, {platform.machine()}",
        "cpu": cpu_model(),
        "load_average_1m_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "steps": STEPS,
        "repeats": REPEATS,
        "rows": rows,
    }
    path = REPO / "bench" / "results" / "structured.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
