"""Stand-in of the fork's demo API server (vllm/entrypoints/api_server.py:35-169), on aiohttp."""

import asyncio
import json
import os
import uuid

from aiohttp import web

from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.engine.async_llm_engine import AsyncLLMEngine
from vllm.sampling_params import SamplingParams
from vllm.usage.usage_lib import UsageContext
from vllm.utils import FlexibleArgumentParser
from vllm.worker.neuron_worker import standin_log


def build_app(engine):
    async def health(_r):
        return web.Response(status=200)  # api_server.py:35-38: no engine check

    async def generate(r):
        request_dict = await r.json()
        standin_log({"body": dict(request_dict), "request_id": r.headers.get("X-Request-Id"), "pid": os.getpid()})
        prompt = request_dict.pop("prompt")
        stream = request_dict.pop("stream", False)
        try:
            params = SamplingParams(**request_dict)
        except (TypeError, ValueError):
            return web.Response(status=500, text="Internal Server Error")  # no handler for it in the fork
        results = engine.generate(prompt, params, uuid.uuid4().hex)
        if not stream:
            final = None
            async for out in results:
                final = out
            assert final.prompt is not None
            return web.json_response({"text": [final.prompt + o.text for o in final.outputs]})
        resp = web.StreamResponse()
        await resp.prepare(r)
        try:
            async for out in results:
                assert out.prompt is not None  # api_server.py:67-68: token prompts have no text
                line = json.dumps({"text": [out.prompt + o.text for o in out.outputs]}) + "\n"
                await resp.write(line.encode())
        except (ConnectionResetError, asyncio.CancelledError):  # with_cancellation: abort on disconnect
            standin_log({"aborted": r.headers.get("X-Request-Id")})
            raise
        finally:
            await results.aclose()
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_post("/generate", generate)
    return app


def main():
    parser = FlexibleArgumentParser()
    parser.add_argument("--host", type=str, default=None)
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--root-path", type=str, default=None)
    parser.add_argument("--log-level", type=str, default="debug")
    parser = AsyncEngineArgs.add_cli_args(parser)
    args = parser.parse_args()
    # init_app builds the engine (and joins every follower) before the server listens.
    engine = AsyncLLMEngine.from_engine_args(AsyncEngineArgs.from_cli_args(args), usage_context=UsageContext.API_SERVER)
    web.run_app(build_app(engine), host=args.host, port=args.port, print=None, handle_signals=True)


if __name__ == "__main__":
    main()
