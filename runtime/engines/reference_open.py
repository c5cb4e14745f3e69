"""Opening a unit of the reference engine: the model on every rank (its config.json, the unit's
layout, its weights and, on the leader, its tokenizer), checked before the unit forms, and the
process group its ranks form.

A checkpoint directory that can never be served as given raises EngineCannotServe with its
contract/node_exit.py status, so the node stops at once and says why in one line instead of
re-forming until its restart budget runs out (docs/node.md, Exit status): the same directory and
the same number of nodes fail the same way every time. What another attempt may change (a
converted built-in model's download, a disk that errors, a peer that is late) stays an ordinary
failure the unit re-forms from.
"""

from __future__ import annotations

import datetime
import logging
from dataclasses import dataclass

import torch
import torch.distributed as dist

import contract
from contract import node_exit
from runtime.engines.base import EngineCannotServe, EngineError
from runtime.engines.calibrate import AUTO
from runtime.engines.collectives import Communicator, connect
from runtime.engines.executor import plan_fingerprint
from runtime.engines.layout import STRATEGIES, ParallelPlan, make_plan
from runtime.membership import Membership
from runtime.models.registry import BUILTIN_MODELS, ModelSource, hf_tensor_shapes, resolve_model

log = logging.getLogger("flotilla.engine")

MISSING_SHOWN = 3  # tensor names a refusal lists before "and N more"


@dataclass(frozen=True)
class OpenedModel:
    source: ModelSource
    plan: ParallelPlan  # the layout it loads with (the transport may refine it: plan_for)


def check_requested(prefill: str, decode: str) -> None:
    """A strategy as a unit may be given one: pipeline, tensor, or auto (calibrated at formation)."""
    for phase, value in (("prefill", prefill), ("decode", decode)):
        if value not in (*STRATEGIES, AUTO):
            raise ValueError(f"{phase} strategy {value!r} is not one of {', '.join((*STRATEGIES, AUTO))}")


def open_model(model: str, world_size: int, *, prefill: str, decode: str) -> OpenedModel:
    """The model's source and the layout it loads with over `world_size` ranks (prefill and decode:
    concrete strategies, calibrate.loading_pair). A checkpoint directory whose config.json or
    weights cannot be read raises EngineCannotServe (MODEL_UNREADABLE); a layout the model cannot
    take, EngineCannotServe (LAYOUT_REFUSED)."""
    source = _resolve(model)
    try:
        plan = make_plan(source.shape, world_size, prefill=prefill, decode=decode)
    except ValueError as e:
        raise EngineCannotServe(
            f"reference layout refused: {contract.ENV_NODES_PER_UNIT}={world_size} cannot serve {model}: {e}",
            exit_code=node_exit.LAYOUT_REFUSED,
        ) from e
    if model not in BUILTIN_MODELS:
        check_weights(model, source)
    return OpenedModel(source=source, plan=plan)


def _resolve(model: str) -> ModelSource:
    if model in BUILTIN_MODELS:
        return resolve_model(model)  # a failure here is the conversion's or its download's: retried
    from safetensors import SafetensorError  # noqa: PLC0415 - weights libraries load only when a model is read

    try:
        return resolve_model(model)
    # FileNotFoundError: no config.json or no *.safetensors; PermissionError: files the node may not
    # read; ValueError: config.json not JSON, a shape field missing, an architecture the engine does
    # not compute (registry.reference_shape); SafetensorError: a weights file whose header is not
    # safetensors (a truncated or foreign file).
    except (FileNotFoundError, PermissionError, ValueError, SafetensorError) as e:
        raise _unreadable(model, e) from e


def check_weights(model: str, source: ModelSource) -> None:
    """Every tensor the model's shape needs is in its weights (names only: nothing is loaded)."""
    missing = sorted(set(hf_tensor_shapes(source.shape)) - source.weights.keys())
    if missing:
        shown = ", ".join(missing[:MISSING_SHOWN])
        more = f" and {len(missing) - MISSING_SHOWN} more" if len(missing) > MISSING_SHOWN else ""
        raise _unreadable(
            model,
            f"its *.safetensors lack {len(missing)} tensor(s) its config.json needs: {shown}{more} "
            "(a checkpoint of another model, or one not fully copied)",
        )


def open_tokenizer(model: str, source: ModelSource) -> object:
    """The model's tokenizer; one a checkpoint directory cannot give raises EngineCannotServe."""
    if model in BUILTIN_MODELS:
        return source.make_tokenizer()
    try:
        return source.make_tokenizer()
    # The tokenizers library raises a bare Exception for a tokenizer.json it cannot parse; the
    # directory's files are all it reads, so any failure is the same on every attempt.
    except Exception as e:  # noqa: BLE001
        raise _unreadable(model, f"its tokenizer does not load: {e}") from e


def _unreadable(model: str, why: object) -> EngineCannotServe:
    return EngineCannotServe(
        f"reference: the model {model} cannot be read: {why}; fix the checkpoint directory "
        f"({contract.ENV_MODEL}: config.json, *.safetensors, tokenizer.json)",
        exit_code=node_exit.MODEL_UNREADABLE,
    )


def plan_for(
    source: ModelSource, world_size: int, prefill: str, decode: str, comm: Communicator | None
) -> ParallelPlan:
    """The plan once the transport is known: uneven head splits only pay over shared memory."""
    shm = comm is not None and comm.transport == "shm"
    return make_plan(source.shape, world_size, prefill=prefill, decode=decode, split_uneven_heads=shm)


def form_process_group(membership: Membership, *, collective_timeout_s: float, start_timeout_s: float) -> None:
    if dist.is_initialized():
        raise EngineError(
            "a torch.distributed process group is already active in this process; shut the previous engine down first"
        )
    # The store waits up to start_timeout_s for every member (a follower may still be converting
    # weights); collectives afterwards use the short collective_timeout_s.
    store = dist.TCPStore(
        membership.dist_host,
        membership.dist_port,
        membership.world_size,
        is_master=membership.rank == 0,
        timeout=datetime.timedelta(seconds=start_timeout_s),
        wait_for_workers=True,
    )
    # CPU only: gloo bootstraps the unit (and carries tensors across hosts); see collectives.connect.
    dist.init_process_group(
        "gloo",
        store=store,
        rank=membership.rank,
        world_size=membership.world_size,
        timeout=datetime.timedelta(seconds=collective_timeout_s),
    )


def release_process_group() -> None:
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception as e:  # noqa: BLE001 - after a peer died teardown may complain; the group is gone anyway
            log.warning("destroying the process group: %s", e)


def agree(source: ModelSource, plan: ParallelPlan, rank: int, prefill: str, decode: str) -> None:
    """Every rank checks it runs the leader's model and strategies before loading anything."""
    mine = torch.tensor(plan_fingerprint(source.name, plan, prefill, decode), dtype=torch.int64)
    leader = mine.clone()
    dist.broadcast(leader, 0)
    bad = torch.tensor([0 if torch.equal(mine, leader) else 1], dtype=torch.int64)
    dist.all_reduce(bad, op=dist.ReduceOp.MAX)
    if int(bad):
        raise EngineError(
            f"rank {rank} runs model={source.name} world_size={plan.world_size} "
            f"prefill={prefill} decode={decode}, but the unit's members disagree "
            "(model, shape or strategies); start every member with the same model and strategies"
        )


def connect_unit(membership: Membership, collective_timeout_s: float, collectives: str) -> Communicator:
    """The unit's transport: shared memory on one host, else gloo."""
    return connect(membership.rank, membership.world_size, timeout_s=collective_timeout_s, transport=collectives)
