"""A STAND-IN for AWS's vLLM fork 0.7.2 (NOT vLLM), for the tests of the multi-node neuron engine.

Models the surface flotilla touches, as the fork has it at aws-neuron/upstreaming-to-vllm@490ab20f
(branch neuron-2.24-vllm-v0.7.2), inconvenient parts included:
- `python -m vllm.entrypoints.api_server`: the demo server (entrypoints/api_server.py:35-169):
  /health always 200 once listening, which is only after the engine (and its gloo group with every
  follower) is up; POST /generate: `prompt` (text), `stream`, every other key to SamplingParams, which
  refuses unknown keys; streams `{"text": [prompt + output so far]}` lines, no ids, no finish reason;
  a token prompt has no text and breaks the stream (`assert prompt is not None`).
- `AsyncEngineArgs` with the fork's flags (no `--additional-config`: unknown flags exit 2) and
  `AsyncLLMEngine.from_engine_args(...).engine.model_executor.driver_worker.execute_model()`, whose
  NeuronWorker reads ENABLE_NEURON_MULTI_NODE / WORLD_SIZE / NEURON_RANK_ID (worker/neuron_worker.py:
  50-60), joins a real torch gloo group over env:// and, on a follower, blocks in each step's
  broadcast from rank 0 (worker/worker_base.py:356-391). Followers never get a stop message; they end
  when a collective raises. The gloo timeout is torch's default unless STANDIN_GLOO_TIMEOUT_S is set.
The "model" writes the tokenizer's words in order after the prompt's last token. Test knobs:
  STANDIN_LOG            append JSON lines: server/follower start, each request body, follower steps
  STANDIN_EOS_AFTER      the model emits EOS as its Nth output token (0-based)
  STANDIN_TOKEN_DELAY    seconds per engine step (default 0.02)
  STANDIN_GLOO_TIMEOUT_S the gloo group's timeout (the fork passes none: torch's 30 min)
  STANDIN_COMPILE_TO     write compiled.neff into NEURON_COMPILED_ARTIFACTS (what a compile leaves)
"""

__version__ = "0.7.2+standin"
