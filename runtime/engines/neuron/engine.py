"""The leader's `neuron` engine: drives the process the plan starts (launch_spec) as an Engine.

start() prepares the rank (plan checked before any weights move), spawns the process, waits until it
is ready and stores the compile cache. generate() speaks what the unit's image serves: single-node,
vLLM's OpenAI /v1/completions with prompt token ids and `return_token_ids`; multi-node, the
leader/follower loop on NxD Inference (runtime/engines/neuron/spmd.py), one JSON object a line over
its stdin/stdout (runtime/engines/neuron/loop_wire.py). Followers run the plan's command instead (run_follower).
Nothing here imports vLLM or NxD Inference.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Any, AsyncGenerator, AsyncIterator, Callable

import contract
from contract import node_exit
from contract.ready import Loading, LoadPhase
from runtime.engines.base import (
    EngineBroken,
    EngineCannotServe,
    EngineError,
    EngineHealth,
    EngineLoad,
    EngineState,
    GenerationRequest,
    RequestRejected,
    TokenEvent,
)
from runtime.engines.neuron import loop_wire
from runtime.engines.neuron.launch import NeuronOptions, RankPlan
from runtime.engines.neuron.loading import LoadTracker
from runtime.logs import jlog
from runtime.membership import Membership

log = logging.getLogger("flotilla.neuron")
HEALTH_POLL_S = 0.5
PROGRESS_EVERY_S = 30.0
METRICS_EVERY_S = 2.0
UNHEALTHY_AFTER_S = 20.0  # vLLM alive but its /health failing this long: the unit re-forms
STOP_GRACE_S = 10.0


@dataclass(frozen=True)
class NeuronEngineSettings:
    model_uri: str
    model_dir: str
    instance_type: str
    options: NeuronOptions
    compile_cache_uri: str | None = None
    launcher: str | None = None  # replaces `python3 -m <module>`: a test stand-in for vLLM


def rank_argv(plan: RankPlan, base_env: dict[str, str], launcher: str | None) -> tuple[list[str], dict[str, str]]:
    """launch_spec's argv and env, with the interpreter (`python`/`python3`) swapped for the launcher
    if given: tests run the same module or script under a Python whose path holds a stand-in vLLM."""
    from runtime.engines.neuron.prepare import launch_spec  # noqa: PLC0415

    argv, env = launch_spec(plan, base_env)
    if launcher:
        assert argv[0] in ("python", "python3"), argv
        argv = [*shlex.split(launcher), *argv[1:]]
    return argv, env


def _prepare(membership: Membership, s: NeuronEngineSettings, s3: Any, tracker: LoadTracker):
    """prepare_rank with every expected failure turned into one EngineError line: EngineCannotServe
    (the node stops, contract/node_exit.py) for what no retry changes, EngineError (the unit re-forms)
    for the rest (S3 unreachable, no credentials yet, a full disk)."""
    from contract.layout import LayoutError  # noqa: PLC0415
    from contract.llama import ShapeError  # noqa: PLC0415
    from runtime.artifacts.fetch import ArtifactError  # noqa: PLC0415
    from runtime.artifacts.manifest import ManifestError  # noqa: PLC0415
    from runtime.engines.neuron.prepare import prepare_rank  # noqa: PLC0415

    try:
        return prepare_rank(
            membership,
            model_uri=s.model_uri,
            model_dir=s.model_dir,
            instance_type=s.instance_type,
            options=s.options,
            s3=s3,
            compile_cache_uri=s.compile_cache_uri,
            tracker=tracker,
        )
    except LayoutError as e:
        raise EngineCannotServe(
            f"neuron layout refused before fetching weights: {e}", exit_code=node_exit.LAYOUT_REFUSED
        ) from e
    except ShapeError as e:
        raise EngineCannotServe(
            f"neuron: the model at {s.model_uri} cannot be read: {e}", exit_code=node_exit.MODEL_UNREADABLE
        ) from e
    except (ArtifactError, ManifestError) as e:
        raise EngineCannotServe(
            f"neuron: the model at {s.model_uri} is not published as its manifest says: {e}",
            exit_code=node_exit.MODEL_NOT_PUBLISHED,
        ) from e
    except (ValueError, OSError) as e:
        raise EngineError(f"neuron rank {membership.rank}: preparing {s.model_uri} failed: {e}") from e
    except Exception as e:  # botocore errors: no credentials, no bucket, access denied
        raise EngineError(
            f"neuron rank {membership.rank}: preparing {s.model_uri} failed: {type(e).__name__}: {e}"
        ) from e


def _store_compiled(prepared: Any, s: NeuronEngineSettings, s3: Any) -> None:
    """Once this node's ranks are loaded: upload what it compiled under its own key (the key holds its
    start_rank_id), so its next start, or a replacement node of the same rank, loads without compiling."""
    from runtime.engines.neuron.prepare import store_compiled  # noqa: PLC0415

    if not s.compile_cache_uri:
        return
    try:
        stored = store_compiled(
            prepared, compile_cache_uri=s.compile_cache_uri, compiled_dir=s.options.compiled_artifacts_dir, s3=s3
        )
        jlog(
            "neuron_compile_cache",
            logging.INFO,
            logger=log,
            stored=stored,
            key=prepared.compile_key,
            start_rank_id=prepared.plan.start_rank_id,
        )
    except Exception as e:  # noqa: BLE001 - a cache upload failure costs the next start time, not this one
        jlog("neuron_compile_cache_store_failed", logging.WARNING, logger=log, error=str(e))


def _s3_client() -> Any:
    import boto3  # noqa: PLC0415

    return boto3.client("s3")


class NeuronEngine:
    """Lives in the leader's engine process; vLLM runs as its child, bound to 127.0.0.1."""

    def __init__(
        self,
        membership: Membership,
        *,
        settings: NeuronEngineSettings,
        model_name: str,
        start_timeout_s: float,
        s3: Any = None,
        unhealthy_after_s: float = UNHEALTHY_AFTER_S,
    ) -> None:
        self.membership = membership
        self.s = settings
        self.model_name = model_name
        self.max_context = settings.options.seq_len
        self.tokenizer: Any = None
        self.url = f"http://127.0.0.1:{settings.options.engine_port}"
        self._start_timeout_s = start_timeout_s
        self._unhealthy_after_s = unhealthy_after_s
        self._streams: dict[str, asyncio.Queue] = {}  # multi-node: request id -> its events from the loop
        self._s3 = s3
        self._proc: asyncio.subprocess.Process | None = None
        self._session: Any = None
        self._state = EngineState.STARTING
        self._detail = ""
        self._running: dict[str, Any] = {}  # request id -> upstream response (closed on cancel)
        self._cancelled: set[str] = set()
        self._vllm_load: EngineLoad | None = None
        self._tasks: list[asyncio.Task] = []
        self.prepared: Any = None
        self.loading = LoadTracker()

    # -- start ------------------------------------------------------------------------------------
    async def start(self) -> None:
        import aiohttp  # noqa: PLC0415

        from runtime.models.tokenizers import HFTokenizer  # noqa: PLC0415

        s3 = self._s3 or await asyncio.to_thread(_s3_client)
        jlog(
            "neuron_prepare",
            logging.INFO,
            logger=log,
            model_uri=self.s.model_uri,
            rank=self.membership.rank,
            world_size=self.membership.world_size,
        )
        self.prepared = await asyncio.to_thread(_prepare, self.membership, self.s, s3, self.loading)
        try:
            self.tokenizer = HFTokenizer(self.s.model_dir)
        except (OSError, ValueError) as e:
            raise EngineCannotServe(
                f"neuron: the checkpoint at {self.s.model_uri} has no usable tokenizer: {e}",
                exit_code=node_exit.MODEL_UNREADABLE,
            ) from e
        argv, env = rank_argv(self.prepared.plan, dict(os.environ), self.s.launcher)
        jlog(
            "neuron_engine_spawn",
            logging.INFO,
            logger=log,
            argv=argv[:4],
            compile_cache_hit=self.prepared.compile_cache_hit,
        )
        # Same process group as this engine process: the supervisor's killpg takes it down too.
        if self.api == "spmd":
            self._proc = await asyncio.create_subprocess_exec(
                *argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, limit=1 << 20
            )
        else:
            self._proc = await asyncio.create_subprocess_exec(*argv, env=env, stdin=subprocess.DEVNULL)
            # vLLM compiles (no cached artifacts) and loads in one go and says nothing on the way.
            self.loading.phase(LoadPhase.LOAD if self.prepared.compile_cache_hit else LoadPhase.COMPILE)
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=5))
        try:
            await (self._wait_spmd_ready() if self.api == "spmd" else self._wait_healthy())
        except BaseException:
            await self._close()
            raise
        await asyncio.to_thread(_store_compiled, self.prepared, self.s, s3)
        self._state = EngineState.READY
        self._tasks = [asyncio.create_task(self._watch_process())]
        if self.api == "spmd":
            self._tasks.append(asyncio.create_task(self._read_spmd()))
        else:
            self._tasks.append(asyncio.create_task(self._poll_server()))

    @property
    def api(self) -> str:
        """'openai' (single-node image: vLLM's server) or 'spmd' (multi-node: the leader/follower loop)."""
        return self.prepared.plan.api if self.prepared is not None else "openai"

    # Continues a request another unit started (GenerationRequest.generated), in both modes: each takes
    # token ids and the leader cuts the text from the ids it gets back with our own TextTracker, so
    # prompt + generated is plain generation and the tracker replays the text already sent.
    resumes = True

    async def _wait_healthy(self) -> None:
        import aiohttp  # noqa: PLC0415

        assert self._proc is not None
        started = last_progress = time.monotonic()
        while True:
            if self._proc.returncode is not None:
                raise EngineError(
                    f"neuron: the vLLM server exited with code {self._proc.returncode} "
                    "before it became healthy; see its output above in this container's log"
                )
            try:
                async with self._session.get(self.url + "/health", timeout=aiohttp.ClientTimeout(total=2)) as r:
                    if r.status == 200:
                        jlog(
                            "neuron_engine_healthy",
                            logging.INFO,
                            logger=log,
                            after_s=round(time.monotonic() - started, 1),
                        )
                        return
            except (aiohttp.ClientError, asyncio.TimeoutError):
                pass
            waited = time.monotonic() - started
            if waited > self._start_timeout_s:
                raise EngineError(
                    f"neuron: the vLLM server at {self.url} was not healthy after "
                    f"{self._start_timeout_s:.0f}s; raise FLOTILLA_FORM_TIMEOUT_S if it is "
                    "still compiling"
                )
            if time.monotonic() - last_progress >= PROGRESS_EVERY_S:
                last_progress = time.monotonic()
                jlog(
                    "neuron_engine_waiting",
                    logging.INFO,
                    logger=log,
                    waited_s=round(waited),
                    timeout_s=self._start_timeout_s,
                    url=self.url + "/health",
                )
            try:
                await asyncio.wait_for(self._proc.wait(), HEALTH_POLL_S)
            except asyncio.TimeoutError:
                pass

    async def _watch_process(self) -> None:
        assert self._proc is not None
        rc = await self._proc.wait()
        what = "the leader's NxD Inference loop" if self.api == "spmd" else "the vLLM server"
        self._break(f"{what} exited with code {rc}")

    def _break(self, detail: str) -> None:
        if self._state is not EngineState.READY:
            return
        self._state = EngineState.BROKEN
        self._detail = detail
        jlog("neuron_engine_broken", logging.ERROR, logger=log, detail=detail)
        for resp in list(self._running.values()):
            if resp is not None:
                resp.close()  # every open stream ends now, not when TCP notices
        for q in self._streams.values():
            q.put_nowait(None)

    async def _poll_server(self) -> None:
        """Every 2 s: vLLM's /health (failing for unhealthy_after_s breaks the engine: a wedged
        server must not hold streams forever) and its /metrics queue and KV-cache gauges."""
        import aiohttp  # noqa: PLC0415

        healthy_at = time.monotonic()
        quick = aiohttp.ClientTimeout(total=5)
        while self._state is EngineState.READY:
            try:
                async with self._session.get(self.url + "/health", timeout=quick) as r:
                    if r.status == 200:
                        healthy_at = time.monotonic()
                if self.api == "openai":
                    async with self._session.get(self.url + "/metrics", timeout=quick) as r:
                        self._vllm_load = (
                            _parse_vllm_metrics(await r.text(), self.s.options.batch_size) if r.status == 200 else None
                        )
            except Exception:  # noqa: BLE001 - load falls back to our own counters
                self._vllm_load = None
            if time.monotonic() - healthy_at > self._unhealthy_after_s:
                self._break(f"the vLLM server's /health has failed for {self._unhealthy_after_s:.0f}s")
                return
            await asyncio.sleep(METRICS_EVERY_S)

    async def _wait_spmd_ready(self) -> None:
        """The loop prints {"event": "ready"} once every node has loaded its ranks."""
        assert self._proc is not None and self._proc.stdout is not None
        try:
            async with asyncio.timeout(self._start_timeout_s):
                while line := await self._proc.stdout.readline():
                    event = loop_wire.read_from_loop(line)
                    if isinstance(event, loop_wire.Ready):
                        jlog("neuron_engine_healthy", logging.INFO, logger=log, api="spmd")
                        return
                    if isinstance(event, loop_wire.Progress):
                        self.loading.phase(LoadPhase(event.phase))
        except TimeoutError:
            raise EngineError(
                f"neuron: the unit's NxD Inference nodes were not loaded after {self._start_timeout_s:.0f}s; "
                "raise FLOTILLA_FORM_TIMEOUT_S if they are still compiling"
            ) from None
        rc = await self._proc.wait()
        raise EngineError(
            f"neuron: the leader's NxD Inference loop exited with code {rc} before it was ready; "
            "see its output above in this container's log"
        )

    async def _read_spmd(self) -> None:
        """Route each event of the loop to its request's stream."""
        assert self._proc is not None and self._proc.stdout is not None
        while line := await self._proc.stdout.readline():
            event = loop_wire.read_from_loop(line)
            if isinstance(event, (loop_wire.Generated, loop_wire.Refused)) and event.id in self._streams:
                self._streams[event.id].put_nowait(event)
        self._break("the leader's NxD Inference loop closed its output")

    def _send(self, message: loop_wire.ToLoop) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        self._proc.stdin.write(loop_wire.to_loop_line(message))

    # -- serve ------------------------------------------------------------------------------------
    async def check(self, request: GenerationRequest) -> None:
        """Raise RequestRejected now for a field the unit's vLLM would not honour."""
        from runtime.engines.neuron.requests import check, serves  # noqa: PLC0415

        check(request.sampling, serves(multi_node=self.membership.world_size > 1, sampling=self.s.options.sampling))

    async def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        if self._state is not EngineState.READY:
            raise EngineBroken(f"the neuron engine is {self._state.value}: {self._detail}")
        stream = self._generate_spmd(request) if self.api == "spmd" else self._generate_openai(request)
        try:
            async for ev in stream:
                yield ev
        finally:
            await stream.aclose()  # a consumer that stops early closes the upstream request now

    async def _generate_openai(self, request: GenerationRequest) -> AsyncGenerator[TokenEvent, None]:
        """vLLM's token ids in, the text cut here: one TextTracker per choice, so a continuation's tracker
        first replays the tokens another unit generated and releases what that unit held back, once."""
        import aiohttp  # noqa: PLC0415

        from runtime.engines.neuron.requests import (  # noqa: PLC0415
            cached_tokens,
            check,
            check_continuation,
            chunk_events,
            completions_body,
            serves,
        )
        from runtime.engines.text import TextTracker  # noqa: PLC0415

        sp = request.sampling
        check(sp, serves(multi_node=self.membership.world_size > 1, sampling=self.s.options.sampling))
        check_continuation(request)
        trackers = [TextTracker(self.tokenizer, sp.stop) for _ in range(sp.n)]
        _replay(trackers[0], request, getattr(self.tokenizer, "eos_token_id", None))
        # With prefix caching, vLLM says how many prompt tokens came from its cache in a usage chunk after
        # every choice's last token: those last events wait for it, to carry cached_tokens (base.TokenEvent).
        usage = self.s.options.prefix_caching_block > 0
        body = completions_body(request, self.model_name, usage=usage)
        rid = request.request_id
        finished = False
        done: set[int] = set()  # choices that have finished: the request is done when all n have
        stopped_here = False  # some choice ended at a stop string our tracker found
        held: list[TokenEvent] = []  # with usage: each choice's last event, until the usage chunk
        cached = 0
        try:
            async with self._session.post(
                self.url + "/v1/completions", json=body, headers={contract.REQUEST_ID_HEADER: rid}
            ) as resp:
                self._running[rid] = resp
                if resp.status != 200:
                    text = (await resp.text())[:500]
                    if 400 <= resp.status < 500:
                        raise RequestRejected(f"the vLLM server refused the request: {_vllm_message(text)}")
                    raise EngineError(f"the vLLM server answered HTTP {resp.status}: {_vllm_message(text)}")
                async for line in resp.content:
                    line = line.strip()
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        break
                    chunk = json.loads(data)
                    if "error" in chunk:
                        raise EngineError(f"the vLLM server failed the request: {chunk['error']}")
                    in_usage = cached_tokens(chunk) if usage else None
                    cached = in_usage if in_usage is not None else cached
                    try:
                        events = chunk_events(chunk, sp.logprobs)
                    except ValueError as e:
                        raise EngineError(f"the vLLM server sent {e}") from e
                    for ev in events:
                        if ev.index in done:
                            continue  # a choice cut at a stop string here: vLLM runs it on until it ends
                        cut = _cut(trackers[ev.index], ev)
                        if cut.finish_reason is not None:
                            done.add(ev.index)
                            finished = len(done) >= sp.n
                            stopped_here = stopped_here or ev.finish_reason is None
                            if usage:
                                held.append(cut)
                                continue
                        yield cut
                    if finished and stopped_here:
                        # vLLM is still generating what follows the stop string: close the request, which
                        # vLLM aborts (vllm@v0.13.0:vllm/v1/engine/async_llm.py:444-448). Its usage chunk
                        # would come only after max_tokens more device steps, so a request cut here by a
                        # stop string reports the cached tokens of no usage chunk: 0.
                        resp.close()
                        break
                for ev in held:
                    yield dataclasses.replace(ev, cached_tokens=cached)
        except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError) as e:
            if rid in self._cancelled:
                return
            raise EngineBroken(
                f"the vLLM server dropped the stream ({self._detail or type(e).__name__}); retry on a healthy unit"
            ) from e
        finally:
            self._running.pop(rid, None)
            self._cancelled.discard(rid)
        if not finished and rid not in self._cancelled:
            raise EngineBroken(
                f"the vLLM server ended the stream without a finish reason "
                f"({self._detail or 'server still running'}); retry on a healthy unit"
            )

    async def _generate_spmd(self, request: GenerationRequest) -> AsyncGenerator[TokenEvent, None]:
        """The leader's loop: token ids in, one event per generated token out. NxD Inference's
        sampling takes top_k, top_p and temperature per row (sampling.py:185-199); greedy is top_k 1.
        Stop strings are cut here from the decoded text; EOS ends the request in the loop."""
        from runtime.engines.text import TextTracker  # noqa: PLC0415

        sp = request.sampling
        rid = request.request_id
        eos = getattr(self.tokenizer, "eos_token_id", None)
        tracker = TextTracker(self.tokenizer, sp.stop)
        _replay(tracker, request, eos)
        before = request.generated
        q: asyncio.Queue = asyncio.Queue()
        self._streams[rid] = q
        self._running[rid] = None
        finished = False
        try:
            self._send(
                loop_wire.Add(
                    id=rid,
                    prompt=[*request.prompt_token_ids, *before],
                    max_tokens=sp.max_tokens - len(before),
                    top_k=1 if sp.temperature <= 0 else 0,
                    top_p=sp.top_p,
                    temperature=sp.temperature if sp.temperature > 0 else 1.0,
                    stop_token_ids=() if sp.ignore_eos or eos is None else (eos,),
                )
            )
            while not finished:
                event = await q.get()
                if event is None:
                    if rid in self._cancelled:
                        return
                    raise EngineBroken(f"the NxD Inference loop stopped ({self._detail}); retry on a healthy unit")
                if isinstance(event, loop_wire.Refused):
                    raise RequestRejected(f"the NxD Inference loop refused the request: {event.error}")
                token, finish = event.token, event.finish
                if finish == "stop":  # EOS
                    finished = True
                    yield TokenEvent(token_id=token, text=tracker.flush(), finish_reason="stop")
                    break
                text, stopped = tracker.add(token)
                if stopped:
                    finished = True
                    self._send(loop_wire.Cancel(rid))
                    yield TokenEvent(token_id=token, text=text, finish_reason="stop")
                elif finish == "length":
                    finished = True
                    yield TokenEvent(token_id=token, text=text + tracker.flush(), finish_reason="length")
                else:
                    yield TokenEvent(token_id=token, text=text)
        finally:
            if not finished and self._proc is not None and self._proc.returncode is None:
                self._send(loop_wire.Cancel(rid))  # the consumer stopped early
            self._streams.pop(rid, None)
            self._running.pop(rid, None)
            self._cancelled.discard(rid)

    def cancel(self, request_id: str) -> None:
        if request_id in self._streams:
            self._cancelled.add(request_id)
            self._send(loop_wire.Cancel(request_id))
            self._streams[request_id].put_nowait(None)
            return
        resp = self._running.get(request_id)
        if resp is not None:
            self._cancelled.add(request_id)
            resp.close()  # vLLM aborts a request whose client went away

    def health(self) -> EngineHealth:
        return EngineHealth(state=self._state, detail=self._detail)

    def load_progress(self) -> Loading | None:
        """Where start() is (None before it began and once the engine is ready)."""
        return self.loading.snapshot() if self._state is EngineState.STARTING else None

    def load(self) -> EngineLoad:
        if self._vllm_load is not None:
            return self._vllm_load
        # Without vLLM's gauges: our own count of open upstream streams; vLLM queues the rest.
        running = len(self._running)
        batch = self.s.options.batch_size
        return EngineLoad(
            queue_depth=max(0, running - batch), running=min(running, batch), max_running=batch, kv_cache_used=0.0
        )

    async def shutdown(self) -> None:
        if self._state is not EngineState.BROKEN:
            self._state = EngineState.STOPPED  # before the process exits: not a failure
        await self._close()

    async def _close(self) -> None:
        for t in self._tasks:
            t.cancel()
        if self._session is not None:
            await self._session.close()
        proc = self._proc
        if self.api == "spmd" and proc is not None and proc.returncode is None and proc.stdin is not None:
            # Stop the loop cleanly (it tells the followers to stop too); SIGTERM after a short wait.
            try:
                self._send(loop_wire.Stop())
                proc.stdin.close()
                await asyncio.wait_for(proc.wait(), STOP_GRACE_S / 2)
            except (ConnectionError, RuntimeError, asyncio.TimeoutError):
                pass
        await terminate(proc)


def _replay(tracker: Any, request: GenerationRequest, eos: int | None) -> None:
    """A continuation (the tokens another unit generated, whose text its client already has): bring the
    tracker to where that unit left it; the text it held back comes out with the next tokens here."""
    sp, before = request.sampling, request.generated
    if len(before) >= sp.max_tokens:
        raise RequestRejected(
            f"the continuation already has {len(before)} of max_tokens {sp.max_tokens}: nothing is left"
        )
    for token in before:
        if tracker.add(token)[1] or (token == eos and not sp.ignore_eos):
            raise RequestRejected("the continuation's tokens already end the answer: nothing is left to generate")


def _cut(tracker: Any, ev: TokenEvent) -> TokenEvent:
    """vLLM's token with the text our tracker releases for it, ended where the tracker meets a stop string."""
    if ev.token_id < 0:  # a finish-only chunk
        return dataclasses.replace(ev, text=tracker.flush() if ev.finish_reason else "")
    if ev.finish_reason == "stop":
        # With no stop strings sent, vLLM stops only at EOS or a stop token id (vllm@v0.13.0:
        # vllm/v1/core/sched/utils.py:50-57), whose text it leaves out (vllm/v1/engine/detokenizer.py:106-110).
        return dataclasses.replace(ev, text=tracker.flush())
    text, stopped = tracker.add(ev.token_id)
    if stopped:
        return dataclasses.replace(ev, text=text, finish_reason="stop")
    return dataclasses.replace(ev, text=text + tracker.flush() if ev.finish_reason else text)


async def terminate(proc: asyncio.subprocess.Process | None, grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM (vLLM stops its own workers), then SIGKILL after grace_s."""
    if proc is None or proc.returncode is not None:
        return
    try:
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), grace_s)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
    except ProcessLookupError:
        pass


def _vllm_message(text: str) -> str:
    try:
        body = json.loads(text)
        err = body.get("error", body)
        return str(err.get("message", err) if isinstance(err, dict) else err)
    except (ValueError, AttributeError):
        return text


def _parse_vllm_metrics(text: str, batch_size: int) -> EngineLoad | None:
    """vllm:num_requests_running / _waiting and the KV-cache usage gauge (named per version)."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("vllm:"):
            name, _, rest = line.partition("{") if "{" in line.split(" ")[0] else line.partition(" ")
            try:
                values[name] = float(rest.rsplit(" ", 1)[-1])
            except ValueError:
                continue
    if "vllm:num_requests_running" not in values:
        return None
    kv = values.get("vllm:kv_cache_usage_perc", values.get("vllm:gpu_cache_usage_perc", 0.0))
    # Counters of prompt tokens queried in / served from the prefix cache since start; prometheus_client
    # exposes a Counter with the _total suffix (launch.PREFIX_CACHING_SOURCES). 0 without prefix caching.
    queries = values.get("vllm:prefix_cache_queries_total", values.get("vllm:prefix_cache_queries", 0.0))
    hits = values.get("vllm:prefix_cache_hits_total", values.get("vllm:prefix_cache_hits", 0.0))
    return EngineLoad(
        queue_depth=int(values.get("vllm:num_requests_waiting", 0)),
        running=int(values["vllm:num_requests_running"]),
        max_running=batch_size,
        kv_cache_used=min(1.0, max(0.0, kv)),
        prefix_cache_queries=int(queries),
        prefix_cache_hits=int(hits),
    )


def run_follower(
    membership: Membership,
    *,
    settings: NeuronEngineSettings,
    s3: Any = None,
    report: Callable[[Loading], None] | None = None,
    heard: Callable[[int], None] | None = None,
) -> None:
    """A follower's formation: prepare the rank, then run the plan's worker command until it exits.
    `report` hears this node's load progress (the node puts it in its ready body), `heard` the count of the
    leader's broadcasts each time the worker says they reach it (loop_wire.Following, at most every
    FOLLOWING_EVERY_S). Once the worker says
    its ranks are loaded (the join phase), what it compiled goes to the compile cache, as the leader's does.

    The worker stays in this process's group, so the supervisor's killpg ends it with the formation.
    """
    s3 = s3 or _s3_client()
    tracker = LoadTracker(report)
    prepared = _prepare(membership, settings, s3, tracker)
    argv, env = rank_argv(prepared.plan, dict(os.environ), settings.launcher)
    jlog("neuron_follower_spawn", logging.INFO, logger=log, rank=membership.rank, argv=argv[:4])
    with subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE) as worker:
        assert worker.stdout is not None
        for line in worker.stdout:  # the loop's progress lines until it exits
            try:
                event = loop_wire.read_from_loop(line)
                phase = LoadPhase(event.phase) if isinstance(event, loop_wire.Progress) else None
            except (ValueError, KeyError):
                continue
            if isinstance(event, loop_wire.Following) and heard is not None:
                heard(event.commands)
            if phase is not None:
                tracker.phase(phase)
            if phase is LoadPhase.JOIN:  # compiled (or loaded from the cache) and loaded: nothing changes after
                _store_compiled(prepared, settings, s3)
        rc = worker.wait()
    if rc != 0:
        raise EngineBroken(f"neuron follower rank {membership.rank}: the worker exited with code {rc}")
