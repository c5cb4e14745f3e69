"""`echo`: a deterministic, model-free engine for exercising the node runtime's plumbing.

It is NOT a language model: the completion cycles through the prompt's own bytes. It is a real
multi-rank component, though: followers hold a TCP connection to the leader for the unit's life,
so a dead follower breaks the leader (EngineBroken) the way a dead collective peer does.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from typing import AsyncIterator, Sequence

from runtime.engines.base import (
    EngineBroken,
    EngineHealth,
    EngineLoad,
    EngineState,
    GenerationRequest,
    RequestRejected,
    TokenEvent,
)
from runtime.membership import Membership


class ByteTokenizer:
    """One token per UTF-8 byte; the chat template is plain tags."""

    eos_token_id: int | None = None

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, token_ids: Sequence[int]) -> str:
        return bytes(t % 256 for t in token_ids).decode("utf-8", errors="replace")

    def apply_chat_template(self, messages: Sequence[dict]) -> list[int]:
        text = "".join(f"<{m['role']}>{m['content']}\n" for m in messages) + "<assistant>"
        return self.encode(text)


class EchoEngine:
    resumes = True  # continues a request from tokens another unit generated (GenerationRequest.generated)

    def __init__(
        self,
        *,
        membership: Membership,
        model_name: str,
        max_running: int,
        form_timeout_s: float,
        load_s: float,
        max_context: int = 2048,
        step_s: float = 0.01,
    ) -> None:
        self.model_name = model_name
        self.max_context = max_context
        self.tokenizer = ByteTokenizer()
        self._m = membership
        self._max_running = max_running
        self._step_s = step_s
        self._form_timeout_s = form_timeout_s
        self._load_s = load_s  # a stand-in for loading a model: the engine is STARTING this long
        self._state = EngineState.STARTING
        self._detail = ""
        self._slots = asyncio.Semaphore(max_running)
        self._queued = 0
        self._running = 0
        self._cancelled: set[str] = set()
        self._server: asyncio.AbstractServer | None = None
        self._followers: dict[int, asyncio.StreamWriter] = {}
        self._broken = asyncio.Event()

    async def start(self) -> None:
        need = self._m.world_size - 1
        joined = asyncio.Event()
        if need == 0:
            joined.set()

        async def on_follower(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            hello = json.loads(await reader.readline())
            if hello.get("revision") != self._m.revision or hello.get("unit") != self._m.unit_id:
                writer.close()
                return
            self._followers[int(hello["rank"])] = writer
            if len(self._followers) == need:
                joined.set()
            await reader.read()  # EOF: the follower is gone
            if self._state is not EngineState.STOPPED:
                self._fail(f"follower rank {hello['rank']} disconnected")

        if need:
            self._server = await asyncio.start_server(
                on_follower, host="0.0.0.0", port=self._m.dist_port, reuse_address=True
            )
        try:
            await asyncio.wait_for(joined.wait(), self._form_timeout_s)
        except asyncio.TimeoutError:
            self._fail(f"only {len(self._followers)} of {need} followers joined in {self._form_timeout_s}s")
            raise EngineBroken(self._detail) from None
        if self._load_s > 0:
            await asyncio.sleep(self._load_s)
        for w in self._followers.values():
            w.write(b'{"op": "go"}\n')
        self._state = EngineState.READY

    def _fail(self, detail: str) -> None:
        if self._state is not EngineState.BROKEN:
            self._state, self._detail = EngineState.BROKEN, detail
            self._broken.set()

    async def check(self, request: GenerationRequest) -> None:
        """The echo engine samples nothing: fields that shape sampling are refused, not ignored."""
        sp = request.sampling
        for field, used in (
            ("n", sp.n > 1),
            ("logprobs", sp.logprobs is not None),
            ("response_format", sp.structured is not None),
            ("presence_penalty", bool(sp.presence_penalty)),
            ("frequency_penalty", bool(sp.frequency_penalty)),
        ):
            if used:
                raise RequestRejected(
                    f"'{field}' is not served by the echo engine (it repeats the prompt); leave it out", param=field
                )

    async def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        if self._state is not EngineState.READY:
            raise EngineBroken(f"engine is {self._state.value}: {self._detail}")
        sp = request.sampling
        prompt = request.prompt_token_ids
        if not prompt:
            raise RequestRejected("prompt is empty: give at least one token")
        if len(prompt) + sp.max_tokens > self.max_context:
            raise RequestRejected(
                f"prompt ({len(prompt)} tokens) + max_tokens ({sp.max_tokens}) exceeds the "
                f"context of {self.max_context}: shorten the prompt or lower max_tokens"
            )
        self._queued += 1
        try:
            await self._slots.acquire()
        finally:
            self._queued -= 1
        self._running += 1
        try:
            # A continuation starts where another unit stopped: its tokens' text already reached the client.
            out: list[int] = list(request.generated)
            text_sent = self.tokenizer.decode(out)
            for i in range(len(out), sp.max_tokens):
                if request.request_id in self._cancelled:
                    return
                if self._broken.is_set():
                    raise EngineBroken(self._detail)
                await asyncio.sleep(self._step_s)
                out.append(prompt[i % len(prompt)])
                text = self.tokenizer.decode(out)
                hit = next((s for s in sp.stop if s and s in text), None)
                if hit is not None:
                    cut = text[: text.index(hit)]
                    yield TokenEvent(out[-1], cut[len(text_sent) :], "stop")
                    return
                last = i == sp.max_tokens - 1
                yield TokenEvent(out[-1], text[len(text_sent) :], "length" if last else None)
                text_sent = text
        finally:
            self._running -= 1
            self._slots.release()
            self._cancelled.discard(request.request_id)

    def cancel(self, request_id: str) -> None:
        self._cancelled.add(request_id)

    def health(self) -> EngineHealth:
        return EngineHealth(self._state, self._detail)

    def load(self) -> EngineLoad:
        return EngineLoad(
            queue_depth=self._queued,
            running=self._running,
            max_running=self._max_running,
            kv_cache_used=self._running / self._max_running,
        )

    async def shutdown(self) -> None:
        self._state = EngineState.STOPPED
        for w in self._followers.values():
            try:
                w.write(b'{"op": "bye"}\n')
                w.close()
            except (ConnectionError, RuntimeError):
                pass
        if self._server is not None:
            self._server.close()


def run_echo_worker(membership: Membership, *, timeout_s: float) -> None:
    """A follower's loop: join the leader, stay until it says bye. Raises if the leader vanishes."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            sock = socket.create_connection((membership.dist_host, membership.dist_port), timeout=2.0)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise EngineBroken(
                    f"leader {membership.dist_host}:{membership.dist_port} unreachable for {timeout_s}s"
                ) from None
            time.sleep(0.1)
    sock.settimeout(None)
    f = sock.makefile("rwb")
    f.write(
        json.dumps({"rank": membership.rank, "unit": membership.unit_id, "revision": membership.revision}).encode()
        + b"\n"
    )
    f.flush()
    while True:
        line = f.readline()
        if not line:
            raise EngineBroken("leader connection lost")
        if json.loads(line).get("op") == "bye":
            return
