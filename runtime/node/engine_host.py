"""The engine's own process: the leader's engine or a follower's worker loop, one per formation.

The supervisor starts it for each formation and kills it when the unit re-forms, so a process
group broken by a dead peer is never reused. Protocol (runtime/node/engine_protocol.py): JSON lines,
commands on stdin, events on the original stdout; everything the engine prints goes to stderr.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any, BinaryIO

from contract import Engine
from runtime.engines.base import (
    EngineBroken,
    EngineError,
    EngineState,
    EngineUnavailable,
    GenerationRequest,
    RequestRejected,
    SamplingParams,
    StructuredOutput,
    TokenEvent,
)
from runtime.engines.text import TextTracker
from runtime.logs import jlog, setup_logging
from runtime.node.engine_config import CONFIG_ENV, EngineConfig
from runtime.node.engine_protocol import (
    Accepted,
    Cancel,
    Done,
    Error,
    Event,
    Failed,
    Following,
    Load,
    Ready,
    Shutdown,
    Starting,
    Submit,
    Token,
    decode_command,
    encode,
)
from runtime.node.tool_calls import template_format

LOAD_EVERY_S = 0.1
PROGRESS_POLL_S = 0.25
# How often the engine process checks that its supervisor is still its parent (_exit_when_orphaned).
ORPHAN_POLL_S = 1.0


def _build_leader_engine(cfg: EngineConfig) -> Any:
    m = cfg.membership
    if cfg.engine == Engine.NEURON:
        from runtime.engines.neuron.engine import NeuronEngine  # noqa: PLC0415

        return NeuronEngine(
            m, settings=cfg.neuron_settings(), model_name=cfg.model_name, start_timeout_s=cfg.form_timeout_s
        )
    if cfg.engine == Engine.ECHO:
        from runtime.engines.echo import EchoEngine  # noqa: PLC0415 - imported where used, so other subcommands and roles load less

        return EchoEngine(
            membership=m,
            model_name=cfg.model_name,
            max_running=cfg.max_running,
            form_timeout_s=cfg.form_timeout_s,
            load_s=cfg.echo_load_s,
            step_s=cfg.echo_step_s,
        )
    from runtime.engines.reference import ReferenceEngine  # noqa: PLC0415 - imports torch

    return ReferenceEngine(
        m,
        model=cfg.model,
        prefill=cfg.prefill_strategy,
        decode=cfg.decode_strategy,
        kv_budget_tokens=cfg.kv_budget_tokens,
        max_running=cfg.max_running,
        max_prefill_tokens=cfg.max_prefill_tokens,
        collective_timeout_s=cfg.collective_timeout_s,
        start_timeout_s=cfg.form_timeout_s,
        threads=cfg.torch_threads,
        model_name=cfg.model_name,
        speculation=cfg.reference_speculation(),
    )


def _run_follower_worker(cfg: EngineConfig, out: "_Out") -> None:
    m = cfg.membership
    if cfg.engine == Engine.NEURON:
        from runtime.engines.neuron.engine import run_follower  # noqa: PLC0415

        # The loop counts the broadcasts and spaces its lines itself (spmd._following): each goes on as it is.
        run_follower(
            m,
            settings=cfg.neuron_settings(),
            report=out.send,
            heard=lambda commands: out.send(Following(commands=commands)),
        )
        return
    if cfg.engine == Engine.ECHO:
        from runtime.engines.echo import run_echo_worker  # noqa: PLC0415 - imported where used, so other subcommands and roles load less

        run_echo_worker(m, timeout_s=cfg.form_timeout_s)
        return
    from runtime.engines.reference import run_worker  # noqa: PLC0415 - imports torch

    run_worker(
        m,
        model=cfg.model,
        prefill=cfg.prefill_strategy,
        decode=cfg.decode_strategy,
        collective_timeout_s=cfg.collective_timeout_s,
        start_timeout_s=cfg.form_timeout_s,
        threads=cfg.torch_threads,
        heard=_Following(out),
    )


def load_event(engine: Any) -> Load:
    """The engine's health and load as the supervisor gets it every LOAD_EVERY_S (with the steps it
    completed, where it counts them: EngineLoad.steps)."""
    h = engine.health()
    return Load(state=h.state.value, detail=h.detail, **dataclasses.asdict(engine.load()))


async def _report_progress(engine: Any, out: "_Out") -> None:
    """While the engine starts: its load progress (engines that tell it), on change and every second."""
    sent: tuple = ()
    last = 0.0
    loop = asyncio.get_running_loop()
    while True:
        p = engine.load_progress() if hasattr(engine, "load_progress") else None
        if p is not None:
            key = (p.phase, p.done_bytes, p.total_bytes)
            if key != sent or loop.time() - last >= 1.0:
                out.send(p)
                sent, last = key, loop.time()
        await asyncio.sleep(PROGRESS_POLL_S)


class _Out:
    def __init__(self, f: BinaryIO) -> None:
        self._f = f

    def send(self, event: Event) -> None:
        self._f.write(encode(event))
        self._f.flush()


class _Following:
    """Called as each of the leader engine's commands reaches this follower's engine: tells the
    supervisor so (Following) at most every LOAD_EVERY_S, a clock read per command and no more."""

    def __init__(self, out: _Out) -> None:
        self._out = out
        self._commands = 0
        self._sent_at = -LOAD_EVERY_S

    def __call__(self) -> None:
        self._commands += 1
        now = time.monotonic()
        if now - self._sent_at >= LOAD_EVERY_S:
            self._sent_at = now
            self._out.send(Following(commands=self._commands))


async def _stdin_lines() -> asyncio.StreamReader:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=64 * 1024 * 1024)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    return reader


def token_event(tokenizer: Any, rid: str, ev: TokenEvent, tool_parser: str | None) -> Token:
    """A token event as the API layer gets it; logprobs with each token already turned into text
    (the API process has no tokenizer)."""
    logprobs = None
    if ev.logprob is not None:
        text = getattr(tokenizer, "token_text", None) or (lambda t: tokenizer.decode([t]))
        logprobs = {
            "token": text(ev.token_id),
            "logprob": ev.logprob.logprob,
            "top": [[text(t), lp] for t, lp in ev.logprob.top],
        }
    return Token(
        id=rid,
        token_id=ev.token_id,
        text=ev.text,
        finish_reason=ev.finish_reason,
        index=ev.index,
        logprobs=logprobs,
        tool_parser=tool_parser,  # tool_choice auto: the API reads the calls in this format
    )


def _prompt_ids(engine: Any, cmd: Submit) -> list[int]:
    if cmd.messages is not None:
        if cmd.tools:
            return list(engine.tokenizer.apply_chat_template(cmd.messages, tools=cmd.tools))
        return list(engine.tokenizer.apply_chat_template(cmd.messages))
    if cmd.prompt_ids is not None:
        return list(cmd.prompt_ids)
    return list(engine.tokenizer.encode(cmd.prompt))


async def _serve_leader(cfg: EngineConfig, out: _Out) -> int:
    return await _Leader(cfg, _build_leader_engine(cfg), out).run()


class _Leader:
    """The leader's engine process: start the engine, then serve the supervisor's commands until it
    says stop (or goes), then end every request still open and shut the engine down."""

    def __init__(self, cfg: EngineConfig, engine: Any, out: _Out) -> None:
        self.cfg, self.engine, self.out = cfg, engine, out
        self.tasks: dict[str, asyncio.Task] = {}
        self.stop = asyncio.Event()
        self.stop_reason = "the unit shut down before this request finished; retry"

    async def run(self) -> int:
        await self._start()
        reporter = asyncio.create_task(self._report_load())
        await self._serve(await _stdin_lines())
        await self._end_open_requests()
        reporter.cancel()
        await self.engine.shutdown()
        return 0 if self.engine.health().state is not EngineState.BROKEN else 1

    async def _start(self) -> None:
        engine = self.engine
        self.out.send(Starting())
        jlog("engine_starting", engine=self.cfg.engine, model=self.cfg.model)
        progress = asyncio.create_task(_report_progress(engine, self.out))
        try:
            await engine.start()
        finally:
            progress.cancel()
        calibration = getattr(engine, "calibration", None)  # the reference engine's chosen strategies
        self.out.send(
            Ready(
                model_name=engine.model_name,
                max_context=int(engine.max_context),
                strategies=calibration.as_dict() if calibration is not None else None,
                resumes=bool(getattr(engine, "resumes", False)),
                resumes_choices=bool(getattr(engine, "resumes_choices", False)),
            )
        )

    async def _report_load(self) -> None:
        while not self.stop.is_set():
            self.out.send(load_event(self.engine))
            await asyncio.sleep(LOAD_EVERY_S)

    async def _serve(self, reader: asyncio.StreamReader) -> None:
        """The supervisor's commands, until it says shutdown or closes our stdin (it is gone)."""
        while line := await reader.readline():
            cmd = decode_command(line)
            if isinstance(cmd, Submit):
                self._submit(cmd)
            elif isinstance(cmd, Cancel):
                t = self.tasks.get(cmd.id)
                if t is not None:
                    t.cancel()
            elif isinstance(cmd, Shutdown):
                self.stop_reason = cmd.reason or self.stop_reason
                return

    def _submit(self, cmd: Submit) -> None:
        if cmd.id in self.tasks:
            # Ids are generated unique by the supervisor (engine_process): a repeat is a bug.
            # Fail both loudly rather than let two requests share one stream.
            logging.error("request id %s submitted twice; failing it", cmd.id)
            self.tasks[cmd.id].cancel()
            self.out.send(Error(id=cmd.id, kind="internal", message="request id submitted twice (bug)"))
            return
        task = asyncio.create_task(self._run(cmd))
        self.tasks[cmd.id] = task
        task.add_done_callback(lambda t: self._task_done(cmd, t))

    def _task_done(self, cmd: Submit, task: asyncio.Task) -> None:
        """A request's task is forgotten once done, and a request cancelled before its task first ran
        still ends with its one error event.

        A task cancelled before its first step never runs its coroutine's body, so _run's own
        handler does not see the cancellation: the task's first step throws the pending
        CancelledError into the coroutine (CPython 3.11 Lib/asyncio/tasks.py, Task.__step: "Call
        either coro.throw(exc) or coro.send(None)"), and a coroutine that has not started raises a
        thrown exception at once, outside any try in its body (PEP 342, throw()). That happens
        whenever a submit and its cancel are read together: an engine frozen for a while (a stopped
        process, a long step) finds both in its stdin, and readline returns the second line without
        yielding to the new task. Without this the supervisor would wait for the request's end
        forever: it counts as held, and a unit that holds work without producing a token reports
        itself stalled, out of routing for good."""
        if self.tasks.get(cmd.id) is task:
            self.tasks.pop(cmd.id)
        if task.cancelled():
            self._fail_cancelled(cmd, 0)

    async def _end_open_requests(self) -> None:
        self.stop.set()
        for t in list(self.tasks.values()):
            t.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)

    # -- one request ------------------------------------------------------------------------------

    async def _run(self, cmd: Submit) -> None:
        """One request: checked and turned into the engine's request, accepted, generated, ended with
        exactly one done or error event."""
        generated = [0]  # tokens so far, for the request's end line
        try:
            tool_parser = self._tool_parser(cmd)
            request = self._request(cmd)
            check = getattr(self.engine, "check", None)
            if check is not None:  # refusals before "accepted", so a streamed request still gets its 400
                await check(request)
            self._accept(cmd, request)
            await self._generate(cmd, request, tool_parser, generated)
        except asyncio.CancelledError:
            self.engine.cancel(cmd.id)
            self._fail_cancelled(cmd, generated[0])
        except RequestRejected as e:
            self._fail(cmd, "rejected", generated[0], str(e), param=e.param or None)
        except EngineBroken as e:
            self._fail(cmd, "broken", generated[0], str(e))
        except EngineUnavailable as e:
            self._fail(cmd, "unavailable", generated[0], f"{e}; retry")
        except EngineError as e:
            self._fail(cmd, "engine", generated[0], str(e))
        except Exception as e:  # a bug: report it on the request and in the log, keep serving others
            logging.exception("request %s failed", cmd.id)
            self._fail(cmd, "internal", generated[0], f"{type(e).__name__}: {e}")

    def _fail_cancelled(self, cmd: Submit, generated: int) -> None:
        if self.stop.is_set():  # the supervisor is shutting the engine down (drain timeout)
            self._fail(cmd, "unavailable", generated, self.stop_reason)
        else:  # the server cancelled it: its client went away, or its queue or request timeout passed
            self._fail(cmd, "cancelled", generated, "cancelled by the server")

    def _tool_parser(self, cmd: Submit) -> str | None:
        """The model's tool-call format when tool_choice is auto; refuses tools the model cannot take."""
        engine = self.engine
        if cmd.tools and not getattr(engine.tokenizer, "supports_tools", False):
            raise RequestRejected(
                f"'tools' cannot be used with model '{engine.model_name}': its chat template has no tool "
                "format; leave 'tools' out, or serve a model whose chat template renders tools",
                param="tools",
            )
        if cmd.tool_choice != "auto":
            return None
        tool_parser = template_format(getattr(engine.tokenizer, "chat_template", None) or "")
        if tool_parser is None:
            raise RequestRejected(
                "tool_choice 'auto' (the default when 'tools' are given) needs to read tool calls in the "
                f"model's own format; the chat template of '{engine.model_name}' teaches none this unit "
                "parses (<tool_call> JSON as Hermes/Qwen, or Llama 3.1's JSON calls): set 'tool_choice' "
                'to "required", "none" or {"type": "function", "function": {"name": ...}}',
                param="tool_choice",
            )
        return tool_parser

    def _request(self, cmd: Submit) -> GenerationRequest:
        ids = self._prompt(cmd)
        continued, choices = self._continuation(cmd)
        return GenerationRequest(
            request_id=cmd.id,
            prompt_token_ids=tuple(ids),
            sampling=self._sampling(cmd, self._max_tokens(cmd, ids)),
            generated=continued,
            resumed_choices=choices,
            canary=cmd.canary,
        )

    def _prompt(self, cmd: Submit) -> list[int]:
        try:
            ids = _prompt_ids(self.engine, cmd)
        except (ValueError, KeyError, TypeError) as e:
            raise RequestRejected(f"the prompt cannot be tokenized: {e}") from e
        vocab = getattr(self.engine.tokenizer, "vocab_size", None)
        if vocab is not None and any(not 0 <= t < vocab for t in ids):
            raise RequestRejected(f"prompt token ids must be in 0..{vocab - 1}: fix the token ids")
        if not ids:
            raise RequestRejected("the prompt is empty: give at least one token")
        return ids

    def _continuation(self, cmd: Submit) -> tuple[tuple[int, ...], tuple[tuple[int, tuple[int, ...]], ...]]:
        """A continuation's tokens another unit generated, and for n > 1 [index, token ids] of each
        choice still to run."""
        engine = self.engine
        continued = tuple(cmd.generated or ())
        if continued and not getattr(engine, "resumes", False):
            raise RequestRejected(f"the {self.cfg.engine} engine cannot continue a request from another unit")
        choices = tuple((int(i), tuple(t)) for i, t in cmd.resumed_choices or ())
        if choices and not getattr(engine, "resumes_choices", False):
            raise RequestRejected(f"the {self.cfg.engine} engine cannot continue n > 1 choices from another unit")
        vocab = getattr(engine.tokenizer, "vocab_size", None)
        if vocab is not None and any(not 0 <= t < vocab for t in (*continued, *(t for _, c in choices for t in c))):
            raise RequestRejected(f"continuation token ids must be in 0..{vocab - 1}")
        return continued, choices

    def _max_tokens(self, cmd: Submit, ids: list[int]) -> int:
        max_context = self.engine.max_context
        room = max_context - len(ids)
        if room < 1:
            raise RequestRejected(
                f"the prompt has {len(ids)} tokens but the model's context length is {max_context}: shorten the prompt"
            )
        if cmd.max_tokens is None:
            # left out by the client: the API's default (protocol.DEFAULT_MAX_TOKENS, e.g. OpenAI's 16
            # for completions), which every request carries, capped by the room the context has left
            return min(cmd.default_max_tokens, room)
        if cmd.max_tokens > room:
            raise RequestRejected(
                f"the prompt has {len(ids)} tokens and max_tokens is {cmd.max_tokens}: together "
                f"they exceed the model's context length of {max_context}; "
                f"lower max_tokens to at most {room} or shorten the prompt"
            )
        return cmd.max_tokens

    @staticmethod
    def _sampling(cmd: Submit, max_tokens: int) -> SamplingParams:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=float(cmd.temperature),  # the API's default when the client left it out
            top_p=float(cmd.top_p),
            seed=cmd.seed,
            stop=tuple(cmd.stop or ()),
            ignore_eos=cmd.ignore_eos,
            n=int(cmd.n or 1),
            logprobs=cmd.logprobs,
            presence_penalty=float(cmd.presence_penalty or 0.0),
            frequency_penalty=float(cmd.frequency_penalty or 0.0),
            structured=StructuredOutput(**cmd.structured) if cmd.structured else None,
        )

    def _accept(self, cmd: Submit, request: GenerationRequest) -> None:
        replayed, choices = None, None
        if cmd.tool_choice == "auto":
            # The text the continued tokens stand for, cut as the engine cut it on the first unit: the
            # API replays it into the tool parser (the client has part of it as content, the rest held).
            # With n > 1, each continued choice's own.
            def text(tokens: Sequence[int]) -> str:
                tracker = TextTracker(self.engine.tokenizer, request.sampling.stop)
                return "".join(tracker.add(t)[0] for t in tokens)

            if request.generated:
                replayed = text(request.generated)
            if request.resumed_choices:
                choices = [[i, text(tokens)] for i, tokens in request.resumed_choices if tokens]
        held = getattr(self.engine, "cached_tokens", None)  # the reference engine's prefix cache
        self.out.send(
            Accepted(
                id=cmd.id,
                prompt_tokens=len(request.prompt_token_ids),
                cached_tokens=held(request) if held is not None else 0,
                replayed_text=replayed,
                replayed_choices=choices,
            )
        )

    async def _generate(
        self, cmd: Submit, request: GenerationRequest, tool_parser: str | None, generated: list[int]
    ) -> None:
        """The engine's tokens to the supervisor, then done, or an error if a choice never finished."""
        cached = 0
        finished: dict[int, str] = {}  # choice index -> the engine's finish reason
        async for ev in self.engine.generate(request):
            generated[0] += ev.token_id >= 0  # -1: a finish-only event (neuron engine), not a token
            if ev.finish_reason:
                finished[ev.index] = ev.finish_reason
            cached = max(cached, ev.cached_tokens)
            self.out.send(token_event(self.engine.tokenizer, cmd.id, ev, tool_parser))
        if len(finished) < (len(request.resumed_choices) or request.sampling.n):
            # A continuation runs only its unfinished choices. The engine's stream ended without saying
            # why for some choice: the answer may be cut short, and a client must never take a short
            # answer for a whole one.
            self._fail(cmd, "incomplete", generated[0], "the engine ended the request without a finish reason; retry")
            return
        finish = ",".join(finished[i] for i in sorted(finished))
        self._end(cmd, finish, generated[0], Done(id=cmd.id, cached_tokens=cached))

    def _end(self, cmd: Submit, ending: str, generated: int, event: Done | Error) -> None:
        """The request's one last event (done or error) and the engine's own account of it."""
        self.out.send(event)
        jlog("engine_request_end", id=cmd.id, request_id=cmd.correlation_id, ending=ending, generated=generated)

    def _fail(self, cmd: Submit, kind: str, generated: int, message: str, param: str | None = None) -> None:
        self._end(cmd, kind, generated, Error(id=cmd.id, kind=kind, message=message, param=param))


def _exit_when_orphaned(parent: int) -> None:
    """Exit once the supervisor that started us is gone. It starts us in a session of our own
    (engine_process.py), so its death does not take us with it, and a leader reads its stdin (whose
    end would tell it) only once its engine has started: a leader killed while its engine loads a
    model (minutes; a Neuron compile, longer) would leave the load running to the end, an orphan
    holding memory and cores. The kernel gives an orphan a new parent, init or the nearest
    subreaper ("reparented to the init process ... or the nearest 'subreaper'", prctl(2),
    PR_SET_CHILD_SUBREAPER), so getppid(2) changes the moment the supervisor goes."""
    while os.getppid() == parent:
        time.sleep(ORPHAN_POLL_S)
    _exit_with_our_group()


def _exit_when_supervisor_goes() -> None:
    # A follower's worker blocks in collectives and never reads stdin: watch it here, so a killed
    # supervisor never leaves an orphan rank holding the unit's process group.
    while sys.stdin.buffer.readline():
        pass
    _exit_with_our_group()


def _exit_with_our_group() -> None:
    """The supervisor is gone: exit 1, and in our own group (the supervisor starts us with setsid)
    take any engine child (the neuron worker) down with us."""
    if os.getpgrp() == os.getpid():
        os.killpg(os.getpid(), signal.SIGKILL)
    os._exit(1)


def main() -> int:
    cfg = EngineConfig.from_json(os.environ[CONFIG_ENV])
    # Keep the protocol on the original stdout; anything else printed goes to stderr.
    proto = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    setup_logging()
    out = _Out(proto)
    threading.Thread(target=_exit_when_orphaned, args=(os.getppid(),), daemon=True).start()
    if cfg.engine not in (Engine.ECHO, Engine.NEURON):
        import torch  # noqa: PLC0415 - the echo engine needs no torch

        torch.set_num_threads(cfg.torch_threads)
    if cfg.membership.is_leader:
        try:
            return asyncio.run(_serve_leader(cfg, out))
        except EngineError as e:
            out.send(Failed(message=str(e)))
            return e.exit_code
    out.send(Starting())
    threading.Thread(target=_exit_when_supervisor_goes, daemon=True).start()
    try:
        _run_follower_worker(cfg, out)
        rc = 0
    except EngineError as e:
        out.send(Failed(message=str(e)))
        rc = e.exit_code
    # os._exit: the stdin watchdog thread must not race interpreter shutdown.
    sys.stderr.flush()
    os._exit(rc)


if __name__ == "__main__":
    sys.exit(main())
