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
    # entrypoints/openai/cli_args.py:172: prompt_tokens_details (cached_tokens) in usage, off by default.
    p.add_argument("--enable-prompt-tokens-details", action="store_true")
    return p


# Sources below: vllm-project/vllm@v0.13.0 (the pinned wheel) and vllm-project/vllm-neuron@4fac6b7b
# (branch release-0.4.1); "runner" / "loader" are the plugin's vllm_neuron/worker/
# neuronx_distributed_model_{runner,loader}.py.


def _error(message, status=400):
    """vLLM's error body: param is always null in 0.13.0 (entrypoints/openai/serving_engine.py:743-756);
    a 500 is typed with the status phrase (api_server.py:991-1000)."""
    kind = "BadRequestError" if status == 400 else "Internal Server Error"
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}


def _temperature(body):
    """The temperature vLLM samples with: 1.0 when unset (protocol.py:1145-1151, 1190-1193), and anything in
    (0, 0.01) raised to 0.01 (sampling_params.py:316-324)."""
    t = body.get("temperature")
    t = 1.0 if t is None else float(t)
    return 0.01 if 0 < t < 0.01 else t


def _refusal(body):
    """vLLM's 400s for the fields the leader forwards, worded as vLLM words them."""
    choices = body.get("n", 1)
    if not isinstance(choices, int) or choices < 1:
        return f"n must be at least 1, got {choices}."  # sampling_params.py:372-373
    if choices > 1 and _temperature(body) < 1e-5:
        # Below 1e-5 is greedy, and greedy allows one choice (sampling_params.py:353-358, 449-451).
        return f"n must be 1 when using greedy sampling, got {choices}."
    k = body.get("logprobs")
    if k is not None and k < 0:
        return "`logprobs` must be a positive value."  # protocol.py:1305-1306
    if k is not None and k > 20:  # max_logprobs 20 (config/model.py:188; v1/engine/input_processor.py:68-85)
        return f"Requested sample logprobs of {k}, which is greater than max allowed: 20"
    for name in ("presence_penalty", "frequency_penalty"):
        if not -2.0 <= float(body.get(name, 0.0)) <= 2.0:  # sampling_params.py:374-381
            return f"{name} must be in [-2, 2], got {body[name]}."
    fmt = body.get("response_format")
    if fmt is not None and fmt.get("type") not in ("text", "json_object", "json_schema", "structural_tag"):
        # Any other type fails the request schema (protocol.py:190-221); pydantic's message is longer.
        return f"response_format: input should be 'text', 'json_object' or 'json_schema', got {fmt.get('type')!r}"
    return None


def _grammar(fmt):
    """What response_format constrains the output to, as to_sampling_params reads it (protocol.py:1213-1237):
    json_schema without a schema sets json=None, which builds no grammar at all
    (v1/structured_output/request.py:30-35); the stand-in models no structural_tag grammar."""
    if fmt["type"] == "json_object":
        return fmt
    if fmt["type"] == "json_schema" and (fmt.get("json_schema") or {}).get("schema") is not None:
        return fmt
    return None


def _instance(schema):
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


def _document(fmt):
    if fmt["type"] == "json_object":
        return json.dumps({"standin": True})
    return json.dumps(_instance(fmt["json_schema"]["schema"]))


class _Brackets:
    """The tokenizer of a --model without tokenizer.json: token t < 1000 reads "[t]", 1000 + c the character
    c (so a document can be spelled), 999 is the end of sequence."""

    eos = 999

    def encode(self, text):
        return [1000 + ord(ch) for ch in text]

    def step(self, tid):
        return "" if tid == self.eos else chr(tid - 1000) if tid >= 1000 else f"[{tid}]"


class _Tokenizer:
    """The model's own tokenizer.json, as vLLM loads it (a fast tokenizer), and its EOS from tokenizer_config.json."""

    def __init__(self, model_dir):
        from tokenizers import Tokenizer  # noqa: PLC0415 - only when the checkpoint has one

        self.tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
        config = os.path.join(model_dir, "tokenizer_config.json")
        eos = None
        if os.path.isfile(config):
            with open(config) as f:
                eos = json.load(f).get("eos_token")
        self.eos = self.tok.token_to_id(eos) if isinstance(eos, str) else None

    def encode(self, text):
        return self.tok.encode(text, add_special_tokens=False).ids


class _Detokenizer:
    """vLLM 0.13.0's incremental detokenizer and stop-string check for one output sequence
    (v1/engine/detokenizer.py). Its text starts empty after the prompt (:92), the decode stream is primed
    with the prompt's last tokens (:182-195), a token that ends inside a UTF-8 character adds nothing until
    the character completes (DecodeStream.step returns None, taken as "" at :220-231), an EOS or stop token
    is not detokenized (:106-110), a stop string truncates the text and ends the sequence (:132-143, check_stop_strings
    :316-350; output_processor.py:495-500), and until the sequence finishes the last max(len(stop)) - 1
    characters are held back (:84-88, get_next_output_text :149-165)."""

    def __init__(self, tokenizer, prompt, stop):
        self.tokenizer = tokenizer
        self.stop = [stop] if isinstance(stop, str) else list(stop or [])
        self.buffer = max(len(x) for x in self.stop) - 1 if self.stop else 0
        self.text = ""
        self.sent = 0
        if isinstance(tokenizer, _Brackets):
            self.stream = None
            return
        from tokenizers.decoders import DecodeStream  # noqa: PLC0415

        self.stream = DecodeStream(skip_special_tokens=True)
        suffix = prompt
        if len(prompt) > 4:
            for i in range(4, min(len(prompt) + 1, 24)):
                if "\ufffd" not in tokenizer.tok.decode(prompt[-i:]):
                    suffix = prompt[-i:]
                    break
        for tid in suffix:
            self.stream.step(tokenizer.tok, tid)

    def update(self, tid, stop_terminated):
        """Add one token; the stop string it completes, if any."""
        if stop_terminated:
            return None
        before = len(self.text)
        piece = self.tokenizer.step(tid) if self.stream is None else self.stream.step(self.tokenizer.tok, tid)
        self.text += piece or ""
        new = len(self.text) - before
        if not new:
            return None
        for s in self.stop:
            at = self.text.find(s, 1 - new - len(s))
            if at != -1:
                self.text = self.text[:at]
                return s
        return None

    def delta(self, finished):
        end = len(self.text) - (0 if finished else self.buffer)
        if self.sent >= end:
            return ""
        out, self.sent = self.text[self.sent : end], end
        return out


def _next_token(context, out, document, choice, eos):
    """The stand-in model, greedy and a function of its context, so prompt + generated goes on as the
    uninterrupted sequence would. With a document: the document's next token after the longest start of it
    the context ends with, then EOS. Otherwise the last token + 1 (choice c > 0 starts at prompt[-1] + 1 + 100 * c)."""
    if document is None:
        return out[-1] + 1 if out else context[-1] + 1 + 100 * choice
    for j in range(min(len(document), len(context)), 0, -1):
        if context[-j:] == document[:j]:
            break
    else:
        j = 0
    return document[j] if j < len(document) else eos


def _logprobs(tid, k, offset, body):
    """One token's completions-shaped logprobs: the sampled token is the most likely, then k - 1 others."""
    name = (lambda t: f"token_id:{t}") if body.get("return_tokens_as_token_ids") else (lambda t: f"[{t}]")
    lp = -0.25
    top = {name(tid + j * 7): lp - j for j in range(max(k, 1))}
    return {"text_offset": [offset], "token_logprobs": [lp], "tokens": [name(tid)], "top_logprobs": [top]}


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
    if prefix_caching and args.block_size is None:
        # vllm-neuron (a5ef7c8) platform.py:203-210: block_size must be set with prefix caching.
        sys.exit("error: When prefix caching is enabled, block_size must be set.")
    served = (args.served_model_name or [args.model])[0]
    # vLLM's prefix cache, as far as a client sees it: full blocks of a prompt's tokens (all but its last,
    # which is always computed) whose whole prefix an earlier prompt had. Counters in prompt tokens
    # (v1/metrics/loggers.py:483-501, 1028-1033); never evicted here.
    seen_blocks = set()
    cache_counts = {"queries": 0, "hits": 0}

    def cached_prefix(prompt):
        if not prefix_caching:
            return 0
        block, hits = args.block_size, 0
        for end in range(block, len(prompt), block):  # full blocks of prompt[:-1]
            key = tuple(prompt[:end])
            if key not in seen_blocks:
                break
            hits = end
        for end in range(block, len(prompt), block):
            seen_blocks.add(tuple(prompt[:end]))
        cache_counts["queries"] += len(prompt)
        cache_counts["hits"] += hits
        return hits

    # vLLM detokenizes with the model's own tokenizer; a --model without one gets the bracket spelling.
    has_tokenizer = os.path.isfile(os.path.join(args.model, "tokenizer.json"))
    tokenizer = _Tokenizer(args.model) if has_tokenizer else _Brackets()
    overrides = args.additional_config.get("override_neuron_config", {})
    # The plugin samples on the host only when on_device_sampling_config is None (runner:229-268); the
    # override replaces the default with a plain dict.update (loader:1213-1217).
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
            f'vllm:prefix_cache_queries_total{{engine="0",model_name="{served}"}} {cache_counts["queries"]}.0\n'
            f'vllm:prefix_cache_hits_total{{engine="0",model_name="{served}"}} {cache_counts["hits"]}.0\n'
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
        refusal = _refusal(body)
        if refusal:
            return web.json_response(_error(refusal), status=400)
        fmt = body.get("response_format") or {"type": "text"}
        if fmt["type"] == "json_schema" and fmt.get("json_schema") is None:
            # to_sampling_params asserts json_schema is set (protocol.py:1224-1225), outside the handler's
            # `except ValueError` (serving_completion.py:248-250): a 500 with an empty message
            # (api_server.py:546-549).
            return web.json_response(_error("", 500), status=500)
        with_ids = bool(body.get("return_token_ids"))
        choices = int(body.get("n") or 1)
        k = body.get("logprobs")
        # The seed is accepted and has no effect: the runner gives no request a generator (runner:986-997).
        # On-device sampling drops the grammar bitmask with a warning (runner:229-241); the CPU path applies
        # it (:252-260), so there the output is a JSON document: a minimal instance of the schema.
        grammar = _grammar(fmt) if cpu_sampling else None
        document = _document(grammar) if grammar is not None else os.environ.get("STANDIN_TEXT")
        cached = cached_prefix(prompt)
        doc_ids = tokenizer.encode(document) if document is not None else None
        ignore_eos = bool(body.get("ignore_eos"))
        outs = [[] for _ in range(choices)]
        detoks = [_Detokenizer(tokenizer, prompt, body.get("stop")) for _ in range(choices)]
        ended = set()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(r)
        running[0] += 1
        sent = 0
        try:
            if k is not None and not cpu_sampling:
                # On-device sampling returns logprobs_tensors=None (loader:542-550); the stream generator
                # asserts it has them (serving_completion.py:428-429) and sends the failure as an error
                # chunk before [DONE] (:511-516).
                await resp.write(f"data: {json.dumps(_error('Did not output logprobs'))}\n\n".encode())
                choices = 0
            for i in range(n if choices else 0):
                for c in range(choices):
                    if c in ended:
                        continue
                    if sent == die_after:
                        sys.stderr.flush()
                        os._exit(1)
                    sent += 1
                    tid = _next_token([*prompt, *outs[c]], outs[c], doc_ids, c, tokenizer.eos)
                    outs[c].append(tid)
                    # The scheduler's stop check: EOS unless ignore_eos, then the length (v1/core/sched/utils.py:40-62).
                    eos_stop = tid == tokenizer.eos and not ignore_eos
                    end = "stop" if eos_stop else ("length" if len(outs[c]) >= n else None)
                    if detoks[c].update(tid, eos_stop) is not None:
                        end = "stop"  # a stop string ends the request (output_processor.py:495-500)
                    if end is not None:
                        ended.add(c)
                    choice = {"index": c, "text": detoks[c].delta(end is not None), "finish_reason": end}
                    if with_ids:  # only when asked: prompt ids in the first chunk, then each chunk's ids
                        choice["token_ids"] = [tid]  # serving_completion.py:416-418, 459-464
                        if i == 0:
                            choice["prompt_token_ids"] = prompt
                    if k is not None:
                        # The CPU path returns the sampler's logprobs (runner:892-901).
                        choice["logprobs"] = _logprobs(tid, int(k), i, body)
                    # One choice per chunk, as vLLM streams them (serving_completion.py:448-466).
                    chunk = {"id": "cmpl-standin", "object": "text_completion", "model": served, "choices": [choice]}
                    await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
                if len(ended) == choices:
                    break
                await asyncio.sleep(float(os.environ.get("STANDIN_TOKEN_DELAY", "0.02")))
            if (body.get("stream_options") or {}).get("include_usage"):
                # serving_completion.py:481-500: the usage chunk after every choice's last, choices empty;
                # prompt_tokens_details only with --enable-prompt-tokens-details and some tokens cached.
                usage = {"prompt_tokens": len(prompt), "completion_tokens": sent, "total_tokens": len(prompt) + sent}
                if args.enable_prompt_tokens_details and cached:
                    usage["prompt_tokens_details"] = {"cached_tokens": cached}
                chunk = {
                    "id": "cmpl-standin",
                    "object": "text_completion",
                    "model": served,
                    "choices": [],
                    "usage": usage,
                }
                await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
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
