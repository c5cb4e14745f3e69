"""A STAND-IN for vLLM's OpenAI server (not vLLM): the subset the neuron engine uses, for tests.

Takes the plan's vLLM arguments (--host, --port, --served-model-name, --max-model-len, ...), serves
/health, /metrics and a streamed /v1/completions whose prompt is a list of token ids. Each output
token id of choice c is prompt[-1] + 1 + i + 100 * c, its text "[id]". With NEURON_RANK_ID > 0 it
stands in for the follower worker instead: it logs its rank and environment and waits.

The request fields behave as vLLM 0.16.0's /v1/completions with the vllm-neuron plugin (sources at
each rule below): n choices (refused with temperature 0), logprobs up to 20 (tokens as "token_id:N"
with return_tokens_as_token_ids), penalties in [-2, 2], response_format json_object / json_schema.
With on-device sampling (the plan's default) logprobs come back null and response_format is ignored,
as the plugin does; with `on_device_sampling_config: null` in --additional-config (cpu sampling) the
output is a JSON document: a minimal instance of the schema. Test knobs (environment):
  STANDIN_LOG          append one JSON line per request body received
  STANDIN_DIE_AFTER    exit(1) after sending this many tokens of a stream (a crashed server)
  STANDIN_HEALTH_AFTER seconds before /health turns 200 (a compiling server)
  STANDIN_SICK_AFTER   seconds after which /health answers 503 for good (a wedged server)
  STANDIN_TOKEN_DELAY  seconds between streamed tokens (default 0.02)
  STANDIN_TEXT         answer every plain-text request with this text, 4 characters per token
  STANDIN_COMPILE_TO   write compiled.neff into NEURON_COMPILED_ARTIFACTS (what a compile leaves)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time

from aiohttp import web


def follower() -> None:
    """Follower rank (NEURON_RANK_ID > 0, the plan's worker command): log, then wait to be killed."""
    if os.environ.get("STANDIN_LOG"):
        with open(os.environ["STANDIN_LOG"], "a") as f:
            f.write(
                json.dumps(
                    {
                        "follower": int(os.environ["NEURON_RANK_ID"]),
                        "pid": os.getpid(),
                        "argv": sys.argv[1:],
                        "env": {k: v for k, v in os.environ.items() if k.startswith(("NEURON_", "MASTER_", "WORLD_"))},
                    }
                )
                + "\n"
            )
    while True:
        time.sleep(60)


def _refusal(body: dict) -> str | None:
    """vLLM 0.16.0's 400s for the fields the leader forwards (messages as vLLM words them)."""
    choices = body.get("n", 1)
    if not isinstance(choices, int) or choices < 1:
        return f"n must be at least 1, got {choices}."  # vllm/sampling_params.py:385-387
    if choices > 1 and float(body.get("temperature", 1.0)) < 1e-5:
        # Zero temperature is greedy, and greedy allows one choice (vllm/sampling_params.py:367-372, 479-481).
        return f"n must be 1 when using greedy sampling, got {choices}."
    k = body.get("logprobs")
    if k is not None and k > 20:  # max_logprobs 20 (vllm/config/model.py:201; v1/engine/input_processor.py:108-120)
        return f"Requested sample logprobs of {k}, which is greater than max allowed: 20"
    for name in ("presence_penalty", "frequency_penalty"):
        if not -2.0 <= float(body.get(name, 0.0)) <= 2.0:  # vllm/sampling_params.py:388-395
            return f"{name} must be in [-2, 2], got {body[name]}."
    fmt = body.get("response_format")
    if fmt is not None and (fmt.get("type") not in ("text", "json_object", "json_schema")):
        return "response_format.type must be text, json_object or json_schema"
    if fmt is not None and fmt.get("type") == "json_schema" and not (fmt.get("json_schema") or {}).get("schema"):
        return "response_format.json_schema.schema is required"
    return None


def _instance(schema: dict) -> object:
    """A small value that satisfies a JSON schema (what a grammar-constrained model might produce)."""
    if "enum" in schema:
        return schema["enum"][0]
    if "const" in schema:
        return schema["const"]
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return _instance(schema[key][0])
    kind = schema.get("type", "object")
    if isinstance(kind, list):
        kind = kind[0]
    if kind == "object":
        props = schema.get("properties", {})
        return {name: _instance(props.get(name, {})) for name in schema.get("required", list(props))}
    if kind == "array":
        return [_instance(schema.get("items", {})) for _ in range(schema.get("minItems", 0))]
    return {"string": "standin", "integer": 7, "number": 1.5, "boolean": True, "null": None}[kind]


def _document(fmt: dict) -> str:
    if fmt["type"] == "json_object":
        return json.dumps({"standin": True})
    return json.dumps(_instance(fmt["json_schema"]["schema"]))


def _logprobs(tid: int, k: int, offset: int, body: dict) -> dict:
    """One token's completions-shaped logprobs: the sampled token is the most likely, then k - 1 others."""
    name = (lambda t: f"token_id:{t}") if body.get("return_tokens_as_token_ids") else (lambda t: f"[{t}]")
    lp = -0.25
    top = {name(tid + j * 7): lp - j for j in range(max(k, 1))}
    return {"text_offset": [offset], "token_logprobs": [lp], "tokens": [name(tid)], "top_logprobs": [top]}


def main() -> None:
    if int(os.environ.get("NEURON_RANK_ID", "0")) > 0:
        return follower()
    p = argparse.ArgumentParser()
    p.add_argument("--host", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--served-model-name", required=True)
    p.add_argument("--max-model-len", type=int, required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--additional-config", default="{}")
    args, _rest = p.parse_known_args()
    overrides = json.loads(args.additional_config).get("override_neuron_config", {})
    # vllm-neuron samples on the host only when on_device_sampling_config is None (plugin 0.5.0:
    # vllm_neuron/worker/neuronx_distributed_model_runner.py:557-592).
    cpu_sampling = "on_device_sampling_config" in overrides and overrides["on_device_sampling_config"] is None
    started = time.monotonic()
    health_after = float(os.environ.get("STANDIN_HEALTH_AFTER", "0"))
    die_after = int(os.environ.get("STANDIN_DIE_AFTER", "-1"))
    if os.environ.get("STANDIN_COMPILE_TO"):
        out = os.environ["NEURON_COMPILED_ARTIFACTS"]
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "compiled.neff"), "w") as f:
            f.write(f"compiled for {args.model}\n")
    running = [0]
    if os.environ.get("STANDIN_LOG"):
        with open(os.environ["STANDIN_LOG"], "a") as f:
            f.write(json.dumps({"server": args.port, "pid": os.getpid()}) + "\n")

    async def health(_r: web.Request) -> web.Response:
        up = time.monotonic() - started
        ok = up >= health_after and up < float(os.environ.get("STANDIN_SICK_AFTER", "inf"))
        return web.Response(status=200 if ok else 503)

    async def metrics(_r: web.Request) -> web.Response:
        return web.Response(
            text=f'vllm:num_requests_running{{model_name="{args.served_model_name}"}} {running[0]}.0\n'
            f'vllm:num_requests_waiting{{model_name="{args.served_model_name}"}} 0.0\n'
            f'vllm:kv_cache_usage_perc{{model_name="{args.served_model_name}"}} 0.25\n'
        )

    async def completions(r: web.Request) -> web.StreamResponse:
        body = await r.json()
        if os.environ.get("STANDIN_LOG"):
            with open(os.environ["STANDIN_LOG"], "a") as f:
                f.write(
                    json.dumps({"body": body, "request_id": r.headers.get("X-Request-Id"), "pid": os.getpid()}) + "\n"
                )
        prompt = body.get("prompt")
        if body.get("model") != args.served_model_name:
            return web.json_response({"error": {"message": f"model {body.get('model')!r} does not exist"}}, status=404)
        if not (isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt)):
            return web.json_response({"error": {"message": "stand-in expects token ids"}}, status=400)
        n = int(body.get("max_tokens") or 16)
        if len(prompt) + n > args.max_model_len:
            return web.json_response(
                {"error": {"message": f"This model's maximum context length is {args.max_model_len} tokens"}},
                status=400,
            )
        refusal = _refusal(body)
        if refusal:
            return web.json_response(
                {"error": {"message": refusal, "type": "BadRequestError", "code": 400}}, status=400
            )
        choices = int(body.get("n") or 1)
        k = body.get("logprobs")
        fmt = body.get("response_format") or {"type": "text"}
        document = _document(fmt) if cpu_sampling and fmt["type"] != "text" else os.environ.get("STANDIN_TEXT")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(r)
        running[0] += 1
        sent = 0
        try:
            for i in range(n):
                out = []
                for c in range(choices):
                    if sent == die_after:
                        sys.stderr.flush()
                        os._exit(1)
                    sent += 1
                    if document is not None:
                        piece = document[4 * i : 4 * i + 4]
                        if not piece:
                            continue
                        tid, text = 2 + i % 6, piece
                        end = "stop" if 4 * i + 4 >= len(document) else ("length" if i == n - 1 else None)
                    else:
                        tid = prompt[-1] + 1 + i + 100 * c
                        text, end = f"[{tid}]", ("length" if i == n - 1 else None)
                    choice = {"index": c, "text": text, "token_ids": [tid], "finish_reason": end}
                    if k is not None:
                        choice["logprobs"] = _logprobs(tid, int(k), i, body) if cpu_sampling else None
                    out.append(choice)
                if not out:
                    break
                chunk = {
                    "id": "cmpl-standin",
                    "object": "text_completion",
                    "model": args.served_model_name,
                    "choices": out,
                }
                await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
                await asyncio.sleep(float(os.environ.get("STANDIN_TOKEN_DELAY", "0.02")))
            await resp.write(b"data: [DONE]\n\n")
        except ConnectionError:  # the client closed the request: vLLM aborts it the same way
            if os.environ.get("STANDIN_LOG"):
                with open(os.environ["STANDIN_LOG"], "a") as f:
                    f.write(json.dumps({"aborted": r.headers.get("X-Request-Id")}) + "\n")
        finally:
            running[0] -= 1
        return resp

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/v1/completions", completions)
    web.run_app(app, host=args.host, port=args.port, print=None, handle_signals=True)


if __name__ == "__main__":
    main()
