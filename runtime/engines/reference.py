"""The reference engine: PyTorch on CPU (shared memory or gloo), sharded per the plan.

Leader (rank 0): ReferenceEngine. One scheduler thread owns every collective call; it runs
iteration-level (continuous) batching: each iteration frees finished/cancelled sequences, admits
waiting requests that fit the KV-cache budget and prefills them, then runs one decode step for the
whole running batch. The asyncio side only enqueues requests and relays TokenEvents; it never
waits on a tensor. Followers (rank > 0): run_worker, which executes the broadcast steps.

Failure: a dead or wedged peer makes a collective raise (gloo reports a closed connection and the
shared-memory transport a released lock at once, a wedged peer after collective_timeout_s); every
waiting and running request then ends with EngineBroken and health() is BROKEN. An idle leader
sends a heartbeat every heartbeat_s, so a death is noticed without traffic and followers never time
out on a healthy idle leader.

Re-forming: after BROKEN or shutdown(), the process group is destroyed; a new ReferenceEngine /
run_worker in the same process forms a fresh group (tests/engine/test_failure.py proves it), so
the node does not need to restart its process. Opening the model (and refusing one that can never
be served) and forming the process group: reference_open.py.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import itertools
import logging
import threading
import time
from dataclasses import dataclass
from typing import AsyncIterator, Callable

import torch
import torch.distributed as dist

from runtime.engines.base import (
    DEFAULT_COLLECTIVE_TIMEOUT_S,
    DEFAULT_KV_BUDGET_TOKENS,
    DEFAULT_MAX_PREFILL_TOKENS,
    DEFAULT_MAX_RUNNING,
    EngineBroken,
    EngineError,
    EngineHealth,
    EngineLoad,
    EngineState,
    EngineUnavailable,
    GenerationRequest,
    RequestRejected,
    TokenEvent,
)
from runtime.engines.calibrate import AUTO, Calibration, calibrate, loading_pair
from runtime.engines.collectives import TRANSPORTS, Communicator
from runtime.engines.executor import OP_HEARTBEAT, OP_SHUTDOWN, ShardExecutor, StepCommand, StepResult
from runtime.engines.grammar import Grammars, Matcher
from runtime.engines.layout import ParallelPlan
from runtime.engines.prefix_cache import Plan, PrefixCache, block_hashes
from runtime.engines.reference_open import (
    agree,
    check_requested,
    connect_unit,
    form_process_group,
    open_model,
    open_tokenizer,
    plan_for,
    release_process_group,
)
from runtime.engines.sampling import Draws, choose
from runtime.engines.speculative import SeqSpeculation, SpeculationSettings, Speculator
from runtime.engines.text import TextTracker
from runtime.engines.validation import validate_request
from runtime.membership import Membership
from runtime.models.registry import ModelSource

log = logging.getLogger("flotilla.engine")

_END = object()


def run_worker(
    membership: Membership,
    *,
    model: str,
    prefill: str = AUTO,
    decode: str = AUTO,
    collective_timeout_s: float = DEFAULT_COLLECTIVE_TIMEOUT_S,
    start_timeout_s: float = 300.0,
    threads: int | None = None,
    collectives: str = "auto",
    heard: Callable[[], None] | None = None,
) -> None:
    """Follower main loop. Returns when the leader shuts down; raises EngineBroken on peer loss.
    `heard` is called as each of the leader's commands arrives (ShardExecutor.follower_loop)."""
    if membership.is_leader:
        raise ValueError("run_worker is for followers (rank > 0); rank 0 runs ReferenceEngine")
    if threads:
        torch.set_num_threads(threads)
    check_requested(prefill, decode)
    loading = loading_pair(prefill, decode)
    opened = open_model(model, membership.world_size, prefill=loading[0], decode=loading[1])
    source, plan = opened.source, opened.plan
    form_process_group(membership, collective_timeout_s=collective_timeout_s, start_timeout_s=start_timeout_s)
    comm: Communicator | None = None
    try:
        agree(source, plan, membership.rank, prefill, decode)
        comm = connect_unit(membership, collective_timeout_s, collectives)
        plan = plan_for(source, membership.world_size, *loading, comm)
        executor = ShardExecutor(plan=plan, rank=membership.rank, weights=source.weights, comm=comm)
        dist.barrier()
        log.info("rank %d ready: %s", membership.rank, plan.stage(membership.rank))
        executor.follower_loop(heard)
    except EngineError:
        raise
    except (RuntimeError, dist.DistError) as e:
        raise EngineBroken(f"rank {membership.rank}: the unit broke: {e}") from e
    finally:
        if comm is not None:
            comm.close()
        release_process_group()


@dataclass
class _Seq:
    """One choice of a request: its own KV cache (seq_id), sampler state and text."""

    index: int
    tracker: TextTracker
    draws: Draws
    matcher: Matcher | None = None  # structured output only
    counts: torch.Tensor | None = None  # penalties only: times each token was generated
    seq_id: int = -1
    generated: int = 0
    last_token: int = -1
    done: bool = False
    spec: SeqSpeculation | None = None  # speculative decoding: its lookup and this step's draft


@dataclass
class _Request:
    request: GenerationRequest
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    seqs: list[_Seq]
    per_seq: int  # KV tokens one choice reserves: prompt + max_tokens
    done: bool = False
    keys: list[bytes] | None = None  # the prompt's block keys (prefix cache), computed at first look
    cache: Plan | None = None  # from admission until the step of its prefill's last chunk ran
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache
    progress: int = 0  # prefill tokens whose KV the first choice holds (chunked prefill)
    decoding: bool = False  # its prefill has run to the end: its choices decode
    own: dict[int, tuple[int, ...]] | None = None  # a continuation of n > 1: each choice's tokens

    def prefills(self) -> list[tuple[list[_Seq], tuple[int, ...]]]:
        """The step's prefills for this request, each with the choices that sample from it: one for
        all choices (the others fork from the first), or, continuing n > 1 choices, one per choice."""
        if self.own is None:
            return [(self.seqs, self.prefill_ids)]
        prompt = self.request.prompt_token_ids
        return [([seq], prompt + self.own[seq.index]) for seq in self.seqs]

    @property
    def prefill_ids(self) -> tuple[int, ...]:
        return self.request.prefill_ids

    @property
    def need(self) -> int:  # KV tokens the request reserves while it runs: all its choices
        return self.per_seq * len(self.seqs)

    @property
    def admitted(self) -> bool:
        return self.seqs[0].seq_id >= 0

    def put(self, item) -> None:
        if isinstance(item, TokenEvent) and item.finish_reason is not None and self.cached_tokens:
            # usage counts prompt tokens only: a continuation's cached generated tokens are not
            item = dataclasses.replace(item, cached_tokens=min(self.cached_tokens, len(self.request.prompt_token_ids)))
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the client's loop is closed: nobody is listening any more
            pass


@dataclass
class _Chunk:
    """One step's prefill of one request: tokens start..end of ids onto the choices' first sequence
    (start: what its cache or its earlier chunks hold; end: the prompt's end, or the step's budget)."""

    st: _Request
    seqs: list[_Seq]  # the choices that sample from this prefill
    ids: tuple[int, ...]
    start: int
    end: int

    @property
    def final(self) -> bool:
        return self.end == len(self.ids)


class ReferenceEngine:
    """base.Engine for rank 0. Settings are keyword-only; see runtime/engines/__init__.py."""

    resumes = True  # continues a request from tokens another unit generated (GenerationRequest.generated)
    resumes_choices = True  # and each of n > 1 choices from its own tokens (GenerationRequest.resumed_choices)

    def __init__(
        self,
        membership: Membership,
        *,
        model: str,
        prefill: str = AUTO,
        decode: str = AUTO,
        kv_budget_tokens: int = DEFAULT_KV_BUDGET_TOKENS,
        max_running: int = DEFAULT_MAX_RUNNING,
        collective_timeout_s: float = DEFAULT_COLLECTIVE_TIMEOUT_S,
        heartbeat_s: float = 1.0,
        start_timeout_s: float = 300.0,
        threads: int | None = None,
        model_name: str | None = None,
        max_prefill_tokens: int = DEFAULT_MAX_PREFILL_TOKENS,
        collectives: str = "auto",
        prefix_caching: bool = True,
        speculation: SpeculationSettings | None = None,
    ) -> None:
        if not membership.is_leader:
            raise ValueError(f"ReferenceEngine runs on rank 0; rank {membership.rank} calls run_worker")
        check_requested(prefill, decode)
        if collectives not in TRANSPORTS:
            raise ValueError(f"collectives {collectives!r} is not one of {', '.join(TRANSPORTS)}")
        if kv_budget_tokens < 1 or max_running < 1 or max_prefill_tokens < 1:
            raise ValueError("kv_budget_tokens, max_running and max_prefill_tokens must be at least 1")
        if not 0 < heartbeat_s < collective_timeout_s:
            raise ValueError(
                f"heartbeat_s {heartbeat_s} must be positive and below "
                f"collective_timeout_s {collective_timeout_s}, or idle followers time out"
            )
        self.membership = membership
        self.model = model
        self.prefill, self.decode = prefill, decode
        self.kv_budget_tokens, self.max_running = kv_budget_tokens, max_running
        self.collective_timeout_s, self.heartbeat_s = collective_timeout_s, heartbeat_s
        self.start_timeout_s, self.threads = start_timeout_s, threads
        self.model_name = model_name or model
        # Prompt tokens prefilled per iteration: bounds how long running sequences wait for a decode
        # step. A prompt longer than what is left of it is prefilled in chunks over several
        # iterations, each followed by a decode step (chunked prefill, as vLLM schedules by default).
        self.max_prefill_tokens = max_prefill_tokens
        self.collectives = collectives
        # Prompt blocks kept after their prefill and copied into later prompts that start with them,
        # in the part of kv_budget_tokens running sequences do not reserve (None: off).
        self.prefix_cache: PrefixCache | None = PrefixCache() if prefix_caching else None
        self.speculator = Speculator(speculation)  # drafts and verifies (None: one token per step)
        self.transport = "none"  # after start(): shm or gloo (the unit's ranks' transport)
        self.max_context = 0
        self.tokenizer = None
        self.plan: ParallelPlan | None = None
        # After start(): the strategies in use and how they were chosen (with the measurements).
        self.calibration: Calibration | None = None
        self.executor: ShardExecutor | None = None  # rank 0's shard, once formed (tests read its caches)
        self._state = EngineState.STARTING
        self._detail = "not started"
        self._lock = threading.Condition()
        self._inbox: collections.deque = collections.deque()
        self._cancels: set[str] = set()
        self._stopping = False
        self._waiting: collections.deque[_Request] = collections.deque()
        self._running: dict[int, tuple[_Request, _Seq]] = {}  # by seq_id: every running choice
        self._prefilling: list[_Request] = []  # admitted, prompt partly prefilled: in admission order
        self._by_id: dict[str, _Request] = {}
        self._reserved = 0
        self._steps = 0  # steps completed (EngineLoad.steps)
        self._seq_ids = itertools.count(1)
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()

    # --- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        if self._thread is not None:
            raise EngineError("start() was already called; build a new engine to re-form a unit")
        if self.threads:
            torch.set_num_threads(self.threads)
        self._detail = "loading model"
        loading = loading_pair(self.prefill, self.decode)
        opened = await asyncio.to_thread(
            open_model, self.model, self.membership.world_size, prefill=loading[0], decode=loading[1]
        )
        source, self.plan = opened.source, opened.plan
        self.tokenizer = open_tokenizer(self.model, source)
        self.max_context = min(source.shape.max_position_embeddings, self.kv_budget_tokens)
        if self.model_name == self.model and source.name:
            self.model_name = source.name
        self._vocab = source.shape.vocab_size
        self._grammars = Grammars(self.tokenizer, self._vocab)
        self._thread = threading.Thread(
            target=self._scheduler_main, args=(source,), name="flotilla-scheduler", daemon=True
        )
        self._thread.start()
        await asyncio.to_thread(self._ready.wait)
        if self._state is not EngineState.READY:
            raise EngineBroken(f"engine failed to start: {self._detail}")

    async def shutdown(self) -> None:
        with self._lock:
            self._stopping = True
            self._lock.notify_all()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, self.collective_timeout_s + 5)
        with self._lock:
            if self._state is not EngineState.BROKEN:
                self._state, self._detail = EngineState.STOPPED, "shut down"

    def health(self) -> EngineHealth:
        return EngineHealth(state=self._state, detail=self._detail)

    def load(self) -> EngineLoad:
        with self._lock:
            cache = self.prefix_cache
            return EngineLoad(
                queue_depth=len(self._waiting) + len(self._inbox),
                running=len(self._running),
                max_running=self.max_running,
                kv_cache_used=self._reserved / self.kv_budget_tokens,
                prefix_cache_queries=cache.queries if cache is not None else 0,
                prefix_cache_hits=cache.hits if cache is not None else 0,
                steps=self._steps,
                **self.speculator.load(),
            )

    # --- requests ----------------------------------------------------------------------------
    def _validate(self, request: GenerationRequest) -> int:
        return validate_request(
            request,
            vocab=self._vocab,
            max_context=self.max_context,
            model_limit=self.plan.shape.max_position_embeddings,
            kv_budget_tokens=self.kv_budget_tokens,
            max_running=self.max_running,
        )

    def _replay(self, seq: _Seq, generated: tuple[int, ...]) -> None:
        """Bring a choice to where another unit left it: its text (what the client already has),
        grammar state, penalty counts and position, as if it had generated `generated` here."""
        for token in generated:
            if seq.matcher is not None:
                seq.matcher.consume(token)
            _, stopped = seq.tracker.add(token)
            if stopped or (seq.matcher is not None and seq.matcher.done):
                raise RequestRejected("the continuation's tokens already end the answer: nothing is left to generate")
            if seq.counts is not None:
                seq.counts[token] += 1
        seq.generated = len(generated)
        if generated:
            seq.last_token = generated[-1]

    def _refuse_unless_ready(self) -> None:
        if self._state is EngineState.BROKEN:
            raise EngineBroken(f"engine is broken: {self._detail}")
        if self._stopping:
            raise EngineUnavailable("the engine is shutting down, not ready")
        if self._state is not EngineState.READY:
            raise EngineUnavailable(f"engine is {self._state.value}, not ready")

    async def check(self, request: GenerationRequest) -> None:
        """Raise RequestRejected now for a request generate() would refuse (before any output)."""
        self._validate(request)
        if request.sampling.structured is not None:
            await asyncio.to_thread(self._grammars.grammar, request.sampling.structured)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        self._refuse_unless_ready()  # a cheap early answer; the check that counts is under the lock
        per_seq = self._validate(request)
        p = request.sampling
        grammar = None
        if p.structured is not None:
            # The first structured request builds llguidance's view of the vocabulary (~1 s): not on the loop.
            grammar = await asyncio.to_thread(self._grammars.grammar, p.structured)
        penalised = bool(p.presence_penalty or p.frequency_penalty)
        own = dict(request.resumed_choices) if request.resumed_choices else None
        seqs = [
            _Seq(
                index=i,
                tracker=TextTracker(self.tokenizer, p.stop),
                draws=Draws(p, i),
                matcher=self._grammars.matcher(grammar) if grammar is not None else None,
                counts=torch.zeros(self._vocab) if penalised else None,
            )
            for i in (sorted(own) if own is not None else range(p.n))
        ]
        for seq in seqs:
            self._replay(seq, own[seq.index] if own is not None else request.generated)
        st = _Request(
            request=request,
            loop=asyncio.get_running_loop(),
            queue=asyncio.Queue(),
            seqs=seqs,
            per_seq=per_seq,
            own=own,
        )
        with self._lock:
            # State check and enqueue under the lock _end_all holds while it changes the state and
            # empties the queues: a request is either failed by it or seen by the scheduler, never
            # left in an inbox nobody reads.
            self._refuse_unless_ready()
            if request.request_id in self._by_id:
                raise RequestRejected(f"request id {request.request_id!r} is already in flight")
            self._by_id[request.request_id] = st
            self._inbox.append(st)
            self._lock.notify_all()
        finished = False
        left = len(seqs)  # the stream ends when every choice has finished
        try:
            while True:
                item = await st.queue.get()
                if item is _END:
                    finished = True
                    return
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                if item.finish_reason is not None:
                    left -= 1
                    finished = left == 0
                yield item
                if finished:
                    return
        finally:
            if not finished:  # the consumer went away (client disconnect): free the slot
                self.cancel(request.request_id)

    def cached_tokens(self, request: GenerationRequest) -> int:
        """Tokens of the request's first prefill that the prefix cache holds now: what its admission
        would take from the cache if nothing were evicted or stored before it. The leader counts the
        rest as the prefill it has ahead (`prefill_tokens` of the ready body)."""
        cache = self.prefix_cache
        if cache is None:
            return 0
        ids = request.prefill_ids
        return cache.held(block_hashes(ids, cache.block_tokens), len(ids))

    def cancel(self, request_id: str) -> None:
        with self._lock:
            if request_id in self._by_id:
                self._cancels.add(request_id)
                self._lock.notify_all()

    # --- scheduler thread (owns every collective) ---------------------------------------------
    def _scheduler_main(self, source: ModelSource) -> None:
        executor = None
        comm: Communicator | None = None
        try:
            ws = self.membership.world_size
            if ws > 1:
                self._detail = f"forming the unit ({ws} ranks)"
                form_process_group(
                    self.membership,
                    collective_timeout_s=self.collective_timeout_s,
                    start_timeout_s=self.start_timeout_s,
                )
                loading = self.plan
                assert loading is not None  # set by start()
                agree(source, loading, 0, self.prefill, self.decode)
                comm = connect_unit(self.membership, self.collective_timeout_s, self.collectives)
                self.transport = comm.transport
                self.plan = plan_for(source, ws, loading.prefill, loading.decode, comm)
            executor = self.executor = ShardExecutor(plan=self.plan, rank=0, weights=source.weights, comm=comm)
            if ws > 1:
                dist.barrier()
            self._warm_up(executor)
            self.calibration = self._choose_strategies(executor)
            self.plan = executor.plan
            self._state, self._detail = EngineState.READY, ""
            self._ready.set()
            self._loop(executor)
            executor.leader_signal(OP_SHUTDOWN)
        except Exception as e:  # noqa: BLE001 - every failure must reach the waiting requests
            detail = str(e) if isinstance(e, EngineError) else f"{type(e).__name__}: {e}"
            log.error("engine broken: %s", detail)
            self._end_all(EngineState.BROKEN, detail, e if isinstance(e, EngineBroken) else EngineBroken(detail))
        finally:
            self._ready.set()
            if comm is not None:
                comm.close()
            release_process_group()
            if self._state is not EngineState.BROKEN:
                self._end_all(EngineState.STOPPED, "shut down", EngineUnavailable("the engine shut down"))

    def _warm_up(self, executor: ShardExecutor) -> None:
        seq = next(self._seq_ids)
        result = executor.leader_step(StepCommand(prefill=[(seq, 2, 3)], prefill_tokens=[[0, 1]]))
        token = int(result.prefill_logits[0].argmax())
        executor.leader_step(StepCommand(decode=[seq], decode_tokens=[token]))
        executor.leader_step(StepCommand(free=[seq]))

    def _choose_strategies(self, executor: ShardExecutor) -> Calibration:
        p, d = executor.plan.prefill, executor.plan.decode
        if self.membership.world_size == 1:
            return Calibration(prefill=p, decode=d, chosen_by="single rank", transport="none")
        if AUTO not in (self.prefill, self.decode):
            return Calibration(prefill=p, decode=d, chosen_by="setting", transport=self.transport)
        self._detail = "calibrating the strategies"
        return calibrate(
            executor, prefill=self.prefill, decode=self.decode, seq_ids=self._seq_ids, transport=self.transport
        )

    def _end_all(self, state: EngineState, detail: str, error: BaseException) -> None:
        """The engine stops serving: the new state and the end of every request it holds, in one
        step under the lock that generate() enqueues under."""
        with self._lock:
            self._state, self._detail = state, detail
            running = list({id(st): st for st, _ in self._running.values()}.values())
            pending = list(self._waiting) + running + list(self._inbox)
            self._waiting.clear(), self._running.clear(), self._inbox.clear(), self._prefilling.clear()
            self._by_id.clear(), self._cancels.clear()
            self._reserved = 0
        for st in pending:
            if not st.done:
                st.done = True
                st.put(error)

    def _finish(self, st: _Request, seq: _Seq, free: list[int]) -> None:
        """Release a choice's slot and budget now; its KV goes with the next command. The request
        is done when its last choice is."""
        if seq.done:
            return
        seq.done = True
        if seq.seq_id in self._running:
            del self._running[seq.seq_id]
            free.append(seq.seq_id)
        self._reserved -= st.per_seq
        if all(s.done for s in st.seqs):
            st.done = True
            self._by_id.pop(st.request.request_id, None)

    def _loop(self, executor: ShardExecutor) -> None:
        """The scheduler: each iteration takes new requests and cancels, admits what fits, and runs one
        step (this iteration's prefill chunks and every decoding sequence's next token) on every rank."""
        free: list[int] = []  # seq ids whose KV slots the next step frees on every rank
        last_traffic = time.monotonic()
        while True:
            with self._lock:
                if not (self._inbox or self._cancels or self._waiting or self._running or free or self._stopping):
                    self._lock.wait(timeout=self.heartbeat_s)
                if self._stopping:
                    return
                while self._inbox:
                    self._waiting.append(self._inbox.popleft())
                self._apply_cancels(free)
                decoding = self.speculator.plan([(st, seq) for st, seq in self._running.values() if st.decoding])
                chunks = self._plan_prefills()
            if not (chunks or decoding or free):
                if time.monotonic() - last_traffic >= self.heartbeat_s:
                    executor.leader_signal(OP_HEARTBEAT)
                    last_traffic = time.monotonic()
                continue
            cmd = self._step_command(chunks, decoding, free)
            free = []
            result = executor.leader_step(cmd)
            last_traffic = time.monotonic()
            with self._lock:
                self._after_step(chunks, decoding, result, free)
                self._steps += 1  # a step whose chunks end no prompt yields no token, and is progress all the same

    def _apply_cancels(self, free: list[int]) -> None:
        """Cancelled requests end: a queued one leaves the queue, a running one frees its sequences."""
        for rid in self._cancels:
            st = self._by_id.get(rid)
            if st is None or st.done:
                continue
            if not st.admitted:  # still queued: nothing reserved yet
                self._waiting.remove(st)
                st.done = True
                self._by_id.pop(rid, None)
            else:
                for seq in st.seqs:
                    self._finish(st, seq, free)
                if not st.decoding:  # cancelled between chunks of its prefill
                    self._prefilling.remove(st)
                    if st.cache is not None and self.prefix_cache is not None:
                        self.prefix_cache.release(st.cache.pinned)  # blocks never stored are dropped
                        st.cache = None
            st.put(_END)
        self._cancels.clear()

    def _plan_prefills(self) -> list[_Chunk]:
        """This step's prefill chunks within max_prefill_tokens: first the prompts already under
        way, in admission order, then the queue's head requests that fit (vLLM's order: running
        requests before waiting ones). A prompt gets what is left of the budget and continues at
        the next step; a continuation of n > 1 choices is prefilled whole."""
        budget = self.max_prefill_tokens
        chunks: list[_Chunk] = []
        for st in self._prefilling:
            if budget <= 0:
                break
            end = min(len(st.prefill_ids), st.progress + budget)
            chunks.append(_Chunk(st, st.seqs, st.prefill_ids, st.progress, end))
            budget -= end - st.progress
        for st in self._admit(budget, alone=not chunks):  # each admitted with budget left (> 0) for it
            for seqs, ids in st.prefills():
                end = len(ids) if st.own is not None else min(len(ids), st.progress + budget)
                chunks.append(_Chunk(st, seqs, ids, st.progress, end))
                budget -= end - st.progress
            if st.own is None:
                self._prefilling.append(st)
        return chunks

    def _admit(self, budget: int, *, alone: bool) -> list[_Request]:
        """The queue's head requests that fit the batch slots, the KV budget and this step's prefill
        budget (what is left of it: a prompt that does not fit whole starts with a chunk), in
        arrival order, each with its sequences numbered, its prefix-cache hit planned and its
        sequences in the batch. `alone`: no other prefill runs this step, so a request that
        cannot be chunked goes even when it is larger than the budget."""
        admitted: list[_Request] = []
        slots = 0
        while self._waiting and len(self._running) + slots + len(self._waiting[0].seqs) <= self.max_running:
            st = self._waiting[0]
            if budget <= 0:
                break  # the rest joins at a later iteration
            hit = self._match(st)
            if not self._fits(st.need):
                self._unmatch(hit)
                break  # FIFO: the head waits for budget rather than being overtaken
            prompt = sum(len(ids) - len(hit) * self._block_tokens for _, ids in st.prefills())
            if st.own is not None and prompt > budget and not (alone and not admitted):
                self._unmatch(hit)
                break
            budget -= prompt
            slots += len(st.seqs)
            self._waiting.popleft()
            for seq in st.seqs:
                seq.seq_id = next(self._seq_ids)
                self._running[seq.seq_id] = (st, seq)
            self._reserved += st.need
            self._plan_cache(st, hit)
            st.progress = st.cached_tokens
            admitted.append(st)
        return admitted

    def _step_command(self, chunks: list[_Chunk], decoding: list, free: list[int]) -> StepCommand:
        # A request's first choice is prefilled; the others start as copies of its KV cache after
        # its last chunk, so n choices cost one prefill (continued choices each have their own tokens).
        cmd = StepCommand(
            free=free,
            prefill=[(c.seqs[0].seq_id, c.end, c.st.per_seq) for c in chunks],
            prefill_tokens=[c.ids[: c.end] for c in chunks],
            decode=[seq.seq_id for _, seq in decoding],
            decode_tokens=[seq.last_token for _, seq in decoding],
            fork=[(c.seqs[0].seq_id, seq.seq_id) for c in chunks if c.final for seq in c.seqs[1:]],
            cached=[c.start for c in chunks],
            ongoing=[c.seqs[0].seq_id for c in chunks if not c.final],
            **self.speculator.orders(decoding),
        )
        if self.prefix_cache is not None:
            self._cache_orders(self.prefix_cache, cmd, chunks)
        return cmd

    def _after_step(self, chunks: list[_Chunk], decoding: list, result: StepResult, free: list[int]) -> None:
        """A prompt whose last chunk ran: its cached blocks are unpinned and every choice samples its
        first token from the prefill (shared or its own). Every decoding sequence samples its next."""
        cache = self.prefix_cache
        for c in chunks:
            c.st.progress = c.end
            if c.final and not c.st.decoding:
                st = c.st
                st.decoding = True
                if st in self._prefilling:
                    self._prefilling.remove(st)
                if cache is not None and st.cache is not None:  # its blocks are copied in and stored on every rank
                    cache.done(st.cache)
                    st.cache = None
        for i, c in enumerate(chunks):
            if c.final:
                for seq in c.seqs:
                    self._advance(c.st, seq, result.prefill_logits[i], free=free)
        rows = iter(result.decode_logits if result.decode_logits is not None else [])  # 1 + k if k drafted
        for st, seq in decoding:
            self.speculator.take(seq, rows, functools.partial(self._advance, st, seq, free=free))

    # --- prefix cache (leader's index; the ranks hold the blocks: executor.ShardExecutor.blocks) ---
    @property
    def _block_tokens(self) -> int:
        return self.prefix_cache.block_tokens if self.prefix_cache is not None else 0

    def _match(self, st: _Request) -> list[int]:
        """The cached blocks the head of the queue would start from (pinned until admitted or let go)."""
        if self.prefix_cache is None:
            return []
        # A continuation's keys run over prompt + generated: a unit that holds the prompt's blocks
        # re-prefills only the generated part.
        if st.keys is None:
            st.keys = block_hashes(st.prefill_ids, self.prefix_cache.block_tokens)
        return self.prefix_cache.match(st.keys, len(st.prefill_ids))

    def _unmatch(self, hit: list[int]) -> None:
        if hit and self.prefix_cache is not None:
            self.prefix_cache.release(hit)

    def _fits(self, need: int) -> bool:
        """need more tokens of the KV budget fit, evicting unpinned cached blocks if that is enough."""
        cache = self.prefix_cache
        held = cache.tokens if cache is not None else 0
        over = self._reserved + held + need - self.kv_budget_tokens
        if over <= 0:
            return True
        if cache is None or cache.evictable_tokens < over:
            return False
        cache.evict(over)
        return True

    def _plan_cache(self, st: _Request, hit: list[int]) -> None:
        """An admitted prompt: count its query, and keep its new full blocks in the budget left
        (evicting the least recently used unpinned blocks for them)."""
        cache = self.prefix_cache
        if cache is None or st.keys is None:
            return
        if not st.request.canary:
            cache.count(len(st.prefill_ids), len(hit))
        room = self.kv_budget_tokens - self._reserved - cache.tokens + cache.evictable_tokens
        store = cache.allocate(st.keys, len(hit), room)
        over = self._reserved + cache.tokens - self.kv_budget_tokens
        if over > 0:
            cache.evict(over)
        st.cache = Plan(hit=hit, store=store)
        st.cached_tokens = len(hit) * cache.block_tokens

    @staticmethod
    def _cache_orders(cache: PrefixCache, cmd: StepCommand, chunks: list[_Chunk]) -> None:
        """The step's prefix-cache orders for every rank: drop evicted blocks, copy hits in with a
        prompt's first chunk, store new blocks after its last (the prompt's KV is whole then, and
        still in the prefill layout). A request's blocks are its prompt's: each of its prefills
        starts from the same hits, and the first stores the new ones."""
        cmd.drop = cache.take_dropped()
        for c in chunks:
            st, seq_id, plan = c.st, c.seqs[0].seq_id, c.st.cache
            assert plan is not None, "a request keeps its cache plan until its prefill's last chunk (bug)"
            if c.start == st.cached_tokens:
                cmd.load += [(seq_id, i, b) for i, b in enumerate(plan.hit)]
            if c.final and c.seqs[0] is st.seqs[0]:
                cmd.store += [(seq_id, i, b) for i, b in plan.store]

    def _advance(self, st: _Request, seq: _Seq, logits: torch.Tensor, *, free: list[int]) -> None:
        if seq.done:  # cancelled while its step ran
            return
        p = st.request.sampling
        allowed = seq.matcher.allowed() if seq.matcher is not None else None
        if allowed is not None and not bool(allowed.any()):
            # The grammar admits nothing more (it should have ended with EOS): end the choice cleanly.
            self._finish(st, seq, free)
            st.put(TokenEvent(token_id=-1, text=seq.tracker.flush(), finish_reason="stop", index=seq.index))
            return
        token, logprob = choose(logits, p, seq.draws.at(seq.generated), allowed=allowed, counts=seq.counts)
        seq.generated += 1
        seq.last_token = token
        if seq.counts is not None:
            seq.counts[token] += 1
        eos = self.tokenizer.eos_token_id
        i = seq.index
        if token == eos and (not p.ignore_eos or seq.matcher is not None):
            self._finish(st, seq, free)
            st.put(TokenEvent(token_id=token, text=seq.tracker.flush(), finish_reason="stop", index=i, logprob=logprob))
            return
        if seq.matcher is not None:
            seq.matcher.consume(token)
        text, stopped = seq.tracker.add(token)
        if stopped or (seq.matcher is not None and seq.matcher.done):
            self._finish(st, seq, free)
            if not stopped:
                text += seq.tracker.flush()
            st.put(TokenEvent(token_id=token, text=text, finish_reason="stop", index=i, logprob=logprob))
        elif seq.generated >= p.max_tokens:
            self._finish(st, seq, free)
            st.put(
                TokenEvent(
                    token_id=token, text=text + seq.tracker.flush(), finish_reason="length", index=i, logprob=logprob
                )
            )
        else:
            st.put(TokenEvent(token_id=token, text=text, index=i, logprob=logprob))
