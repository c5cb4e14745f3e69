"""Stand-in of the fork's AsyncLLMEngine: `engine.model_executor.driver_worker` (the NeuronWorker),
and on rank 0 a step loop that batches every running request into one step per iteration, runs it
through the driver worker (which broadcasts it to the followers) and queues one RequestOutput per
request per step, as vllm/engine/async_llm_engine.py:79-117 does (no coalescing)."""

import asyncio
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from vllm.worker.neuron_worker import NeuronWorker, standin_log


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list
    finish_reason: object = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: object  # None for a token prompt: the fork keeps no text for it (inputs/preprocess.py:339-344)
    prompt_token_ids: list
    outputs: list
    finished: bool = False


@dataclass
class _Seq:
    request_id: str
    prompt: object
    prompt_ids: list
    params: object
    queue: asyncio.Queue
    out_ids: list = field(default_factory=list)
    text: str = ""


_LOGGED_ENV = ("NEURON_", "MASTER_", "WORLD_", "FI_", "ENABLE_", "VLLM_")


class _Executor:
    def __init__(self, driver_worker):
        self.driver_worker = driver_worker


class _Tokenizer:
    """The checkpoint's tokenizer.json, special tokens (EOS) dropped from text as vLLM's detokenizer does."""

    def __init__(self, model_dir):
        from tokenizers import Tokenizer

        self.tok = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
        cfg = Path(model_dir) / "tokenizer_config.json"
        eos = json.loads(cfg.read_text()).get("eos_token") if cfg.is_file() else None
        self.eos_id = self.tok.token_to_id(eos) if eos else None
        self.vocab = self.tok.get_vocab_size()

    def encode(self, text):
        return self.tok.encode(text).ids  # add_special_tokens defaults on (inputs/preprocess.py:190-206)

    def decode(self, ids):
        return self.tok.decode([i for i in ids if i != self.eos_id])


class LLMEngine:
    @classmethod
    def from_engine_args(cls, engine_args, usage_context=None):
        return cls(engine_args)

    def __init__(self, engine_args):
        self.engine_args = engine_args
        worker = NeuronWorker(engine_args)
        self.model_executor = _Executor(worker)
        self.tokenizer = _Tokenizer(engine_args.model)
        role = "server" if worker.is_driver_worker else "follower"
        standin_log(
            {
                role: worker.rank,
                "pid": os.getpid(),
                "script": sys.argv[0],
                "argv": sys.argv[1:],
                "override_neuron_config": engine_args.override_neuron_config,
                "env": {
                    k: v
                    for k, v in os.environ.items()
                    if k.startswith(("NEURON_", "MASTER_", "WORLD_", "FI_", "ENABLE_", "VLLM_"))
                },
            }
        )
        if worker.is_driver_worker and os.environ.get("STANDIN_COMPILE_TO"):
            out = Path(os.environ["NEURON_COMPILED_ARTIFACTS"])
            out.mkdir(parents=True, exist_ok=True)
            (out / "compiled.neff").write_text(f"compiled for {engine_args.model}\n")


class AsyncEngineDeadError(RuntimeError):
    pass


class AsyncLLMEngine:
    def __init__(self, engine):
        self.engine = engine
        self._seqs = {}
        self._wake = None
        self._loop_task = None
        self._dead = None
        self._step = 0

    @classmethod
    def from_engine_args(cls, engine_args, usage_context=None):
        return cls(LLMEngine(engine_args))

    def abort(self, request_id):
        self._seqs.pop(request_id, None)

    async def generate(self, prompt, sampling_params, request_id):
        if self._dead is not None:
            raise AsyncEngineDeadError(f"Background loop has errored already: {self._dead}")
        if self._loop_task is None:
            self._wake = asyncio.Event()
            self._loop_task = asyncio.get_running_loop().create_task(self._run())
        tok = self.engine.tokenizer
        if isinstance(prompt, str):
            ids, text = tok.encode(prompt), prompt
        else:
            ids, text = list(prompt["prompt_token_ids"]), None
        seq = _Seq(request_id, text, ids, sampling_params, asyncio.Queue())
        self._seqs[request_id] = seq
        self._wake.set()
        try:
            while True:
                item = await seq.queue.get()
                if isinstance(item, Exception):
                    raise item
                yield item
                if item.finished:
                    return
        finally:
            self.abort(request_id)

    async def _run(self):
        worker = self.engine.model_executor.driver_worker
        delay = float(os.environ.get("STANDIN_TOKEN_DELAY", "0.02"))
        while True:
            if not self._seqs:
                self._wake.clear()
                await self._wake.wait()
                continue
            self._step += 1
            seqs = list(self._seqs.values())
            step = {"step": self._step, "seqs": [[s.request_id, len(s.out_ids)] for s in seqs]}
            try:
                await asyncio.to_thread(worker.execute_model, step)
            except Exception as e:  # noqa: BLE001 - a follower went away: the engine is dead, as in V0
                self._dead = e
                for s in seqs:
                    s.queue.put_nowait(AsyncEngineDeadError(f"engine step failed: {e}"))
                return
            for s in seqs:
                if s.request_id in self._seqs:
                    self._advance(s)
            await asyncio.sleep(delay)

    def _advance(self, s):
        tok = self.engine.tokenizer
        p = s.params
        last = (s.out_ids or s.prompt_ids or [1])[-1]
        eos_after = int(os.environ.get("STANDIN_EOS_AFTER", "-1"))
        if len(s.out_ids) == eos_after and not p.ignore_eos and tok.eos_id is not None:
            nxt = tok.eos_id
        else:
            nxt = 2 + (max(last, 1) - 1) % (tok.vocab - 2)  # the next word, skipping <unk> and EOS
        s.out_ids.append(nxt)
        text = tok.decode(s.out_ids)
        finish = None
        for stop in p.stop or []:
            at = text.find(stop)
            if at >= 0:
                text, finish = text[:at], "stop"  # include_stop_str_in_output=False
                break
        if finish is None and nxt == tok.eos_id and not p.ignore_eos:
            finish = "stop"
        if finish is None and len(s.out_ids) >= p.max_tokens:
            finish = "length"
        s.text = text
        out = RequestOutput(
            request_id=s.request_id,
            prompt=s.prompt,
            prompt_token_ids=s.prompt_ids,
            outputs=[CompletionOutput(0, text, list(s.out_ids), finish)],
            finished=finish is not None,
        )
        s.queue.put_nowait(out)
        if finish is not None:
            self._seqs.pop(s.request_id, None)
