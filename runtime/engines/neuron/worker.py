"""Follower loop of a multi-node Neuron unit: build the same engine as the leader, then execute.

Runs only inside the Neuron container (Dockerfile.neuron): rank 0 serves vLLM's API and broadcasts
each step's inputs over gloo; every follower builds an identical engine from the same arguments
and loops on execute-model. NOT RUN ON TRAINIUM YET: see docs/runbooks/trainium-smoke-test.md.
"""

from __future__ import annotations

import os
import sys


def main(argv: list[str] | None = None) -> int:
    rank = os.environ.get("NEURON_RANK_ID", "")
    if not rank.isdigit() or int(rank) == 0:
        print(
            f"error: NEURON_RANK_ID={rank!r}: the follower loop runs on ranks 1..N-1; rank 0 "
            "runs the vLLM API server (see `python -m runtime plan --engine neuron`)",
            file=sys.stderr,
        )
        return 2
    try:
        from vllm.engine.arg_utils import EngineArgs  # noqa: PLC0415 - vLLM exists only in the neuron image
        from vllm.engine.llm_engine import LLMEngine  # noqa: PLC0415 - vLLM exists only in the neuron image
        from vllm.utils import FlexibleArgumentParser  # noqa: PLC0415 - vLLM exists only in the neuron image
    except ImportError as exc:
        print(
            f"error: vLLM is not importable ({exc}); the follower loop runs inside the Neuron "
            "image built from runtime/Dockerfile.neuron",
            file=sys.stderr,
        )
        return 2
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser(prog="neuron-follower"))
    engine = LLMEngine.from_engine_args(EngineArgs.from_cli_args(parser.parse_args(argv)))
    worker = engine.model_executor.driver_worker
    while True:  # ends when the leader goes away: the collective raises and the process exits
        worker.execute_model()


if __name__ == "__main__":
    sys.exit(main())
