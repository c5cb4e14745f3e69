"""Choosing a unit's prefill and decode strategies by measuring them at formation.

With a strategy set to `auto` the ranks load the weights of both layouts; the leader then times
every candidate pair on this unit (one prompt's time to first token, then decode steps at batch 1
and at a small batch), keeps the pair with the lowest latency for one request, and drops the other
layout's weights. The figures behind the choice go to the log, the ready body and `plan --calibrate`.
"""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Iterator

import contract
from contract import Strategy
from runtime.engines.executor import ShardExecutor, StepCommand
from runtime.engines.layout import STRATEGIES

log = logging.getLogger("flotilla.engine")

AUTO = contract.AUTO_STRATEGY
PROMPT_TOKENS = 96  # a chat turn with some context
NEW_TOKENS = 32  # the answer the latency objective assumes
BATCH = 8  # the small batch whose step time is reported (throughput under load)
DECODE_STEPS = 4
REPEATS = 2


@dataclass
class PairFigures:
    ttft_ms: float  # prefill of PROMPT_TOKENS (and the KV re-shard when the strategies differ)
    tpot_ms: float  # one decode step at batch 1
    step_ms_batch: float  # one decode step at batch BATCH
    latency_ms: float  # ttft + (NEW_TOKENS - 1) x tpot: what the choice minimises


@dataclass
class Calibration:
    prefill: str
    decode: str
    chosen_by: str  # calibration | setting | single rank
    transport: str
    figures: dict[str, PairFigures] = field(default_factory=dict)  # "prefill/decode" -> figures

    def as_dict(self) -> dict:
        return {
            "prefill": self.prefill,
            "decode": self.decode,
            "chosen_by": self.chosen_by,
            "transport": self.transport,
            "objective": f"TTFT of a {PROMPT_TOKENS}-token prompt + {NEW_TOKENS - 1} decode steps at batch 1",
            "figures": {k: asdict(v) for k, v in self.figures.items()},
        }

    def describe(self) -> str:
        lines = [
            f"strategies: prefill={self.prefill}, decode={self.decode} (chosen by {self.chosen_by}; "
            f"collectives over {self.transport})"
        ]
        if self.figures:
            lines.append(
                f"  prefill/decode      TTFT ms ({PROMPT_TOKENS} tok)  TPOT ms (batch 1)  "
                f"step ms (batch {BATCH})  latency ms ({NEW_TOKENS} tok)"
            )
            for pair, f in sorted(self.figures.items(), key=lambda kv: kv[1].latency_ms):
                mark = "  <- chosen" if pair == f"{self.prefill}/{self.decode}" else ""
                lines.append(
                    f"  {pair:18s}  {f.ttft_ms:21.1f}  {f.tpot_ms:17.1f}  {f.step_ms_batch:16.1f}  "
                    f"{f.latency_ms:18.1f}{mark}"
                )
        return "\n".join(lines)


def loading_pair(prefill: str, decode: str) -> tuple[str, str]:
    """The concrete pair whose weights a rank loads: both layouts when either strategy is auto."""

    def other(s: str) -> str:
        return Strategy.TENSOR if s == Strategy.PIPELINE else Strategy.PIPELINE

    if prefill == AUTO and decode == AUTO:
        return Strategy.PIPELINE, Strategy.TENSOR
    if prefill == AUTO:
        return other(decode), decode
    if decode == AUTO:
        return prefill, other(prefill)
    return prefill, decode


def candidates(prefill: str, decode: str) -> list[tuple[str, str]]:
    return [
        (p, d)
        for p in (STRATEGIES if prefill == AUTO else (prefill,))
        for d in (STRATEGIES if decode == AUTO else (decode,))
    ]


def _prompt(n: int, vocab: int, salt: int) -> list[int]:
    # Deterministic ids spread over the vocabulary; the values do not change the timings.
    return [(7919 * (i + 1) + 104729 * salt) % vocab for i in range(n)]


def _time_pair(executor: ShardExecutor, seq_ids: Iterator[int], vocab: int) -> PairFigures:
    clock = time.perf_counter
    seq = next(seq_ids)
    prompt = _prompt(PROMPT_TOKENS, vocab, 0)
    capacity = PROMPT_TOKENS + DECODE_STEPS + 1
    t0 = clock()
    result = executor.leader_step(StepCommand(prefill=[(seq, PROMPT_TOKENS, capacity)], prefill_tokens=[prompt]))
    ttft = clock() - t0
    assert result.prefill_logits is not None  # rank 0 always gets them
    token = int(result.prefill_logits[0].argmax())
    steps = []
    for _ in range(DECODE_STEPS):
        t0 = clock()
        result = executor.leader_step(StepCommand(decode=[seq], decode_tokens=[token]))
        steps.append(clock() - t0)
        assert result.decode_logits is not None
        token = int(result.decode_logits[0].argmax())
    batch = [next(seq_ids) for _ in range(BATCH)]
    short = 16
    executor.leader_step(
        StepCommand(
            free=[seq],
            prefill=[(s, short, short + DECODE_STEPS + 1) for s in batch],
            prefill_tokens=[_prompt(short, vocab, i + 1) for i in range(BATCH)],
        )
    )
    batch_steps = []
    for _ in range(DECODE_STEPS):
        t0 = clock()
        executor.leader_step(StepCommand(decode=batch, decode_tokens=[1] * BATCH))
        batch_steps.append(clock() - t0)
    executor.leader_step(StepCommand(free=batch))
    tpot = statistics.median(steps)
    return PairFigures(
        ttft_ms=1e3 * ttft,
        tpot_ms=1e3 * tpot,
        step_ms_batch=1e3 * statistics.median(batch_steps),
        latency_ms=1e3 * (ttft + (NEW_TOKENS - 1) * tpot),
    )


def calibrate(
    executor: ShardExecutor, *, prefill: str, decode: str, seq_ids: Iterator[int], transport: str
) -> Calibration:
    """Rank 0, after the warm-up, with no sequence held: time the candidate pairs (REPEATS rounds,
    interleaved, best of each) and leave every rank on the fastest one."""
    vocab = executor.shape.vocab_size
    pairs = candidates(prefill, decode)
    best: dict[str, PairFigures] = {}
    for _ in range(REPEATS):
        for p, d in pairs:
            executor.leader_set_strategies(p, d)
            figures = _time_pair(executor, seq_ids, vocab)
            key = f"{p}/{d}"
            old = best.get(key)
            if old is None or figures.latency_ms < old.latency_ms:
                best[key] = figures
    chosen = min(best, key=lambda k: best[k].latency_ms)
    p, d = chosen.split("/")
    executor.leader_set_strategies(p, d, final=True)
    result = Calibration(prefill=p, decode=d, chosen_by="calibration", transport=transport, figures=best)
    log.info("calibrated at formation:\n%s", result.describe())
    return result
