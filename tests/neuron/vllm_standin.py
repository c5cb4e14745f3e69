"""A STAND-IN for vLLM's OpenAI server (not vLLM): the subset the neuron engine uses, for tests.

Takes the plan's vLLM arguments (--host, --port, --served-model-name, --max-model-len, ...), serves
/health, /metrics and a streamed /v1/completions whose prompt is a list of token ids. Each output
token id is prompt[-1] + 1 + i, its text "[id]". With NEURON_RANK_ID > 0 it stands in for the follower
worker instead: it logs its rank and environment and waits. Test knobs (environment):
  STANDIN_LOG          append one JSON line per request body received
  STANDIN_DIE_AFTER    exit(1) after sending this many tokens of a stream (a crashed server)
  STANDIN_HEALTH_AFTER seconds before /health turns 200 (a compiling server)
  STANDIN_SICK_AFTER   seconds after which /health answers 503 for good (a wedged server)
  STANDIN_TOKEN_DELAY  seconds between streamed tokens (default 0.02)
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


def main() -> None:
    if int(os.environ.get("NEURON_RANK_ID", "0")) > 0:
        return follower()
    p = argparse.ArgumentParser()
    p.add_argument("--host", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--served-model-name", required=True)
    p.add_argument("--max-model-len", type=int, required=True)
    p.add_argument("--model", required=True)
    args, _rest = p.parse_known_args()
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
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(r)
        running[0] += 1
        try:
            for i in range(n):
                if i == die_after:
                    sys.stderr.flush()
                    os._exit(1)
                tid = prompt[-1] + 1 + i
                chunk = {
                    "id": "cmpl-standin",
                    "object": "text_completion",
                    "model": args.served_model_name,
                    "choices": [
                        {
                            "index": 0,
                            "text": f"[{tid}]",
                            "token_ids": [tid],
                            "finish_reason": "length" if i == n - 1 else None,
                        }
                    ],
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
