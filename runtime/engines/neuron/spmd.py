"""One node of a multi-node Neuron unit: NxD Inference split over every node, driven in lock-step.

The leader schedules (continuous batching; a batch slot is NxD Inference's `seq_id`), stamps each step
and broadcasts its inputs over the unit's gloo group; every node then calls the same NxD Inference
forward with identical inputs, as NxD Inference's multi-node example runs one process per node with
the same inputs (NXDI_2_28:examples/multi_node.md:47-49,106-145). The NeuronCores' own collectives
(NEURON_RT_ROOT_COMM_ID) join the nodes' shards inside that forward; a node that skipped a step or saw
other inputs would leave them waiting, so the loop never lets one node step alone.

Runs with the image's Python, the one that has NxD Inference: it imports the standard library and
torch only (NxD Inference where it is built), never the flotilla package.

NXDI_2_28 = aws-neuron/neuronx-distributed-inference@cd3abf30558fe1a14dadfb1397c2118e3fcfcc11 (SDK 2.28.0).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import queue
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Protocol

import torch
import torch.distributed as dist

if __package__:  # imported as the package's module (tests, the image's import check)
    from runtime.engines.neuron import loop_wire
else:  # run as a script: its own folder is sys.path[0], and the flotilla package stays out
    import loop_wire  # type: ignore[import-not-found,no-redef]

# What a step is, on the wire: [kind, step number, batch, width] then the tensors. IDLE carries no
# tensors: it only tells the followers the leader is alive.
KIND_STOP, KIND_CONTEXT, KIND_TOKEN, KIND_IDLE = 0, 1, 2, 3
# Every wait on a peer is bounded: a follower that hears nothing this long raises out of the gloo
# broadcast and exits 1, and the node re-forms the unit. The leader, while idle, sends IDLE every
# KEEPALIVE_S, well inside that bound, and inside the node's peer deadline (FLOTILLA_PEER_DEAD_AFTER_S,
# 3 s): a follower's node hears its idle leader's loop through them (loop_wire.Following), so a leader
# whose node is only slow does not end an idle unit's formation either (docs/node.md, "Slow is not
# dead"). Four integers a second cost nothing. A forward is bounded the same way (StepWatchdog): its
# collectives are the Neuron runtime's, which flotilla cannot time out from Python.
STEP_TIMEOUT_S = 120.0
KEEPALIVE_S = 1.0


class StepMismatch(RuntimeError):
    """A node received a step that does not follow the last one: the unit must re-form."""


@dataclass(frozen=True)
class Step:
    """One forward's inputs, identical on every node.

    sampling_params: [batch, 3] float32 as NxD Inference stacks them, top_k, top_p, temperature
    (NXDI_2_28:src/neuronx_distributed_inference/modules/generation/sampling.py:185-199).
    """

    number: int
    input_ids: torch.Tensor  # [batch, width] int64
    position_ids: torch.Tensor  # [batch, width] int64
    seq_ids: torch.Tensor  # [batch] int64: the batch slot of each row
    sampling_params: torch.Tensor  # [batch, 3] float32

    @property
    def kind(self) -> int:
        # NxD Inference's own test for context encoding: more than one token and positions from 0
        # (NXDI_2_28:src/neuronx_distributed_inference/models/model_base.py:3388).
        width = self.input_ids.shape[-1]
        return KIND_CONTEXT if width > 1 and int(self.position_ids.min()) == 0 else KIND_TOKEN

    def attention_mask(self) -> torch.Tensor:
        """The mask NxD Inference infers from position_ids (model_base.py:3527-3541), passed explicitly."""
        batch, width = self.position_ids.shape
        if width != 1:
            compare = self.position_ids
            length = width
        else:
            length = int(self.position_ids.max())
            compare = self.position_ids.expand(batch, length) - 1
        mask = torch.arange(length).view(1, -1).expand(batch, length)
        return (compare >= mask).to(dtype=self.position_ids.dtype)


IDLE = object()  # what a follower receives for a keep-alive


def broadcast_step(
    step: Step | None | object, *, is_leader: bool, expect: int | None = None, group: Any = None
) -> Step | None | object:
    """The leader sends `step` (None: stop, IDLE: keep-alive); a follower receives it and checks the stamp."""
    header = torch.zeros(4, dtype=torch.int64)
    if is_leader:
        if step is None:
            header[0] = KIND_STOP
        elif step is IDLE:
            header[0] = KIND_IDLE
        else:
            assert isinstance(step, Step)
            header[:] = torch.tensor([step.kind, step.number, *step.input_ids.shape])
    dist.broadcast(header, src=0, group=group)
    kind, number, batch, width = (int(v) for v in header)
    if kind == KIND_STOP:
        return None
    if kind == KIND_IDLE:
        return IDLE
    if not is_leader and expect is not None and number != expect:
        raise StepMismatch(f"received step {number}, expected {expect}: this node missed a step")
    ids = torch.empty(3, batch, width, dtype=torch.int64)
    params = torch.empty(batch, 3, dtype=torch.float32)
    if is_leader:
        assert isinstance(step, Step)
        ids[0], ids[1] = step.input_ids, step.position_ids
        ids[2, :, 0] = step.seq_ids
        params.copy_(step.sampling_params)
    dist.broadcast(ids, src=0, group=group)
    dist.broadcast(params, src=0, group=group)
    if is_leader:
        return step
    return Step(number, ids[0].clone(), ids[1].clone(), ids[2, :, 0].clone(), params)


class CausalLM(Protocol):
    """The part of NxD Inference's NeuronBaseForCausalLM the loop calls
    (NXDI_2_28:src/neuronx_distributed_inference/models/model_base.py:3355-3379)."""

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        seq_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        sampling_params: torch.Tensor | None = None,
    ) -> Any: ...


def greedy(params: torch.Tensor) -> torch.Tensor:
    """Rows whose parameters mean the most likely token (top_k 1 or temperature 0)."""
    return (params[:, 0] == 1) | (params[:, 2] == 0)


# Top-p over the whole vocabulary first looks at this many most likely tokens: when they already
# hold more than top_p of the probability, the nucleus lies among them and the full sort of the row
# (128k tokens for Llama 3) is skipped. The result is the same either way.
NUCLEUS_CANDIDATES = 1024


def sample_on_host(logits: torch.Tensor, params: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Each row with its own top_k / top_p / temperature; greedy rows take the arg max.

    A row keeps its top_k most likely tokens (top_k 0: all), scales by 1/temperature, then keeps the
    smallest set of most likely tokens whose probability exceeds top_p (the first token always), and
    draws from what is left, renormalised."""
    out = torch.argmax(logits, dim=-1)
    for i in range(logits.shape[0]):
        if bool(greedy(params[i : i + 1])[0]):
            continue
        top_k, top_p, temperature = int(params[i, 0]), float(params[i, 1]), float(params[i, 2])
        row = logits[i].float() / temperature
        vocab = row.shape[-1]
        if 0 < top_k < vocab:
            values, ids = torch.topk(row, top_k)  # sorted, most likely first
            probs = torch.softmax(values, dim=-1)
        elif top_p < 1.0:
            k = min(vocab, NUCLEUS_CANDIDATES)
            values, ids = torch.topk(row, k)
            probs = torch.exp(values - torch.logsumexp(row, dim=-1))
            if k < vocab and float(probs.sum()) <= top_p:  # the nucleus reaches past the candidates
                values, ids = torch.sort(row, descending=True)
                probs = torch.softmax(values, dim=-1)
        else:
            ids, probs = torch.arange(vocab), torch.softmax(row, dim=-1)
        if top_p < 1.0:
            probs = probs.masked_fill(torch.cumsum(probs, 0) - probs > top_p, 0.0)
        out[i] = ids[torch.multinomial(probs / probs.sum(), 1, generator=generator)[0]]
    return out


# The most candidates NxD Inference's on-device sampler keeps per row, unless its config says otherwise
# (OnDeviceSamplingConfig global_topk, NXDI_2_28:src/neuronx_distributed_inference/models/config.py:1030).
DEFAULT_GLOBAL_TOPK = 256


def device_sampling_rows(params: torch.Tensor, global_topk: int) -> torch.Tensor:
    """The [batch, 3] rows as NxD Inference's on-device sampler must get them.

    The loop's top_k 0 means "no top-k"; the sampler reads 0 (and -1) as "uniform": it sorts the
    global_topk most likely tokens and masks every one at index >= top_k (NXDI_2_28:
    src/neuronx_distributed_inference/modules/generation/sampling.py:303-336), so top_k 0 masks them all
    and the draw is uniform ("top_k = -1 or top_k = 0 means randomly picking a token ... with a uniform
    distribution", :133-134). So 0 becomes global_topk, the most the device keeps. A top_k above
    global_topk is refused there (:127-131); it is capped, which keeps what the device can keep."""
    rows = params.clone()
    top_k = rows[:, 0]
    rows[:, 0] = torch.where((top_k <= 0) | (top_k > global_topk), torch.full_like(top_k, global_topk), top_k)
    return rows


def run_forward(model: CausalLM, step: Step, generator: torch.Generator) -> torch.Tensor:
    """Call NxD Inference's forward and return one token per row: the device's when it sampled
    (outputs.logits is None with on-device sampling, model_base.py:3863-3876), else sampled here."""
    out = model.forward(
        input_ids=step.input_ids,
        seq_ids=step.seq_ids,
        attention_mask=step.attention_mask(),
        position_ids=step.position_ids,
        sampling_params=step.sampling_params,
    )
    if getattr(out, "logits", None) is None:
        return out.tokens.reshape(step.input_ids.shape[0], -1)[:, -1].to(torch.int64)
    logits = out.logits
    if logits.dim() == 3:
        logits = logits[:, -1, :]
    return sample_on_host(logits, step.sampling_params, generator)


@dataclass
class Request:
    request_id: str
    prompt: list[int]
    max_tokens: int
    top_k: int = 1
    top_p: float = 1.0
    temperature: float = 1.0
    stop_token_ids: tuple[int, ...] = ()
    output: list[int] = field(default_factory=list)
    slot: int | None = None
    finished: bool = False

    @property
    def params(self) -> list[float]:
        return [float(self.top_k), float(self.top_p), float(self.temperature)]


class Scheduler:
    """Continuous batching over NxD Inference's batch slots (seq_ids 0..batch_size-1), as vllm-neuron
    drives it: a new request takes a free slot for its life and is encoded alone from position 0; later
    steps send one token per live slot with that slot as its seq_id (vllm-project/vllm-neuron@84411ab:
    vllm_neuron/worker/neuronx_distributed_model_runner.py, _process_new_request_for_continuous_batching
    and _process_cached_request_for_continuous_batching).

    A step either encodes one waiting prompt into a free slot (context encoding, positions from 0)
    or generates one token for every running slot (token generation). Prompts go first while a slot
    is free, so a new request waits at most one decode step. Rows are always in batch order and each
    row carries its own request's sampling parameters.
    """

    def __init__(self, *, batch_size: int, seq_len: int, global_topk: int | None = None) -> None:
        self.batch_size, self.seq_len = batch_size, seq_len
        # Set when NxD Inference samples on the device: its rows then go through device_sampling_rows.
        self.global_topk = global_topk
        self.waiting: list[Request] = []
        self.running: dict[int, Request] = {}  # slot -> request
        self.number = 0

    def add(self, request: Request) -> None:
        if not request.prompt:
            raise ValueError(f"request {request.request_id}: the prompt is empty; send at least one token")
        if len(request.prompt) + request.max_tokens > self.seq_len:
            raise ValueError(
                f"request {request.request_id}: prompt {len(request.prompt)} + max_tokens {request.max_tokens} "
                f"exceeds seq_len {self.seq_len}; lower max_tokens or shorten the prompt"
            )
        self.waiting.append(request)

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    def next_step(self) -> Step | None:
        free = [s for s in range(self.batch_size) if s not in self.running]
        if self.waiting and free:
            r = self.waiting.pop(0)
            r.slot = free[0]
            self.running[r.slot] = r
            n = len(r.prompt)
            step = Step(
                self.number,
                torch.tensor([r.prompt], dtype=torch.int64),
                torch.arange(n, dtype=torch.int64).view(1, n),
                torch.tensor([r.slot], dtype=torch.int64),
                torch.tensor([r.params], dtype=torch.float32),
            )
        elif self.running:
            rows = [self.running[s] for s in sorted(self.running)]
            step = Step(
                self.number,
                torch.tensor([[r.output[-1]] for r in rows], dtype=torch.int64),
                torch.tensor([[len(r.prompt) + len(r.output) - 1] for r in rows], dtype=torch.int64),
                torch.tensor([r.slot for r in rows], dtype=torch.int64),
                torch.tensor([r.params for r in rows], dtype=torch.float32),
            )
        else:
            return None
        if self.global_topk is not None:
            step = replace(step, sampling_params=device_sampling_rows(step.sampling_params, self.global_topk))
        self.number += 1
        return step

    def cancel(self, request_id: str) -> bool:
        """Drop a request wherever it is; its slot is free for the next step."""
        for r in self.waiting:
            if r.request_id == request_id:
                self.waiting.remove(r)
                return True
        for slot, r in list(self.running.items()):
            if r.request_id == request_id:
                del self.running[slot]
                return True
        return False

    def complete(self, step: Step, tokens: torch.Tensor) -> list[Request]:
        """Record each row's token; return the requests this step finished (their slots are free)."""
        done = []
        for slot, token in zip(step.seq_ids.tolist(), tokens.tolist()):
            r = self.running.get(slot)
            if r is None:  # cancelled while the step ran
                continue
            r.output.append(int(token))
            if len(r.output) >= r.max_tokens or int(token) in r.stop_token_ids:
                r.finished = True
                del self.running[slot]
                done.append(r)
        return done


def exit_stuck(node_rank: int, step: int, waited_s: float) -> None:
    """A forward has not returned: say so on stderr and end this process at once. The thread that runs
    the forward is inside the Neuron runtime and cannot be interrupted; the node sees the loop exit,
    ends the formation and re-forms the unit, which frees the NeuronCores."""
    line = {"event": "neuron_step_stuck", "node_rank": node_rank, "step": step, "waited_s": round(waited_s, 1)}
    print(json.dumps(line), file=sys.stderr, flush=True)
    os._exit(1)


class StepWatchdog:
    """Bounds every forward. A collective that stops making progress (a peer's NeuronCores wedged, a
    link down while every process lives) leaves each node inside its forward, where neither the gloo
    timeout nor the node's liveness checks reach: past timeout_s, on_stuck runs (exit_stuck: the loop
    exits 1). The Neuron runtime's own execution timeout is no bound to rely on: the SDK 2.28 runtime
    configuration page gives NEURON_RT_EXEC_TIMEOUT a default of 30 s in its table, 2 s in its text and
    shows a 600000 ms timeout in its log example (aws-neuron/aws-neuron-sdk@86a9286833dc2a1cd23b674f7081061924aa587a,
    tag v2.28.0: neuron-runtime/nrt-configurable-parameters.rst:48-52, 165-168, 182)."""

    def __init__(self, *, node_rank: int, timeout_s: float, on_stuck: Callable[[int, int, float], None]) -> None:
        self.node_rank, self.timeout_s, self.on_stuck = node_rank, timeout_s, on_stuck
        self._lock = threading.Lock()
        self._step: int | None = None
        self._since = 0.0
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None

    def running(self, step: int) -> None:
        with self._lock:
            self._step, self._since = step, time.monotonic()
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="step-watchdog", daemon=True)
            self._thread.start()

    def done(self) -> None:
        with self._lock:
            self._step = None

    def close(self) -> None:
        """End the watch (its thread exits within one poll); a forward after this is not bounded."""
        self._closed.set()

    def _watch(self) -> None:
        poll = min(1.0, self.timeout_s / 4)
        # Event.wait, not time.sleep: close() ends the wait at once, and the watch keeps its pace
        # whatever else in the process does to the time module.
        while not self._closed.wait(poll):
            with self._lock:
                step, waited = self._step, time.monotonic() - self._since
            if step is not None and waited > self.timeout_s:
                self.on_stuck(self.node_rank, step, waited)
                return


class Node:
    """This node's part of the unit: the leader steps and broadcasts, a follower mirrors it."""

    def __init__(
        self,
        model: CausalLM,
        *,
        node_rank: int,
        seed: int = 0,
        group: Any = None,
        step_timeout_s: float = STEP_TIMEOUT_S,
        on_stuck: Callable[[int, int, float], None] = exit_stuck,
    ) -> None:
        self.model = model
        self.group = group  # the gloo group the steps go over (None: the default group)
        self.node_rank = node_rank
        self.is_leader = node_rank == 0
        self.generator = torch.Generator().manual_seed(seed)
        self.steps = 0
        self.watchdog = StepWatchdog(node_rank=node_rank, timeout_s=step_timeout_s, on_stuck=on_stuck)

    def _forward(self, step: Step) -> torch.Tensor:
        self.watchdog.running(step.number)
        try:
            return run_forward(self.model, step, self.generator)
        finally:
            self.watchdog.done()

    def step(self, step: Step) -> torch.Tensor:
        """Leader: stamp-check, broadcast, run the same forward as every follower."""
        assert self.is_leader, "only the leader steps the unit"
        if step.number != self.steps:
            raise StepMismatch(f"the scheduler stamped step {step.number}, the unit is at {self.steps}")
        broadcast_step(step, is_leader=True, group=self.group)
        self.steps += 1
        return self._forward(step)

    def stop(self) -> None:
        broadcast_step(None, is_leader=True, group=self.group)

    def close(self) -> None:
        """End this node's step watch: for a node object dropped while its process goes on."""
        self.watchdog.close()

    def keepalive(self) -> None:
        broadcast_step(IDLE, is_leader=True, group=self.group)

    def follow(self, heard: Callable[[], None] = lambda: None) -> int:
        """Follower: run every step the leader broadcasts until it says stop; return the step count.
        `heard` is called as each broadcast (a step or a keep-alive) arrives: the leader's loop lives."""
        assert not self.is_leader, "the leader does not follow"
        while True:
            step = broadcast_step(None, is_leader=False, expect=self.steps, group=self.group)
            heard()
            if step is None:
                return self.steps
            if step is IDLE:
                continue
            assert isinstance(step, Step)
            self._forward(step)
            self.steps += 1

    def serve(self, scheduler: Scheduler, on_done: Callable[[Request], None] = lambda r: None) -> None:
        """Leader: step until every request the scheduler holds has finished."""
        while (step := scheduler.next_step()) is not None:
            for r in scheduler.complete(step, self.step(step)):
                on_done(r)


def generate(node: Node, scheduler: Scheduler, requests: Iterable[Request]) -> dict[str, list[int]]:
    """Leader: run these requests to the end with continuous batching; their output tokens by id."""
    out: dict[str, list[int]] = {}
    for r in requests:
        scheduler.add(r)
    node.serve(scheduler, lambda r: out.__setitem__(r.request_id, list(r.output)))
    return out


def join_unit(*, node_rank: int, nodes: int, join_timeout_s: float) -> Any:
    """The unit's gloo group (MASTER_ADDR / MASTER_PORT from the plan), as NxD Inference's demo forms
    it (NXDI_2_28:src/neuronx_distributed_inference/inference_demo.py:788-795). Joined once this node
    has loaded: the join waits for the slowest node's compile or load (bounded by join_timeout_s); the
    steps then go over a group whose every wait is bounded by STEP_TIMEOUT_S."""
    dist.init_process_group(
        backend="gloo", rank=node_rank, world_size=nodes, timeout=datetime.timedelta(seconds=join_timeout_s)
    )
    return dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=STEP_TIMEOUT_S))


# The load phases this loop reports, one loop_wire.Progress line each.
PHASE_COMPILE, PHASE_LOAD, PHASE_WARMUP, PHASE_JOIN = (
    loop_wire.PHASE_COMPILE,
    loop_wire.PHASE_LOAD,
    loop_wire.PHASE_WARMUP,
    loop_wire.PHASE_JOIN,
)


def build_model(
    model_path: str,
    compiled_model_path: str,
    neuron_config: dict[str, Any],
    progress: Callable[[str], None] = lambda phase: None,
) -> CausalLM:
    """NxD Inference's Llama: compile into this node's path unless a compiled model is there, then
    load this node's ranks (NXDI_2_28:src/neuronx_distributed_inference/models/application_base.py:
    292 compile, :317-318 load, :47 model.pt; models/llama/modeling_llama.py:312,1438;
    utils/hf_adapter.py:36). Loading and warm-up are two calls so the node can tell them apart:
    load(skip_warmup=True) skips only the warm-up, which warmup() then runs unless the config's own
    skip_warmup says not to, as load would have (application_base.py:317-343, :348)."""
    from neuronx_distributed_inference.models.config import NeuronConfig  # noqa: PLC0415 - image only
    from neuronx_distributed_inference.models.llama.modeling_llama import (  # noqa: PLC0415 - image only
        LlamaInferenceConfig,
        NeuronLlamaForCausalLM,
    )
    from neuronx_distributed_inference.utils.hf_adapter import load_pretrained_config  # noqa: PLC0415

    config = LlamaInferenceConfig(NeuronConfig(**neuron_config), load_config=load_pretrained_config(model_path))
    model = NeuronLlamaForCausalLM(model_path, config)
    if not os.path.exists(os.path.join(compiled_model_path, "model.pt")):
        progress(PHASE_COMPILE)
        model.compile(compiled_model_path)
    progress(PHASE_LOAD)
    model.load(compiled_model_path, skip_warmup=True)
    if not config.neuron_config.skip_warmup:
        progress(PHASE_WARMUP)
        model.warmup()
    return model


def serve_lines(
    node: Node,
    scheduler: Scheduler,
    inbox: "queue.Queue[str | None]",
    emit: Callable[[loop_wire.FromLoop], None],
) -> None:
    """Leader: take requests from `inbox` (the node runtime's lines, loop_wire.ToLoop), step while
    there is work, emit one loop_wire.Generated per generated token; IDLE to the followers every
    KEEPALIVE_S without work. None or a Stop in the inbox stops the unit."""
    while True:
        try:
            line = inbox.get(block=scheduler.idle, timeout=KEEPALIVE_S if scheduler.idle else None)
        except queue.Empty:
            if scheduler.idle:
                node.keepalive()
            line = ""
        while line is not None:
            if line and not _take(line, scheduler, emit):
                line = None
                break
            try:
                line = inbox.get_nowait()
            except queue.Empty:
                break
        if line is None:
            node.stop()
            return
        step = scheduler.next_step()
        if step is None:
            continue
        tokens = node.step(step)
        rows = dict(zip(step.seq_ids.tolist(), tokens.tolist()))
        by_slot = {slot: scheduler.running[slot] for slot in rows if slot in scheduler.running}
        done = {r.request_id for r in scheduler.complete(step, tokens)}
        for slot, r in by_slot.items():
            token = int(rows[slot])
            finish = None
            if r.request_id in done:
                finish = "stop" if token in r.stop_token_ids else "length"
            emit(loop_wire.Generated(r.request_id, token, finish))


def _take(line: str, scheduler: Scheduler, emit: Callable[[loop_wire.FromLoop], None]) -> bool:
    """One line from the node runtime; False when it says stop."""
    try:
        msg = loop_wire.read_to_loop(line)
    except loop_wire.BadMessage as e:
        emit(loop_wire.Refused(e.id, str(e)))
        return True
    if isinstance(msg, loop_wire.Stop):
        return False
    if isinstance(msg, loop_wire.Add):
        try:
            scheduler.add(
                Request(
                    request_id=msg.id,
                    prompt=msg.prompt,
                    max_tokens=msg.max_tokens,
                    top_k=msg.top_k,
                    top_p=msg.top_p,
                    temperature=msg.temperature,
                    stop_token_ids=msg.stop_token_ids,
                )
            )
        except (TypeError, ValueError) as e:
            emit(loop_wire.Refused(msg.id, str(e)))
    elif isinstance(msg, loop_wire.Cancel):
        scheduler.cancel(msg.id)
    return True


def _read_lines(stream, inbox: "queue.Queue[str | None]") -> None:
    for line in stream:
        line = line.strip()
        if line:
            inbox.put(line)
    inbox.put(None)  # the node runtime went away: stop the unit


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="spmd.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--compiled-model-path", required=True)
    p.add_argument("--node-rank", type=int, required=True)
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--neuron-config", required=True, help="NeuronConfig fields as JSON (from the plan)")
    args = p.parse_args(argv)
    if not 0 <= args.node_rank < args.nodes:
        print(f"error: --node-rank {args.node_rank} must be in 0..{args.nodes - 1}", file=sys.stderr)
        return 2
    neuron_config = json.loads(args.neuron_config)
    # The leader's stdout carries the protocol only: whatever NxD Inference or the Neuron runtime
    # prints goes to stderr (fd 1 is pointed there; the protocol keeps a copy of the original).
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    started = time.monotonic()

    def progress(phase: str) -> None:
        # Every node's protocol carries its load phases: the node puts them in its ready body.
        protocol.write(loop_wire.from_loop_line(loop_wire.Progress(phase)))
        protocol.flush()

    model = build_model(args.model, args.compiled_model_path, neuron_config, progress)
    loaded = {"event": "neuron_node_loaded", "node_rank": args.node_rank, "s": round(time.monotonic() - started, 1)}
    print(json.dumps(loaded), file=sys.stderr, flush=True)
    # The node runtime's formation bound (runtime/node/settings.py), read here without importing flotilla.
    join_timeout_s = float(os.environ.get("FLOTILLA_FORM_TIMEOUT_S", "3600"))
    progress(PHASE_JOIN)
    group = join_unit(node_rank=args.node_rank, nodes=args.nodes, join_timeout_s=join_timeout_s)
    node = Node(model, node_rank=args.node_rank, group=group)
    if not node.is_leader:
        node.follow(_following(protocol))
        return 0
    # The leader talks to the node runtime over its stdin/stdout, one JSON object a line.
    out = protocol
    inbox: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=_read_lines, args=(sys.stdin, inbox), daemon=True).start()

    def emit(event: loop_wire.FromLoop) -> None:
        out.write(loop_wire.from_loop_line(event))
        out.flush()

    emit(loop_wire.Ready())
    serve_lines(node, scheduler_for(neuron_config), inbox, emit)
    return 0


def _following(protocol: Any, clock: Callable[[], float] = time.monotonic) -> Callable[[], None]:
    """A follower's `heard`: a Following line on the protocol at most every FOLLOWING_EVERY_S."""
    commands, sent_at = 0, -loop_wire.FOLLOWING_EVERY_S

    def heard() -> None:
        nonlocal commands, sent_at
        commands += 1
        now = clock()
        if now - sent_at >= loop_wire.FOLLOWING_EVERY_S:
            sent_at = now
            protocol.write(loop_wire.from_loop_line(loop_wire.Following(commands)))
            protocol.flush()

    return heard


def scheduler_for(neuron_config: dict[str, Any]) -> Scheduler:
    """The leader's scheduler for this NeuronConfig: its batch slots and length, and, when NxD Inference
    samples on the device, that sampler's global_topk (device_sampling_rows)."""
    on_device = neuron_config.get("on_device_sampling_config")
    return Scheduler(
        batch_size=int(neuron_config["batch_size"]),
        seq_len=int(neuron_config["seq_len"]),
        global_topk=int(on_device.get("global_topk", DEFAULT_GLOBAL_TOPK)) if on_device else None,
    )


if __name__ == "__main__":
    sys.exit(main())
