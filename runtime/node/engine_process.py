"""The supervisor's handle on one engine process (see engine_host): start, submit, cancel, kill.

Requests are relayed as JSON lines; each request gets its own queue of events. When the process
dies, every open request ends at once with a `broken` error, so no client waits on a dead unit.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator

import contract
from contract.ready import stall_bound
from runtime.engines.base import EngineState
from runtime.logs import jlog
from runtime.node.engine_config import CONFIG_ENV, EngineConfig
from runtime.node.engine_protocol import (
    Accepted,
    Cancel,
    Command,
    Done,
    Error,
    Failed,
    Following,
    Load,
    Progress,
    ProtocolError,
    Ready,
    RequestEvent,
    Shutdown,
    Submit,
    Token,
    decode_event,
    encode,
)

log = logging.getLogger("flotilla.node.engine")
REPO_ROOT = Path(__file__).resolve().parents[2]
# How long a step is remembered (StepTimes): long enough to span the gaps between a busy unit's long
# prefills, short enough that a unit whose load fell is soon held to short steps again.
STEP_WINDOW_S = 60.0


class StepTimes:
    """The engine's longest step while it held work (the wait between two of its tokens, or until a
    step that yielded none completed: EngineProcess._progress), over the last window_s to 2 x window_s
    seconds: two buckets, so a long step is forgotten a window or two after the last one like it."""

    __slots__ = ("_window", "_start", "_current", "_previous")

    def __init__(self, window_s: float = STEP_WINDOW_S) -> None:
        self._window = window_s
        self._start: float | None = None
        self._current = 0.0
        self._previous = 0.0

    def note(self, gap_s: float, now: float) -> None:
        self._roll(now)
        self._current = max(self._current, gap_s)

    def longest(self, now: float) -> float:
        self._roll(now)
        return max(self._current, self._previous)

    def _roll(self, now: float) -> None:
        if self._start is None:
            self._start = now
        elif now - self._start >= self._window:
            self._previous = self._current if now - self._start < 2 * self._window else 0.0
            self._current = 0.0
            self._start = now


@dataclass
class RequestStream:
    request_id: str
    events: asyncio.Queue = field(default_factory=asyncio.Queue)


class EngineProcess:
    def __init__(self, *, config: EngineConfig) -> None:
        self._config = config
        self.proc: asyncio.subprocess.Process | None = None
        self.ready = asyncio.Event()
        self.strategies: dict[str, Any] | None = None  # from the ready event (reference engine)
        self.resumes = False  # from the ready event: the engine continues requests other units started
        self.resumes_choices = False  # and continues each of n > 1 choices from its own tokens
        self.exited = asyncio.Event()
        self.load = Load(state=EngineState.STARTING)  # the engine's last load event
        self.failure: str = ""
        # While the engine starts: its last load progress (engine_host's "progress" event) and when
        # it came; None before the first and once ready.
        self.progress: Progress | None = None
        self.progress_at = 0.0
        self.last_report = time.monotonic()  # when the engine process last said anything
        # When the engine last made progress: a token, a completed step that yielded none (a chunk of a
        # long prompt's prefill: _loaded), or work arriving at an idle engine.
        self.last_progress = time.monotonic()
        self._load_at = 0.0  # when the last load report came (_loaded)
        # Evidence that every rank's engine lives, whatever its node answers (Supervisor): when this
        # leader's engine last completed a step (a token, or its step count rising: every rank's engine
        # takes part in a step), and when this follower's engine last heard from the leader's (Following).
        self.stepped_at = 0.0
        self.leader_heard_at = 0.0
        self.steps = StepTimes()  # its healthy pace: what the stall bound derives from
        self._streams: dict[str, RequestStream] = {}
        self._reader: asyncio.Task | None = None
        self._canaries = 0  # one-token requests sent so far (their ids: canary-<n>)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    async def start(self) -> None:
        env = dict(os.environ)
        env[CONFIG_ENV] = self._config.to_json()
        if self._config.cache_dir:
            env[contract.ENV_CACHE_DIR] = self._config.cache_dir
        env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "runtime.node.engine_host",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=env,
            limit=64 * 1024 * 1024,
            start_new_session=True,
        )
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.proc and self.proc.stdout
        try:
            while True:
                line = await self.proc.stdout.readline()
                if not line:
                    break
                ev = decode_event(line)
                self.last_report = time.monotonic()
                if isinstance(ev, (Token, Accepted, Done, Error)):
                    self._relay(ev)
                elif isinstance(ev, Load):
                    self._loaded(ev)
                elif isinstance(ev, Following):
                    self.leader_heard_at = self.last_report
                elif isinstance(ev, Progress):
                    self.progress, self.progress_at = ev, self.last_report
                elif isinstance(ev, Ready):
                    self.progress = None
                    self.strategies = ev.strategies
                    self.resumes = ev.resumes
                    self.resumes_choices = ev.resumes_choices
                    self.ready.set()
                elif isinstance(ev, Failed):
                    self.failure = ev.message
        except (ProtocolError, ValueError) as e:
            jlog("engine_protocol_error", logging.ERROR, logger=log, error=str(e))
        finally:
            rc = await self.proc.wait()
            self.load = Load(
                state=EngineState.STOPPED if rc == 0 else EngineState.BROKEN,
                detail=self.failure or f"engine process exited with code {rc}",
            )
            for s in list(self._streams.values()):
                s.events.put_nowait(
                    Error(
                        id=s.request_id,
                        kind="broken",
                        message=f"the unit's engine stopped mid-request ({self.load.detail}); retry on a healthy unit",
                    )
                )
            self._streams.clear()
            self.exited.set()

    def _loaded(self, ev: Load) -> None:
        """The engine's load report (every engine_host.LOAD_EVERY_S). One whose step count rose while
        the engine held work, with no token since the report before it, tells of a step that yielded no
        token: a chunk of a long prompt's prefill on an engine with nothing else to decode (the
        reference engine's chunked prefill, ReferenceEngine._plan_prefills). That is progress, not a
        hang, and the wait for it one step's time, known to within a report's interval. Where a token
        came since the report before, the tokens already told of the step, and to the millisecond."""
        if self.load.state is EngineState.BROKEN:
            # Broken is for good: a request that found the engine broken may arrive a moment before
            # the engine's own load report says so, and a "ready" report sent in that moment must not
            # make the unit routable again.
            return
        if ev.steps > self.load.steps:
            self.stepped_at = self.last_report
            if self.last_progress < self._load_at and self._holds_work(ev.running):
                self._progress()
        self.load, self._load_at = ev, self.last_report

    def _progress(self) -> None:
        """The engine made progress as its last report came: the wait since the last progress (a
        token, a step, or work reaching an idle engine; the idle time before that never) is one step's."""
        self.steps.note(self.last_report - self.last_progress, self.last_report)
        self.last_progress = self.stepped_at = self.last_report

    def _relay(self, ev: RequestEvent) -> None:
        """A request's event to its stream (a canary's few events are dropped with its stream)."""
        if isinstance(ev, Token):
            self._progress()
        elif isinstance(ev, Error) and ev.kind == "broken":
            # Mark the unit unready before the client hears of the failure.
            self.load = Load(state=EngineState.BROKEN, detail=ev.message)
        s = self._streams.get(ev.id)
        if s is not None:
            s.events.put_nowait(ev)
            if isinstance(ev, (Done, Error)):
                self._streams.pop(ev.id, None)

    def load_progress(self) -> Progress | None:
        """The engine's last load progress with its phase time brought up to now (a load that
        reports rarely still shows its clock running)."""
        if self.progress is None or self.ready.is_set() or not self.alive:
            return None
        since = time.monotonic() - self.progress_at
        return self.progress.model_copy(update={"phase_s": round(self.progress.phase_s + since, 1)})

    def step_s(self) -> float:
        """The engine's longest step while it held work, lately (StepTimes)."""
        return self.steps.longest(time.monotonic())

    def stall_after(self, floor_s: float, ceiling_s: float = math.inf) -> float:
        """Seconds without progress after which the engine counts as stalled: derived from its own
        longest recent step (contract.ready.stall_bound), so a busy engine's long steps are not taken
        for a hang, within floor_s..ceiling_s."""
        return stall_bound(floor_s, self.step_s(), ceiling_s)

    def stalled(self, floor_s: float, ceiling_s: float = math.inf) -> bool:
        """The engine holds requests (running, or submitted and not yet at their first token: a
        canary on an idle unit, or work sent to an engine that hung while idle) but made no progress
        (no token, no completed step) for longer than stall_after() (a gray failure: its process
        answers, its steps do not complete: a stopped member, a stuck collective, a hung engine)."""
        return self.held_without_progress_s() > self.stall_after(floor_s, ceiling_s)

    def held_without_progress_s(self) -> float:
        """Seconds the engine has held requests (running, or submitted and not yet at their first
        token) without producing a token or completing a step; 0 while it holds none."""
        if self._holds_work(self.load.running):
            return time.monotonic() - self.last_progress
        return 0.0

    def _holds_work(self, running: int) -> bool:
        """Whether the engine holds requests: `running` in its batch, or streams not yet ended."""
        return running > 0 or bool(self._streams)

    def canary(self, idle_s: float) -> bool:
        """After `idle_s` without a request or a token, send the engine a one-token request so an
        engine that hung while idle is noticed (stalled() then holds once its bound passes): at most
        one open at a time and one per `idle_s`. It never passes through the API, so no request
        metric, log line or queue estimate counts it; nothing reads its answer, which ends its stream.
        True if one was sent."""
        if idle_s <= 0 or self._streams or not self.ready.is_set() or not self.alive:
            return False
        if time.monotonic() - self.last_progress < idle_s:
            return False
        self._canaries += 1
        self.submit(
            f"canary-{self._canaries}",
            correlation_id="canary",
            canary=True,
            prompt=".",
            max_tokens=1,
            default_max_tokens=1,
            temperature=0.0,
            top_p=1.0,
            seed=None,
            stop=[],
            ignore_eos=True,
        )
        return True

    @property
    def returncode(self) -> int | None:
        """The engine process's exit status once it has exited, else None."""
        return self.proc.returncode if self.proc is not None and self.exited.is_set() else None

    @property
    def alive(self) -> bool:
        return self.proc is not None and not self.exited.is_set()

    def _send(self, cmd: Command) -> bool:
        if not self.alive or self.proc is None or self.proc.stdin is None:
            return False
        try:
            self.proc.stdin.write(encode(cmd))
            return True
        except (ConnectionError, RuntimeError):
            return False

    def submit(self, request_id: str, **payload: Any) -> RequestStream:
        """Relay one request; its events arrive on the returned stream. `request_id` keys the stream
        and must be unique among the requests in flight (the server generates it; a client's
        X-Request-Id travels in the payload as `correlation_id`, for the logs only)."""
        if request_id in self._streams:
            raise ValueError(f"request id {request_id!r} is already in flight: ids must be generated unique")
        s = RequestStream(request_id)
        if not self._streams:
            self.last_progress = time.monotonic()  # an idle engine's clock starts with its first request
        self._streams[request_id] = s
        if not self._send(Submit(id=request_id, **payload)):
            self._streams.pop(request_id, None)
            s.events.put_nowait(
                Error(id=request_id, kind="broken", message="the unit's engine is not running; retry on a healthy unit")
            )
        return s

    def cancel(self, request_id: str) -> None:
        if request_id in self._streams:
            self._send(Cancel(id=request_id))

    async def events(self, s: RequestStream) -> AsyncIterator[RequestEvent]:
        while True:
            ev = await s.events.get()
            yield ev
            if isinstance(ev, (Done, Error)):
                return

    async def stop(self, *, grace_s: float = 10.0, reason: str = "") -> int | None:
        """Ask the engine to shut down cleanly; kill it if it has not exited after grace_s. Requests
        still in flight end with an `unavailable` error carrying `reason`."""
        if self.proc is None:
            return None
        if self.alive:
            self._send(Shutdown(reason=reason))
            if self.proc.stdin is not None:
                try:
                    self.proc.stdin.close()
                except (ConnectionError, RuntimeError):
                    pass
            try:
                await asyncio.wait_for(self.exited.wait(), grace_s)
            except asyncio.TimeoutError:
                self.kill()
        await self.exited.wait()
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            try:
                # The engine leads its own process group (setsid): take the whole group down with it.
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    async def kill_and_wait(self) -> None:
        self.kill()
        if self._reader is not None:
            await self.exited.wait()
