"""Follower of a multi-node Neuron unit: what the V0 fork's examples/neuron/multi_node/worker.py does.

The plan runs it as a script (`python <path>/worker.py <engine flags>`) with the image's own Python,
the one that has the fork's vLLM: it imports the standard library and vLLM only, and must stay valid
Python 3.10 (the 0.7.2 image's). Source: aws-neuron/upstreaming-to-vllm@490ab20f (branch
neuron-2.24-vllm-v0.7.2) examples/neuron/multi_node/worker.py:13-39:
- parse AsyncEngineArgs from argv, build AsyncLLMEngine.from_engine_args(usage_context=API_SERVER);
  with ENABLE_NEURON_MULTI_NODE=true and NEURON_RANK_ID > 0 the engine's NeuronWorker joins the
  leader's gloo group (vllm/worker/neuron_worker.py:50-60, 185-211) and loads this node's shard;
- loop `engine.engine.model_executor.driver_worker.execute_model()` with no arguments: each call
  blocks in the leader's per-step broadcast and runs the step (vllm/worker/worker_base.py:356-391);
- any exception (the leader went away and the collective raised) is logged and the process exits 1
  (here: one JSON line, event neuron_follower_exit, with the exception as its reason).
The fork never tells followers to stop (its uniproc executor's stop is a no-op,
vllm/executor/executor_base.py:142-144): the node ends a formation by killing this process.
Unlike the fork's worker, a rank of 0 (or none) is refused before anything loads, with exit code 2.
"""

import argparse  # the fork's worker.py:2,14: plain argparse, not vLLM's FlexibleArgumentParser
import json
import os
import sys
import time


def log_event(event, level, **fields):
    """One JSON line on stderr, flushed, shaped as runtime/logs.py shapes them (ts, event, fields,
    level): this script runs with the image's Python, outside the flotilla package, so it cannot
    import runtime.logs."""
    line = {"ts": round(time.time(), 6), "event": event, **fields, "level": level}
    print(json.dumps(line, default=str), file=sys.stderr, flush=True)


def main(argv=None):
    rank = os.environ.get("NEURON_RANK_ID", "")
    if not rank.isdigit() or int(rank) == 0:
        print(
            f"error: NEURON_RANK_ID={rank!r}: the follower loop runs on ranks 1..N-1; rank 0 runs the fork's "
            "API server (see `python -m runtime plan --engine neuron`)",
            file=sys.stderr,
        )
        return 2
    try:
        # The fork's imports (worker.py:5-8), after the rank check so a misplaced start fails fast.
        from vllm.engine.arg_utils import AsyncEngineArgs  # noqa: PLC0415 - exists only in the multi-node image
        from vllm.engine.async_llm_engine import AsyncLLMEngine  # noqa: PLC0415 - exists only in the multi-node image
        from vllm.usage.usage_lib import UsageContext  # noqa: PLC0415 - exists only in the multi-node image
    except ImportError as exc:
        print(
            f"error: vLLM is not importable ({exc}); the follower loop runs with the Python of the multi-node "
            "image built from runtime/Dockerfile.neuron-multinode",
            file=sys.stderr,
        )
        return 2
    try:
        parser = AsyncEngineArgs.add_cli_args(argparse.ArgumentParser(prog="neuron-follower"))
        args = parser.parse_args(argv)
        engine = AsyncLLMEngine.from_engine_args(
            AsyncEngineArgs.from_cli_args(args), usage_context=UsageContext.API_SERVER
        )
        worker = engine.engine.model_executor.driver_worker
        print(f"neuron follower rank {rank}: engine built, executing the leader's steps", file=sys.stderr, flush=True)
        while True:
            worker.execute_model()
    except Exception as exc:  # noqa: BLE001 - the fork's worker.py:36-39: any failure ends the follower
        log_event("neuron_follower_exit", "error", rank=int(rank), code=1, reason=f"{type(exc).__name__}: {exc}")
        return 1


if __name__ == "__main__":
    code = main()
    if code == 1:
        # The collective's gloo threads are still alive; interpreter teardown destroys them joinable and
        # the C++ runtime aborts ("terminate called without an active exception", SIGABRT): with a
        # plain exit the follower-loop test (tests/neuron/test_neuron_worker_loop.py, a real torch gloo
        # group on loopback) saw exit -6 instead of 1 in about half its runs. Leave without teardown,
        # after flushing (os._exit flushes nothing; the exit's log line is already out): the node
        # reads exit 1 as "the leader went away".
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    sys.exit(code)
