"""Multi-rank jobs for the engine tests: `python tests/engine/harness.py JOB RANK PORT SPEC.json OUT`.

Each rank is a real process (1 torch thread) on 127.0.0.1. Rank 0 writes its findings to OUT
(torch.save) and prints progress lines as JSON on stdout for the test to follow.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from runtime.engines.base import EngineBroken, GenerationRequest, SamplingParams, StructuredOutput  # noqa: E402
from runtime.engines.collectives import connect  # noqa: E402
from runtime.engines.executor import OP_SHUTDOWN, ShardExecutor, StepCommand  # noqa: E402
from runtime.engines.layout import make_plan  # noqa: E402
from runtime.engines.llama import UnsplitLlama  # noqa: E402
from runtime.membership import Membership  # noqa: E402
from runtime.models import resolve_model  # noqa: E402
from runtime.ports import free_port  # noqa: E402


def say(**kw) -> None:
    print(json.dumps(kw), flush=True)


def unsplit_reference(model: str, prompts: list[list[int]], steps: int) -> dict:
    """Greedy run of the unsplit model: first-token logits, per-step logits, tokens. The same run
    with prompts cut into the pipeline's prefill chunks (teacher-forced with those tokens) gives
    "prefill_chunked"/"decode_chunked", to compare a chunked pipeline prefill bit for bit."""
    from runtime.engines.executor import pipeline_prefill_chunks

    src = resolve_model(model)
    m = UnsplitLlama(src.shape, src.weights)
    out = {"prefill": [], "decode": [], "tokens": [], "prefill_chunked": [], "decode_chunked": []}
    for p in prompts:
        kv = m.new_kv(len(p) + steps + 1)
        logits = m.forward(p, kv)
        out["prefill"].append(logits)
        toks, per_step = [int(logits.argmax())], []
        for _ in range(steps):
            logits = m.forward([toks[-1]], kv)
            per_step.append(logits)
            toks.append(int(logits.argmax()))
        out["decode"].append(torch.stack(per_step))
        out["tokens"].append(toks)
        kv = m.new_kv(len(p) + steps + 1)
        for a, b in pipeline_prefill_chunks(len(p), 2):
            logits = m.forward(p[a:b], kv)
        out["prefill_chunked"].append(logits)
        out["decode_chunked"].append(torch.stack([m.forward([t], kv) for t in toks[:steps]]))
    return out


def job_exactness(rank: int, port: int, spec: dict, out_path: str) -> None:
    """For each (boundary, prefill, decode): prefill logits and teacher-forced decode logits."""
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60)
    )
    src = resolve_model(spec["model"])
    prompts, steps = spec["prompts"], spec["steps"]
    ref = unsplit_reference(spec["model"], prompts, steps) if rank == 0 else None
    comm = connect(rank, 2, timeout_s=60, transport=spec.get("collectives", "auto"))
    results = []
    for boundary, prefill, decode in spec["configs"]:
        plan = make_plan(
            src.shape,
            2,
            prefill=prefill,
            decode=decode,
            boundaries=(boundary,),
            split_uneven_heads=comm.transport == "shm",
        )
        ex = ShardExecutor(plan=plan, rank=rank, weights=src.weights, comm=comm)
        if rank != 0:
            ex.follower_loop()
            continue
        # One prompt per prefill step, as the unsplit reference ran them.
        prefill_logits, decode_logits = [], []
        for i, p in enumerate(prompts):
            r = ex.leader_step(StepCommand(prefill=[(i, len(p), len(p) + steps + 1)], prefill_tokens=[p]))
            prefill_logits.append(r.prefill_logits[0])
        # Teacher forcing: feed the reference's greedy tokens, one sequence per step.
        for i in range(len(prompts)):
            per_step = []
            for s in range(steps):
                r = ex.leader_step(StepCommand(decode=[i], decode_tokens=[ref["tokens"][i][s]]))
                per_step.append(r.decode_logits[0])
            decode_logits.append(torch.stack(per_step))
        ex.leader_step(StepCommand(free=list(range(len(prompts)))))
        ex.leader_signal(OP_SHUTDOWN)
        results.append({"config": (boundary, prefill, decode), "prefill": prefill_logits, "decode": decode_logits})
    comm.close()
    dist.destroy_process_group()
    if rank == 0:
        torch.save({"reference": ref, "results": results, "transport": comm.transport}, out_path)


def _handoff_port(out_path: str, n: int, rank: int, *, first: int) -> int:
    if n == 0:
        return first
    path = f"{out_path}.port{n}"
    if rank == 0:
        port = free_port()
        with open(path + ".tmp", "w") as f:
            f.write(str(port))
        os.rename(path + ".tmp", path)
        return port
    deadline = time.monotonic() + 120
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank 0 never published the port of unit {n}")
        time.sleep(0.05)
    with open(path) as f:
        return int(f.read())


async def _generate(engine, rid: str, prompt: list[int], **sampling) -> list[int]:
    toks = []
    req = GenerationRequest(request_id=rid, prompt_token_ids=tuple(prompt), sampling=SamplingParams(**sampling))
    async for ev in engine.generate(req):
        toks.append(ev.token_id)
    return toks


def job_engine(rank: int, port: int, spec: dict, out_path: str) -> None:
    """Each strategy combo in turn (a fresh unit, same processes): greedy tokens per prompt, run
    all together and each alone."""
    from runtime.engines.reference import ReferenceEngine, run_worker
    from runtime.engines.speculative import SpeculationSettings

    found = []
    for n, (prefill, decode) in enumerate(spec["combos"]):
        # A fresh port per unit, picked just before use and handed to rank 1 through a file:
        # ports reserved up front could be taken by other processes on a busy machine meanwhile.
        m = Membership(
            unit_id="t",
            revision="1",
            rank=rank,
            world_size=2,
            dist_host="127.0.0.1",
            dist_port=_handoff_port(out_path, n, rank, first=port),
        )
        if rank != 0:
            run_worker(
                m, model=spec["model"], prefill=prefill, decode=decode, collective_timeout_s=30, start_timeout_s=60
            )
            continue

        async def run() -> dict:
            engine = ReferenceEngine(
                m,
                model=spec["model"],
                prefill=prefill,
                decode=decode,
                collective_timeout_s=30,
                start_timeout_s=60,
                max_running=8,
                **({"max_prefill_tokens": spec["max_prefill_tokens"]} if "max_prefill_tokens" in spec else {}),
                **({"speculation": SpeculationSettings(**spec["speculation"])} if "speculation" in spec else {}),
            )
            say(phase="starting")
            await engine.start()
            say(phase="started")
            prompts, k = spec["prompts"], spec["max_tokens"]
            together = await asyncio.gather(
                *[_generate(engine, f"t{i}", p, max_tokens=k) for i, p in enumerate(prompts)]
            )
            alone = [await _generate(engine, f"a{i}", p, max_tokens=k) for i, p in enumerate(prompts)]
            shaped = {}
            if spec.get("structured"):
                # n greedy choices from one shared prefill, under a JSON-schema mask, with logprobs.
                req = GenerationRequest(
                    request_id="s",
                    prompt_token_ids=tuple(prompts[0]),
                    sampling=SamplingParams(
                        max_tokens=spec["structured"]["max_tokens"],
                        n=2,
                        logprobs=2,
                        structured=StructuredOutput("json_schema", json.dumps(spec["structured"]["schema"])),
                    ),
                )
                async for ev in engine.generate(req):
                    c = shaped.setdefault(ev.index, {"tokens": [], "text": "", "top": [], "finish": None})
                    c["tokens"].append(ev.token_id)
                    c["text"] += ev.text
                    c["top"].append([t for t, _ in ev.logprob.top])
                    c["finish"] = ev.finish_reason or c["finish"]
            # Turns of a conversation, one after the other: each resends the turns before it, so
            # its prompt starts with blocks the prefix cache holds from the previous turn.
            conversation = []
            for i, p in enumerate(spec.get("conversation", ())):
                req = GenerationRequest(
                    request_id=f"c{i}",
                    prompt_token_ids=tuple(p),
                    sampling=SamplingParams(max_tokens=k, ignore_eos=True),
                )
                events = [ev async for ev in engine.generate(req)]
                conversation.append({"tokens": [e.token_id for e in events], "cached": events[-1].cached_tokens})
            cache = engine.prefix_cache
            load = engine.load()
            say(phase="generated")
            await engine.shutdown()
            say(phase="shut down")
            return {
                "combo": (prefill, decode),
                "together": together,
                "alone": alone,
                "structured": shaped,
                "conversation": conversation,
                "cache_refs": sorted({cache.refs(b) for b in cache.block_ids()}),
                "blocks_indexed": len(cache.block_ids()),
                "blocks_held": engine.executor.cached_blocks(),
                "load_after": (load.running, load.queue_depth, load.kv_cache_used),
                "state": engine.health().state.value,
                "spec": (load.spec_draft_tokens, load.spec_accepted_tokens),
                "kv_held": engine.executor.kv_slots_held(),
            }

        found.append(asyncio.run(run()))
        say(combo=[prefill, decode], done=True)
    if rank == 0:
        torch.save(found, out_path)


def job_failure(rank: int, port: int, spec: dict, out_path: str) -> None:
    """Rank 1 is killed by the test mid-generation; rank 0 records how its requests ended, then
    forms a fresh unit in the same process with a new follower (port + 1)."""
    from runtime.engines.reference import ReferenceEngine, run_worker

    m = Membership(
        unit_id="t",
        revision="1",
        rank=rank,
        world_size=2,
        dist_host="127.0.0.1",
        dist_port=port + (spec.get("generation", 0)),
    )
    if rank != 0:
        say(rank=rank, pid=os.getpid())
        try:
            run_worker(
                m,
                model="tiny",
                collective_timeout_s=spec["timeout"],
                start_timeout_s=60,
                collectives=spec.get("collectives", "auto"),
            )
        except EngineBroken as e:
            say(worker_broken=str(e))
        return

    async def run() -> dict:
        engine = ReferenceEngine(
            m,
            model="tiny",
            collective_timeout_s=spec["timeout"],
            start_timeout_s=60,
            heartbeat_s=0.5,
            collectives=spec.get("collectives", "auto"),
        )
        await engine.start()
        say(transport=engine.transport)
        outcomes: dict[str, str] = {}

        async def one(i: int) -> None:
            n = 0
            try:
                req = GenerationRequest(
                    request_id=f"r{i}",
                    prompt_token_ids=(1, 2, 3),
                    sampling=SamplingParams(max_tokens=1900, ignore_eos=True),
                )
                async for _ in engine.generate(req):
                    n += 1
                    if n == 5 and i == 0:
                        say(streaming=True)  # the test kills rank 1 now
                outcomes[f"r{i}"] = "finished"
            except EngineBroken as e:
                outcomes[f"r{i}"] = f"EngineBroken: {e}"

        tasks = [asyncio.create_task(one(i)) for i in range(3)]
        started = time.monotonic()
        while engine.health().state.value == "ready" and time.monotonic() - started < 120:
            await asyncio.sleep(0.01)
        broken_at, broken_wall = time.monotonic(), time.time()
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=spec["timeout"] + 10)
        ended_after = time.monotonic() - broken_at
        health = engine.health()
        await engine.shutdown()
        say(broken=True)
        # Re-form: a fresh process group in this same process, with a new follower.
        m2 = Membership(unit_id="t", revision="1", rank=0, world_size=2, dist_host="127.0.0.1", dist_port=port + 1)
        engine2 = ReferenceEngine(m2, model="tiny", collective_timeout_s=spec["timeout"], start_timeout_s=60)
        await engine2.start()
        toks = await _generate(engine2, "after", [1, 2, 3], max_tokens=4)
        await engine2.shutdown()
        return {
            "outcomes": outcomes,
            "health": (health.state.value, health.detail),
            "requests_ended_after_broken_s": ended_after,
            "broken_wall": broken_wall,
            "reformed_tokens": toks,
        }

    torch.save(asyncio.run(run()), out_path)


def job_mismatch(rank: int, port: int, spec: dict, out_path: str) -> None:
    """Rank 1 starts with a different decode strategy than the leader."""
    from runtime.engines.base import EngineError
    from runtime.engines.reference import ReferenceEngine, run_worker

    m = Membership(unit_id="t", revision="1", rank=rank, world_size=2, dist_host="127.0.0.1", dist_port=port)
    try:
        if rank:
            run_worker(
                m,
                model="tiny",
                decode=spec.get("decode", "tensor"),
                collective_timeout_s=spec["timeout"],
                start_timeout_s=60,
            )
        else:
            engine = ReferenceEngine(m, model="tiny", collective_timeout_s=spec["timeout"], start_timeout_s=60)
            asyncio.run(engine.start())
        say(refused="")
    except EngineError as e:
        say(refused=str(e))


def job_collectives(rank: int, port: int, spec: dict, out_path: str) -> None:
    """The transport on its own: spec["script"] is "ops" (every call, results saved per rank),
    "sleepy" (ranks that sleep and are woken, and ranks that poll), "die" (rank 1 stops answering
    mid-run; rank 0 reports how its collective ended)."""
    import logging

    from runtime.engines import collectives

    class Say(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            say(log=record.getMessage())

    logging.getLogger("flotilla.engine").addHandler(Say())
    logging.getLogger("flotilla.engine").setLevel(logging.INFO)
    if rank in spec.get("other_host_ranks", []):
        collectives.host_identity = lambda: ("elsewhere", "another-boot")
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60)
    )
    try:
        comm = collectives.connect(
            rank,
            2,
            timeout_s=spec["timeout"],
            transport=spec.get("collectives", "auto"),
            shm_dir=spec.get("shm_dir", collectives.SHM_DIR),
        )
    except collectives.CollectiveError as e:
        say(connect_error=str(e))
        # As the engine does (reference_open.release_process_group): a gloo group left alive into
        # interpreter teardown can abort the process (SIGABRT) instead of exiting with our status.
        dist.destroy_process_group()
        sys.exit(3)
    say(rank=rank, transport=comm.transport, segment=getattr(comm, "name", ""))
    peer = 1 - rank
    if spec["script"] == "ops":
        found = {}
        for n in spec["sizes"]:
            base = torch.arange(n, dtype=torch.float32) / 7
            found[f"all_reduce{n}"] = comm.all_reduce(base * (rank + 1) + rank).clone()
            found[f"broadcast{n}"] = comm.broadcast(base.clone() if rank == 1 else torch.zeros(n), 1).clone()
            ints = torch.arange(n, dtype=torch.int64) + 1000 * rank
            found[f"gather{n}"] = comm.gather(ints, 0)
            # Both directions at once, more in flight than the ring holds: sends must not block receives.
            works = [comm.isend(base + 100 * rank + i, peer) for i in range(spec["in_flight"])]
            found[f"recv{n}"] = [comm.recv(torch.empty(n), peer) for _ in range(spec["in_flight"])]
            for w in works:
                w.wait()
        torch.save(found, out_path if rank == 0 else f"{out_path}.rank{rank}")
    elif spec["script"] == "sleepy":
        # Each rank in turn arrives late, so the other goes to sleep on its doorbell; with the
        # liveness slice an hour long, only the late rank's ring wakes it (a missed ring hangs).
        # Then both ranks run back to back, polling: no ring is needed and none is made.
        collectives._SLICE_S = 3600.0
        counts = {"sleeps": 0, "rings": 0}
        sleep, wake = comm._sleep, comm._futex.wake

        def counted_sleep(*a):
            counts["sleeps"] += 1
            return sleep(*a)

        def counted_wake(*a):
            counts["rings"] += 1
            return wake(*a)

        comm._sleep, comm._futex.wake = counted_sleep, counted_wake
        sums = []
        for i in range(2 * spec["late"]):
            if rank == i % 2:
                time.sleep(0.05)  # far past SPIN_S: the peer stops polling and sleeps
            sums.append(float(comm.all_reduce(torch.tensor([float(i + rank)]))[0]))
        say(late_phase=counts.copy())
        counts.update(sleeps=0, rings=0)
        for i in range(spec["busy"]):
            sums.append(float(comm.all_reduce(torch.tensor([float(i + rank)]))[0]))
        say(sums=sums, busy_phase=counts)
    elif spec["script"] == "die":
        x = torch.ones(4)
        comm.all_reduce(x)
        if rank == 1:
            say(waiting=True)  # the test kills or stops this process now
            time.sleep(600)
            return
        try:
            while True:  # rank 1 no longer answers: this call must end with an error
                comm.all_reduce(x)
        except collectives.CollectiveError as e:
            say(error=str(e))
    comm.close()
    dist.destroy_process_group()
    say(closed=True)


JOBS = {
    "collectives": job_collectives,
    "exactness": job_exactness,
    "engine": job_engine,
    "failure": job_failure,
    "mismatch": job_mismatch,
}

if __name__ == "__main__":
    job, rank, port, spec_path, out = sys.argv[1:6]
    torch.set_num_threads(1)
    with open(spec_path) as f:
        spec = json.load(f)
    JOBS[job](int(rank), int(port), spec, out)
