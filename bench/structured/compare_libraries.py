"""Per-token cost of grammar-constrained sampling with each candidate library (llguidance, xgrammar,
outlines-core): mask build + apply on SmolLM2's 49,152-token vocabulary at batch 1 and 16, against
plain sampling of the same random logits. Only llguidance is a project dependency: run this in a
throw-away virtualenv, e.g.

    python3.11 -m venv /tmp/gram-venv
    /tmp/gram-venv/bin/pip install torch==2.13.0 transformers==5.23.0 tokenizers==0.23.3 numpy==2.4.6 \\
        llguidance==1.9.1 outlines-core==0.2.14 xgrammar==0.2.8
    for lib in llguidance xgrammar outlines; do
        /tmp/gram-venv/bin/python -m bench.structured.compare_libraries $lib
    done

TOK names a converted SmolLM2 checkpoint directory (default: the node's cache under ~/.cache/flotilla).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
from transformers import PreTrainedTokenizerFast

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout, for bench.structured.schema
from bench.structured.schema import SCHEMA  # noqa: E402 - plain data, no project dependencies

torch.set_num_threads(1)
TOK = os.environ.get("TOK", os.path.expanduser("~/.cache/flotilla/smollm2-135m-instruct-fp32"))
STEPS = int(os.environ.get("STEPS", "48"))


class Lib:
    """make() a matcher; fill(matchers) -> bitmask; apply(logits, bitmask); consume(matcher, token)."""

    make: Callable[[], Any]
    fill: Callable[[list], torch.Tensor]
    apply: Callable[[torch.Tensor, torch.Tensor], None]
    consume: Callable[[Any, int], None]
    setup_s: float
    compile_s: float


def llguidance_lib(tok: PreTrainedTokenizerFast) -> Lib:
    import llguidance  # noqa: PLC0415 - each candidate library is imported only when measured
    import llguidance.hf  # noqa: PLC0415 - each candidate library is imported only when measured
    import llguidance.torch as lt  # noqa: PLC0415 - each candidate library is imported only when measured

    lib = Lib()
    t0 = time.perf_counter()
    lltok = llguidance.hf.from_tokenizer(tok)
    lib.setup_s = time.perf_counter() - t0
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(SCHEMA))
    t0 = time.perf_counter()
    llguidance.LLMatcher(lltok, grammar)
    lib.compile_s = time.perf_counter() - t0
    masks: dict[int, torch.Tensor] = {}

    def fill(ms: list) -> torch.Tensor:
        bm = masks.setdefault(len(ms), lt.allocate_token_bitmask(len(ms), lltok.vocab_size))
        for i, m in enumerate(ms):
            lt.fill_next_token_bitmask(m, bm, i)
        return bm

    lib.make = lambda: llguidance.LLMatcher(lltok, grammar)
    lib.fill = fill
    lib.apply = lambda lg, bm: lt.apply_token_bitmask_inplace(lg, bm[:, : (lg.shape[1] + 31) // 32])
    lib.consume = lambda m, t: m.consume_token(t)
    return lib


def xgrammar_lib(tok: PreTrainedTokenizerFast) -> Lib:
    import xgrammar as xgr  # type: ignore[import-not-found]  # noqa: PLC0415 - each candidate library is imported only when measured

    lib = Lib()
    vocab = len(tok)
    t0 = time.perf_counter()
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=vocab)
    lib.setup_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    compiled = xgr.GrammarCompiler(info, max_threads=1).compile_json_schema(json.dumps(SCHEMA))
    lib.compile_s = time.perf_counter() - t0
    masks: dict[int, torch.Tensor] = {}

    def fill(ms: list) -> torch.Tensor:
        bm = masks.setdefault(len(ms), xgr.allocate_token_bitmask(len(ms), vocab))
        for i, m in enumerate(ms):
            m.fill_next_token_bitmask(bm, i)
        return bm

    lib.make = lambda: xgr.GrammarMatcher(compiled)
    lib.fill = fill
    lib.apply = xgr.apply_token_bitmask_inplace
    lib.consume = lambda m, t: m.accept_token(t)
    return lib


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet back to bytes (SmolLM2's BPE spells tokens in it)."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def outlines_lib(tok: PreTrainedTokenizerFast) -> Lib:
    from outlines_core import Guide, Index, Vocabulary  # type: ignore[import-not-found]  # noqa: PLC0415 - each candidate library is imported only when measured
    from outlines_core.json_schema import build_regex_from_schema  # type: ignore[import-not-found]  # noqa: PLC0415 - each candidate library is imported only when measured
    from outlines_core.kernels.torch import allocate_token_bitmask, apply_token_bitmask_inplace, fill_next_token_bitmask  # type: ignore[import-not-found]  # noqa: PLC0415 - each candidate library is imported only when measured

    lib = Lib()
    vocab = len(tok)
    dec = _byte_decoder()
    t0 = time.perf_counter()
    tokens: dict[bytes, list[int]] = {}
    for text, i in tok.get_vocab().items():
        if i in tok.all_special_ids:
            continue
        raw = bytes(dec[c] for c in text) if all(c in dec for c in text) else text.encode()
        tokens.setdefault(raw, []).append(i)
    voc = Vocabulary(tok.eos_token_id, tokens)
    lib.setup_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    index = Index(build_regex_from_schema(json.dumps(SCHEMA)), voc)
    lib.compile_s = time.perf_counter() - t0
    masks: dict[int, torch.Tensor] = {}

    def fill(ms: list) -> torch.Tensor:
        bm = masks.setdefault(len(ms), allocate_token_bitmask(vocab).repeat(len(ms), 1))
        for i, m in enumerate(ms):
            fill_next_token_bitmask(m, bm[i : i + 1])
        return bm

    lib.make = lambda: Guide(index)
    lib.fill = fill
    lib.apply = apply_token_bitmask_inplace
    lib.consume = lambda m, t: m.advance(t)
    return lib


def run(lib: Lib, tok: PreTrainedTokenizerFast, logits: torch.Tensor, batch: int) -> tuple[float, float, int]:
    """(mask build + apply s per step, whole constrained step s, documents finished)."""
    g = torch.Generator().manual_seed(1)
    ms = [lib.make() for _ in range(batch)]
    t_mask = t_rest = 0.0
    finished = 0
    for s in range(STEPS):
        lg = logits[s, :batch].clone()
        t0 = time.perf_counter()
        lib.apply(lg, lib.fill(ms))
        t1 = time.perf_counter()
        for b in range(batch):
            t = int(torch.multinomial(torch.softmax(lg[b].double() / 0.7, -1), 1, generator=g))
            if t == tok.eos_token_id:
                ms[b] = lib.make()
                finished += 1
            else:
                lib.consume(ms[b], t)
        t_mask += t1 - t0
        t_rest += time.perf_counter() - t1
    return t_mask / STEPS, (t_mask + t_rest) / STEPS, finished


def plain(logits: torch.Tensor, batch: int) -> float:
    g = torch.Generator().manual_seed(1)
    t0 = time.perf_counter()
    for s in range(STEPS):
        for b in range(batch):
            torch.multinomial(torch.softmax(logits[s, b].double() / 0.7, -1), 1, generator=g)
    return (time.perf_counter() - t0) / STEPS


def main() -> None:
    tok = PreTrainedTokenizerFast.from_pretrained(TOK)
    lib = {"llguidance": llguidance_lib, "xgrammar": xgrammar_lib, "outlines": outlines_lib}[sys.argv[1]](tok)
    logits = torch.randn(STEPS, 16, len(tok), generator=torch.Generator().manual_seed(0))
    run(lib, tok, logits, 1)
    run(lib, tok, logits, 16)  # warm-up: first-call kernels (llguidance's apply compiles once)
    out: dict[str, Any] = {
        "lib": sys.argv[1],
        "vocab": len(tok),
        "tokenizer_setup_s": round(lib.setup_s, 3),
        "schema_compile_s": round(lib.compile_s, 4),
        "load_average_1m": round(os.getloadavg()[0], 2),
    }
    for batch in (1, 16):
        mask, total, done = run(lib, tok, logits, batch)
        out[f"batch{batch}"] = {
            "mask_build_apply_ms": round(mask * 1e3, 3),
            "plain_sampling_ms": round(plain(logits, batch) * 1e3, 3),
            "constrained_step_ms": round(total * 1e3, 3),
            "documents_finished": done,
        }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
