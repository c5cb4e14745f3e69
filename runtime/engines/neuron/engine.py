"""The leader's `neuron` engine: drives the vLLM server the plan starts (launch_spec) as an Engine.

start() prepares the rank (plan checked before any weights move), spawns the server, waits for its
/health and stores the compile cache. generate() speaks what the unit's image serves: single-node,
vLLM's OpenAI /v1/completions with prompt token ids and `return_token_ids`; multi-node, the V0
fork's demo /generate, which takes text and streams text only (see `_generate_fork`). Followers run
the plan's worker command instead (run_follower). Nothing here imports vLLM.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Any, AsyncGenerator, AsyncIterator

import contract
from runtime.engines.base import (
    EngineBroken,
    EngineError,
    EngineHealth,
    EngineLoad,
    EngineState,
    GenerationRequest,
    RequestRejected,
    TokenEvent,
)
from runtime.engines.neuron.launch import NeuronOptions, RankPlan
from runtime.logs import jlog
from runtime.membership import Membership

log = logging.getLogger("flotilla.neuron")
HEALTH_POLL_S = 0.5
PROGRESS_EVERY_S = 30.0
METRICS_EVERY_S = 2.0
UNHEALTHY_AFTER_S = 20.0  # vLLM alive but its /health failing this long: the unit re-forms
STOP_GRACE_S = 10.0
# Multi-node: the fork's followers wait for each step in a gloo broadcast that the fork creates with
# torch's default timeout (vllm/distributed/parallel_state.py:974-978 at 490ab20f, no timeout passed),
# 30 minutes (torch/distributed/constants.py: default_pg_timeout). An idle unit would lose its
# followers after that, so the leader runs a one-token request when it has been idle this long.
FORK_KEEPALIVE_S = 600.0
FORK_KEEPALIVE_PROMPT = "ping"


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


def _prepare(membership: Membership, s: NeuronEngineSettings, s3: Any):
    """prepare_rank with every expected failure turned into one EngineError line."""
    from runtime.engines.neuron.launch import NeuronPlanError  # noqa: PLC0415
    from runtime.engines.neuron.model import ModelConfigError  # noqa: PLC0415
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
        )
    except (NeuronPlanError, ModelConfigError) as e:
        raise EngineError(f"neuron layout refused before fetching weights: {e}") from e
    except (ValueError, OSError) as e:
        raise EngineError(f"neuron rank {membership.rank}: preparing {s.model_uri} failed: {e}") from e
    except Exception as e:  # botocore errors: no credentials, no bucket, access denied
        raise EngineError(
            f"neuron rank {membership.rank}: preparing {s.model_uri} failed: {type(e).__name__}: {e}"
        ) from e


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
        keepalive_s: float = FORK_KEEPALIVE_S,
    ) -> None:
        self.membership = membership
        self.s = settings
        self.model_name = model_name
        self.max_context = settings.options.seq_len
        self.tokenizer: Any = None
        self.url = f"http://127.0.0.1:{settings.options.engine_port}"
        self._start_timeout_s = start_timeout_s
        self._unhealthy_after_s = unhealthy_after_s
        self._keepalive_s = keepalive_s
        self._last_request = time.monotonic()
        self.keepalives = 0  # one-token requests sent to keep an idle multi-node unit's followers
        self._server_tok: Any = None  # multi-node: the tokenizer as the fork's server uses it
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

    # -- start ------------------------------------------------------------------------------------
    async def start(self) -> None:
        import aiohttp  # noqa: PLC0415

        from runtime.engines.neuron.prepare import store_compiled  # noqa: PLC0415
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
        self.prepared = await asyncio.to_thread(_prepare, self.membership, self.s, s3)
        try:
            self.tokenizer = HFTokenizer(self.s.model_dir)
            if self.api == "generate":
                from transformers import PreTrainedTokenizerFast  # noqa: PLC0415 - loads only with a tokenizer

                self._server_tok = PreTrainedTokenizerFast.from_pretrained(self.s.model_dir)
        except (OSError, ValueError) as e:
            raise EngineError(f"neuron: the checkpoint at {self.s.model_uri} has no usable tokenizer: {e}") from e
        argv, env = rank_argv(self.prepared.plan, dict(os.environ), self.s.launcher)
        jlog(
            "neuron_engine_spawn",
            logging.INFO,
            logger=log,
            argv=argv[:4],
            compile_cache_hit=self.prepared.compile_cache_hit,
        )
        # Same process group as this engine process: the supervisor's killpg takes vLLM down too.
        self._proc = await asyncio.create_subprocess_exec(*argv, env=env, stdin=subprocess.DEVNULL)
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=5))
        try:
            await self._wait_healthy()
        except BaseException:
            await self._close()
            raise
        if self.s.compile_cache_uri:
            try:
                stored = await asyncio.to_thread(
                    store_compiled,
                    self.prepared,
                    compile_cache_uri=self.s.compile_cache_uri,
                    compiled_dir=self.s.options.compiled_artifacts_dir,
                    s3=s3,
                )
                jlog("neuron_compile_cache", logging.INFO, logger=log, stored=stored, key=self.prepared.compile_key)
            except Exception as e:  # noqa: BLE001 - a cache upload failure costs the next start time, not this one
                jlog("neuron_compile_cache_store_failed", logging.WARNING, logger=log, error=str(e))
        self._state = EngineState.READY
        self._last_request = time.monotonic()
        self._tasks = [asyncio.create_task(self._watch_process()), asyncio.create_task(self._poll_server())]
        if self.api == "generate":
            self._tasks.append(asyncio.create_task(self._keep_followers()))

    @property
    def api(self) -> str:
        """'openai' (single-node image) or 'generate' (the fork's demo server, multi-node image)."""
        return self.prepared.plan.api if self.prepared is not None else "openai"

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
        self._break(f"the vLLM server exited with code {rc}")

    def _break(self, detail: str) -> None:
        if self._state is not EngineState.READY:
            return
        self._state = EngineState.BROKEN
        self._detail = detail
        jlog("neuron_engine_broken", logging.ERROR, logger=log, detail=detail)
        for resp in list(self._running.values()):
            resp.close()  # every open stream ends now, not when TCP notices

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
                # The fork's demo server has no /metrics (api_server.py:35-91): our own counters then.
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

    async def _keep_followers(self) -> None:
        """While idle, a one-token request every keepalive_s: each step's broadcast resets the wait
        of every follower's gloo receive, which would otherwise time out (see FORK_KEEPALIVE_S)."""
        while self._state is EngineState.READY:
            idle = time.monotonic() - self._last_request
            if self._running or idle < self._keepalive_s:
                await asyncio.sleep(max(0.05, self._keepalive_s - idle))
                continue
            self._last_request = time.monotonic()
            body = {"prompt": FORK_KEEPALIVE_PROMPT, "max_tokens": 1, "temperature": 0.0}
            try:
                async with self._session.post(self.url + "/generate", json=body) as r:
                    await r.read()
                    self.keepalives += 1
                    jlog("neuron_keepalive", logging.INFO, logger=log, status=r.status)
            except Exception as e:  # noqa: BLE001 - a dead server is the watcher's to report
                jlog("neuron_keepalive_failed", logging.WARNING, logger=log, error=str(e))

    # -- serve ------------------------------------------------------------------------------------
    async def check(self, request: GenerationRequest) -> None:
        """Raise RequestRejected now for a field the unit's vLLM would not honour."""
        from runtime.engines.neuron.requests import check, serves  # noqa: PLC0415

        check(request.sampling, serves(multi_node=self.membership.world_size > 1, sampling=self.s.options.sampling))

    async def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        if self._state is not EngineState.READY:
            raise EngineBroken(f"the neuron engine is {self._state.value}: {self._detail}")
        self._last_request = time.monotonic()
        stream = self._generate_fork(request) if self.api == "generate" else self._generate_openai(request)
        try:
            async for ev in stream:
                yield ev
        finally:
            await stream.aclose()  # a consumer that stops early closes the upstream request now

    async def _generate_openai(self, request: GenerationRequest) -> AsyncGenerator[TokenEvent, None]:
        import aiohttp  # noqa: PLC0415

        from runtime.engines.neuron.requests import check, chunk_events, completions_body, serves  # noqa: PLC0415

        sp = request.sampling
        check(sp, serves(multi_node=self.membership.world_size > 1, sampling=self.s.options.sampling))
        body = completions_body(request, self.model_name)
        rid = request.request_id
        finished = False
        done: set[int] = set()  # choices that have finished: the request is done when all n have
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
                    for ev in chunk_events(chunk, self.tokenizer, sp.logprobs):
                        if ev.finish_reason is not None:
                            done.add(ev.index)
                            finished = len(done) >= sp.n
                        yield ev
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

    def fork_prompt_text(self, token_ids: tuple[int, ...] | list[int]) -> str:
        """The text to send the fork's /generate for these prompt ids.

        /generate takes text only: a token prompt has no `prompt` text and trips the server's
        `assert prompt is not None` (api_server.py:62-68; inputs/preprocess.py:339-344 builds token
        inputs without text). The server re-tokenizes the text with the tokenizer's defaults, special
        tokens added (inputs/preprocess.py:190-206), so a leading BOS our ids already carry is dropped
        here instead of doubled there. Special tokens inside (chat markers) are kept as text.
        """
        tok = self._server_tok
        added = list(tok("", add_special_tokens=True)["input_ids"])
        ids = list(token_ids)
        if added and ids[: len(added)] == added:
            ids = ids[len(added) :]
        return tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    async def _generate_fork(self, request: GenerationRequest) -> AsyncGenerator[TokenEvent, None]:
        """The fork's /generate (api_server.py:41-91): text in; newline-delimited JSON out, one line per
        engine step, each `{"text": [prompt + all output text so far]}`; no token ids, no finish reason.

        What that costs, and how each is recovered:
        - token counts: V0 queues one RequestOutput per engine step and the server writes one line per
          output, one token each, so completion tokens = lines. Exact while every step adds one token.
        - token ids: re-encoded from each step's new text (may differ from what the model chose;
          a step with no text, an EOS, carries the tokenizer's EOS id).
        - finish reason: "length" when the steps reach max_tokens, else "stop" (a stop string, EOS).
          Stop strings are applied by vLLM itself (SamplingParams.stop), cut from the text.
        - the prompt is re-tokenized by the server from text (fork_prompt_text).
        """
        import aiohttp  # noqa: PLC0415

        sp = request.sampling
        prompt = self.fork_prompt_text(request.prompt_token_ids)
        # Only fields of the fork's SamplingParams: the server passes every other key to
        # SamplingParams(**request_dict) (api_server.py:56-58), which refuses unknown ones.
        body: dict[str, Any] = {
            "prompt": prompt,
            "stream": True,
            "max_tokens": sp.max_tokens,
            "temperature": sp.temperature,
            "top_p": sp.top_p,
            "ignore_eos": sp.ignore_eos,
        }
        if sp.stop:
            body["stop"] = list(sp.stop)
        if sp.seed is not None:
            body["seed"] = sp.seed
        rid = request.request_id
        steps, sent = 0, ""
        eos = self.tokenizer.eos_token_id if self.tokenizer is not None else None
        try:
            async with self._session.post(
                self.url + "/generate", json=body, headers={contract.REQUEST_ID_HEADER: rid}
            ) as resp:
                self._running[rid] = resp
                if resp.status != 200:
                    text = (await resp.text())[:500]
                    raise EngineError(f"the fork's /generate answered HTTP {resp.status}: {_vllm_message(text)}")
                async for line in resp.content:
                    line = line.strip()
                    if not line:
                        continue
                    full = json.loads(line)["text"][0]
                    if not full.startswith(prompt):
                        raise EngineError("the fork's /generate answered text that does not start with the prompt")
                    output = full[len(prompt) :]
                    delta, sent = output[len(sent) :], output
                    steps += 1
                    ids = self.tokenizer.encode(delta) if delta else []
                    token_id = ids[0] if ids else (eos if eos is not None else 0)
                    yield TokenEvent(token_id=int(token_id), text=delta, finish_reason=None)
        except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError) as e:
            if rid in self._cancelled:
                return
            raise EngineBroken(
                f"the fork's /generate dropped the stream ({self._detail or type(e).__name__}); retry on a healthy unit"
            ) from e
        finally:
            self._running.pop(rid, None)
            cancelled = rid in self._cancelled
            self._cancelled.discard(rid)
            self._last_request = time.monotonic()
        if cancelled:
            return
        # token_id -1: the finish reason only, not a token (the node's API does not count it).
        yield TokenEvent(token_id=-1, text="", finish_reason="length" if steps >= sp.max_tokens else "stop")

    def cancel(self, request_id: str) -> None:
        resp = self._running.get(request_id)
        if resp is not None:
            self._cancelled.add(request_id)
            resp.close()  # vLLM aborts a request whose client went away

    def health(self) -> EngineHealth:
        return EngineHealth(state=self._state, detail=self._detail)

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
        await terminate(self._proc)


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
    return EngineLoad(
        queue_depth=int(values.get("vllm:num_requests_waiting", 0)),
        running=int(values["vllm:num_requests_running"]),
        max_running=batch_size,
        kv_cache_used=min(1.0, max(0.0, kv)),
    )


def run_follower(membership: Membership, *, settings: NeuronEngineSettings, s3: Any = None) -> None:
    """A follower's formation: prepare the rank, then run the plan's worker command until it exits.

    The worker stays in this process's group, so the supervisor's killpg ends it with the formation.
    """
    s3 = s3 or _s3_client()
    prepared = _prepare(membership, settings, s3)
    argv, env = rank_argv(prepared.plan, dict(os.environ), settings.launcher)
    jlog("neuron_follower_spawn", logging.INFO, logger=log, rank=membership.rank, argv=argv[:4])
    rc = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, check=False).returncode
    if rc != 0:
        raise EngineBroken(f"neuron follower rank {membership.rank}: the worker exited with code {rc}")
