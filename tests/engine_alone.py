"""The reference engine by itself: one rank, in this process, one request at a time, greedy. What a
split unit must reproduce token for token, whatever happens around its requests."""

from __future__ import annotations

import asyncio
from typing import Sequence


def greedy_texts(jobs: Sequence[tuple[str, bool, int]], model: str = "tiny") -> list[str]:
    """The text each (prompt, as a chat message?, max_tokens) generates, EOS ignored."""
    import torch
    from memberships import membership

    from runtime.engines.base import GenerationRequest, SamplingParams
    from runtime.engines.reference import ReferenceEngine

    async def run() -> list[str]:
        one = membership([("127.0.0.1", 1)], unit_id="alone", revision="x", dist_port=1)
        engine = ReferenceEngine(one, model=model, threads=1)
        await engine.start()
        out = []
        try:
            for i, (text, chat, max_tokens) in enumerate(jobs):
                tok = engine.tokenizer
                ids = tok.apply_chat_template([{"role": "user", "content": text}]) if chat else tok.encode(text)
                req = GenerationRequest(
                    f"alone-{i}", tuple(ids), SamplingParams(max_tokens=max_tokens, ignore_eos=True)
                )
                out.append("".join([ev.text async for ev in engine.generate(req)]))
        finally:
            await engine.shutdown()
        return out

    # threads=1 sets torch's thread count for the whole process: give it back, or every later test
    # in this process computes on one thread (tests/leftovers.py checks it).
    threads = torch.get_num_threads()
    try:
        return asyncio.run(run())
    finally:
        torch.set_num_threads(threads)
