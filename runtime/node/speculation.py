"""A member's speculative decoding (docs/engine.md): its settings, read from the variables the stacks
set (contract.speculation, checked at start with the deployment config's rules), and what a leader says
of it: the figures of its ready body, and one CloudWatch EMF line a minute for the dashboard (acceptance
over the minute, tokens a decoding answer gained per step), written only while the engine drafts."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import contract.speculation as spec
from contract.bad_input import BadInput
from contract.speculation import Speculation
from runtime import emf
from runtime.node import engine_protocol


def speculation_from_env(env: Mapping[str, str], s: Any) -> Speculation:
    """The member's speculation from FLOTILLA_SPECULATIVE_*, refused (BadInput naming the variable) where
    its engine could not run it; `s`: the member's NodeSettings."""
    found = Speculation.from_environment(env)
    names = {
        "speculation.method": spec.ENV_SPECULATIVE_METHOD,
        "speculation.num_speculative_tokens": spec.ENV_SPECULATIVE_TOKENS,
        "speculation.draft": spec.ENV_SPECULATIVE_DRAFT,
    }
    n = s.neuron
    try:
        found.check(
            engine=s.engine,
            nodes=s.world_size,
            neuron_sampling=n.sampling if n is not None else "",
            prefix_caching_block=n.prefix_caching_block if n is not None else 0,
        )
    except BadInput as e:
        raise BadInput(names.get(e.name, e.name), e.value, e.problem, e.fix, text=True) from None
    return found.model_copy(update={"draft": found.draft_dir})


EMF_EVERY_S = 60.0


def speculation_report(ld: engine_protocol.Load) -> dict[str, Any]:
    """The ready body's speculation figures (handshake.Load) from the engine's last load report."""
    drafted, kept = int(ld.spec_draft_tokens), int(ld.spec_accepted_tokens)
    return {
        "spec_draft_tokens": drafted,
        "spec_accepted_tokens": kept,
        "spec_acceptance_rate": round(kept / drafted, 4) if drafted else 0.0,
        "tokens_per_step": float(ld.tokens_per_step),
    }


class SpeculationLine:
    """The leader's minute line: draft tokens kept of those verified since the last line, and the
    engine's recent tokens per step. Nothing while no draft was verified (speculation off, or switched
    off by the engine for the whole minute: a batch too large, drafts rejected)."""

    def __init__(self, every_s: float = EMF_EVERY_S) -> None:
        self.every_s = every_s
        self._last = (0, 0)  # the engine's counts at the last line
        self._at = time.monotonic()

    def tick(self, ld: engine_protocol.Load, cell: str, now: float | None = None) -> str | None:
        """The line to write now, or None; `now` is time.monotonic()."""
        now = time.monotonic() if now is None else now
        if now - self._at < self.every_s:
            return None
        self._at = now
        drafted, kept = int(ld.spec_draft_tokens), int(ld.spec_accepted_tokens)
        d0, k0 = self._last
        if drafted < d0 or kept < k0:  # a new engine process: its counts start again at 0
            d0 = k0 = 0
        self._last = (drafted, kept)
        if drafted == d0:
            return None
        return emf.speculation_line(
            acceptance_pct=100.0 * (kept - k0) / (drafted - d0), tokens_per_step=float(ld.tokens_per_step), cell=cell
        )
