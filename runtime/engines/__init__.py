"""Engines: the code that turns token ids into token streams, sharded across a unit's ranks.

The reference engine (runtime/engines/reference.py), as the node helper calls it. These signatures
are stable; new keyword arguments only ever get defaults.

Leader (rank 0), inside the node's asyncio loop::

    from runtime.engines.reference import ReferenceEngine
    engine = ReferenceEngine(
        membership,                   # runtime.membership.Membership (rank 0)
        model="smollm2",              # tiny | smollm2 | a Llama checkpoint directory
        prefill="auto",               # auto (timed at formation, calibrate.py) | pipeline | tensor
        decode="auto",                # auto | pipeline | tensor
        kv_budget_tokens=16384,       # KV-cache tokens over all running sequences (prompt+max_tokens each)
        max_running=16,               # batch slots
        collective_timeout_s=30.0,    # gloo timeout: a dead/wedged peer fails requests within this
        heartbeat_s=1.0,              # idle leader pings followers so a death is noticed while idle
        start_timeout_s=300.0,        # how long start() waits for every follower to join
        threads=None,                 # torch.set_num_threads for this process (None: leave as is)
        model_name=None,              # name reported as engine.model_name (default: the model's)
        max_prefill_tokens=2048,      # prompt tokens prefilled per step; longer prompts go in chunks
        collectives="auto",           # auto (shared memory on one host, else gloo) | shm | gloo
    )
    await engine.start()              # forms the process group, loads rank 0's tensors, warms up,
                                      # times the strategies when one is auto (engine.calibration)
    async for event in engine.generate(request): ...   # base.TokenEvent stream
    engine.cancel(request_id); engine.health(); engine.load()
    await engine.shutdown()           # followers' run_worker returns; the process group is destroyed

Followers (rank > 0), blocking, in a thread of their own or the main thread::

    from runtime.engines.reference import run_worker
    run_worker(membership, model="smollm2", prefill="auto", decode="auto",
               collective_timeout_s=30.0, start_timeout_s=300.0, threads=None, collectives="auto")

run_worker returns normally when the leader shuts the unit down, and raises base.EngineBroken
when the leader or another peer dies or a collective times out. `tokenizer` and `max_context` are
set by start() (the model is resolved there, which converts `smollm2` on first use). The leader
checks at start-up that
every follower runs the same model and strategies (a mismatch fails start() and run_worker with a
message naming both). world_size=1 needs no followers and no process group.

Re-forming after BROKEN: see the ReferenceEngine docstring (a fresh process group in the same
process after shutdown() is tested in tests/engine/test_failure.py).
"""
