"""A STAND-IN for vLLM 0.13.0 with the vllm-neuron plugin (NOT vLLM), for the single-node tests.

Models the OpenAI server as AWS's 0.13.0 Neuron image runs it (`python3 -m
vllm.entrypoints.openai.api_server`), from the vllm==0.13.0 wheel and vllm-project/vllm-neuron
release-0.4.1 (4fac6b7b): the engine flags flotilla passes, each with its 0.13.0 name (unknown flags,
e.g. the fork's --device or --override-neuron-config, exit 2 like argparse); the plugin's rule that
`--num-gpu-blocks-override` must be given, exactly max_num_seqs without prefix caching (README.md:
288-291); /health, /metrics (vllm:num_requests_running / _waiting, vllm:kv_cache_usage_perc,
v1/metrics/loggers.py:415,425,461) and a streamed /v1/completions whose prompt is token ids, with
`token_ids` in each chunk only when the request asks `return_token_ids` (entrypoints/openai/
protocol.py:1107; serving_completion.py:416-418, 459-464), one choice per chunk (:448-466). The model is
greedy and a function of its context (prompt + generated goes on as the uninterrupted sequence): the
last token + 1 (choice c > 0 starts at prompt[-1] + 1 + 100 * c), or a document's tokens then EOS. Each
chunk's text is what vLLM's own detokenizer releases: decoded with the checkpoint's tokenizer.json (a
--model without one spells token t "[t]"), starting empty after the prompt, nothing for a token that
ends inside a UTF-8 character, no text for EOS, and while stop strings may match the last
max(len(stop)) - 1 characters held back until the sequence ends (v1/engine/detokenizer.py).

The request fields behave as vLLM 0.13.0's /v1/completions with the plugin at release-0.4.1 (sources
at each rule in entrypoints/openai/api_server.py): n choices (refused at temperature 0), logprobs up to
20 (tokens as "token_id:N" with return_tokens_as_token_ids), penalties in [-2, 2], response_format
json_object / json_schema (without a schema: no constraint), a seed accepted and ignored (the plugin
gives no request a generator). With on-device sampling (the plan's default) a logprobs request streams
vLLM's "Did not output logprobs" error chunk and response_format is ignored, as the plugin does; with
`on_device_sampling_config: null` in --additional-config's override_neuron_config (cpu sampling)
logprobs come back and the output is a JSON document: a minimal instance of the schema.

Test knobs (environment):
  STANDIN_LOG          append one JSON line per request body received
  STANDIN_DIE_AFTER    exit(1) after sending this many tokens of a stream (a crashed server)
  STANDIN_HEALTH_AFTER seconds before /health turns 200 (a compiling server)
  STANDIN_SICK_AFTER   seconds after which /health answers 503 for good (a wedged server)
  STANDIN_TOKEN_DELAY  seconds between streamed tokens (default 0.02)
  STANDIN_TEXT         answer every plain-text request with this text (its tokens, then EOS)
  STANDIN_COMPILE_TO   write compiled.neff into NEURON_COMPILED_ARTIFACTS (what a compile leaves)
"""

__version__ = "0.13.0+standin"
