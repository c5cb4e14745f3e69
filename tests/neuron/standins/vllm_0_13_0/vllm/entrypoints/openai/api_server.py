"""Stand-in of vLLM 0.13.0's OpenAI server with the vllm-neuron plugin (see vllm/__init__.py)."""

import argparse
import asyncio
import json
import os
import sys
import time

from aiohttp import web


def _parser():
    p = argparse.ArgumentParser(prog="vllm.entrypoints.openai.api_server")
    # entrypoints/openai/cli_args.py:76,78
    p.add_argument("--host", default=None)
    p.add_argument("--port", type=int, default=8000)
    # engine/arg_utils.py (0.13.0): the engine flags the plan uses, and a few neighbours.
    p.add_argument("--model", default="Qwen/Qwen3-0.6B")
    p.add_argument("--served-model-name", nargs="+", default=None)
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--block-size", type=int, default=None, choices=[1, 8, 16, 32, 64, 128, 256])  # config/cache.py:22
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None)  # :287-288,897-902
    p.add_argument("--num-gpu-blocks-override", type=int, default=None)  # :894-896
    p.add_argument("--additional-config", type=json.loads, default={})  # :1140
    p.add_argument("--dtype", default="auto")
    return p


def main():
    args = _parser().parse_args()  # an unknown flag exits 2, as vLLM's parser does
    if args.max_num_seqs is None or args.max_model_len is None:
        sys.exit("error: the stand-in needs --max-num-seqs and --max-model-len")
    # vllm-neuron release-0.4.1 README.md:288-291: required, and exactly max_num_seqs without prefix caching.
    prefix_caching = args.enable_prefix_caching is not False  # V1 turns it on unless told not to
    if args.num_gpu_blocks_override is None:
        sys.exit("error: vllm-neuron needs --num-gpu-blocks-override (out-of-bounds errors otherwise)")
    if not prefix_caching and args.num_gpu_blocks_override != args.max_num_seqs:
        sys.exit(
            f"error: without prefix caching --num-gpu-blocks-override must equal --max-num-seqs "
            f"({args.num_gpu_blocks_override} != {args.max_num_seqs})"
        )
    served = (args.served_model_name or [args.model])[0]
    started = time.monotonic()
    health_after = float(os.environ.get("STANDIN_HEALTH_AFTER", "0"))
    die_after = int(os.environ.get("STANDIN_DIE_AFTER", "-1"))
    if os.environ.get("STANDIN_COMPILE_TO"):
        out = os.environ["NEURON_COMPILED_ARTIFACTS"]
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "compiled.neff"), "w") as f:
            f.write(f"compiled for {args.model}\n")
    running = [0]

    def log(entry):
        if os.environ.get("STANDIN_LOG"):
            with open(os.environ["STANDIN_LOG"], "a") as f:
                f.write(json.dumps(entry) + "\n")

    log({"server": args.port, "pid": os.getpid(), "argv": sys.argv[1:], "additional_config": args.additional_config})

    async def health(_r):
        up = time.monotonic() - started
        ok = up >= health_after and up < float(os.environ.get("STANDIN_SICK_AFTER", "inf"))
        return web.Response(status=200 if ok else 503)

    async def metrics(_r):
        return web.Response(
            text=f'vllm:num_requests_running{{model_name="{served}"}} {running[0]}.0\n'
            f'vllm:num_requests_waiting{{model_name="{served}"}} 0.0\n'
            f'vllm:kv_cache_usage_perc{{model_name="{served}"}} 0.25\n'
        )

    async def completions(r):
        body = await r.json()
        log({"body": body, "request_id": r.headers.get("X-Request-Id"), "pid": os.getpid()})
        prompt = body.get("prompt")
        if body.get("model") != served:
            return web.json_response({"error": {"message": f"model {body.get('model')!r} does not exist"}}, status=404)
        if not (isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt)):
            return web.json_response({"error": {"message": "stand-in expects token ids"}}, status=400)
        n = int(body.get("max_tokens") or 16)
        if len(prompt) + n > args.max_model_len:
            return web.json_response(
                {"error": {"message": f"This model's maximum context length is {args.max_model_len} tokens"}},
                status=400,
            )
        with_ids = bool(body.get("return_token_ids"))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(r)
        running[0] += 1
        try:
            for i in range(n):
                if i == die_after:
                    sys.stderr.flush()
                    os._exit(1)
                tid = prompt[-1] + 1 + i
                choice = {"index": 0, "text": f"[{tid}]", "finish_reason": "length" if i == n - 1 else None}
                if with_ids:  # serving_completion.py:387,597: only when asked
                    choice["token_ids"] = [tid]
                    if i == 0:
                        choice["prompt_token_ids"] = prompt
                chunk = {"id": "cmpl-standin", "object": "text_completion", "model": served, "choices": [choice]}
                await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
                await asyncio.sleep(float(os.environ.get("STANDIN_TOKEN_DELAY", "0.02")))
            await resp.write(b"data: [DONE]\n\n")
        except ConnectionError:  # the client closed the request: vLLM aborts it the same way
            log({"aborted": r.headers.get("X-Request-Id")})
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
