"""The leader's engine on one rank (tiny): sampling, stop conditions, rejection, cancellation,
KV budget and continuous batching (requests join and leave between decode steps)."""

from __future__ import annotations

import asyncio

import pytest

from runtime.engines.base import EngineError, EngineState, GenerationRequest, RequestRejected, SamplingParams
from runtime.engines.reference import ReferenceEngine
from runtime.membership import Membership

SOLO = Membership(unit_id="u", revision="1", rank=0, world_size=1, dist_host="127.0.0.1", dist_port=1)
PROMPT = (256, 72, 105, 33)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=120))


async def _engine(**kw) -> ReferenceEngine:
    engine = ReferenceEngine(SOLO, model="tiny", **kw)
    await engine.start()
    return engine


async def _collect(engine, rid="r", prompt=PROMPT, **sampling):
    req = GenerationRequest(request_id=rid, prompt_token_ids=tuple(prompt), sampling=SamplingParams(**sampling))
    return [ev async for ev in engine.generate(req)]


async def _long_request(engine, seen: asyncio.Event) -> int:
    """Request "long" (1,500 tokens): sets `seen` at its third token; returns how many it received."""
    n = 0
    req = GenerationRequest(
        request_id="long", prompt_token_ids=PROMPT, sampling=SamplingParams(max_tokens=1500, ignore_eos=True)
    )
    async for _ in engine.generate(req):
        n += 1
        if n == 3:
            seen.set()
    return n


def test_greedy_generation_stops_at_max_tokens_with_reason_length():
    async def go():
        engine = await _engine()
        events = await _collect(engine, max_tokens=7, ignore_eos=True)
        await engine.shutdown()
        return events

    events = run(go())
    assert len(events) == 7 and events[-1].finish_reason == "length"
    assert all(e.finish_reason is None for e in events[:-1])


def test_seeded_sampling_is_reproducible_and_differs_across_seeds():
    async def go():
        engine = await _engine()
        a = await _collect(engine, "a", max_tokens=12, temperature=1.0, top_p=0.9, seed=7, ignore_eos=True)
        b = await _collect(engine, "b", max_tokens=12, temperature=1.0, top_p=0.9, seed=7, ignore_eos=True)
        c = await _collect(engine, "c", max_tokens=12, temperature=1.0, top_p=0.9, seed=8, ignore_eos=True)
        await engine.shutdown()
        return [[e.token_id for e in x] for x in (a, b, c)]

    a, b, c = run(go())
    assert a == b and a != c


def test_stop_string_ends_generation_and_is_not_emitted():
    async def go():
        engine = await _engine()
        free = await _collect(engine, "free", max_tokens=24, ignore_eos=True)
        text = "".join(e.text for e in free)
        stop = text[5:7]
        stopped = await _collect(engine, "stop", max_tokens=24, ignore_eos=True, stop=(stop,))
        await engine.shutdown()
        return text, stop, stopped

    text, stop, stopped = run(go())
    assert stopped[-1].finish_reason == "stop"
    assert "".join(e.text for e in stopped) == text[: text.index(stop)]


def test_request_that_can_never_fit_the_kv_budget_is_rejected_with_the_fix():
    async def go():
        engine = await _engine(kv_budget_tokens=32)
        try:
            with pytest.raises(RequestRejected, match="lower max_tokens"):
                await _collect(engine, max_tokens=40)
            with pytest.raises(RequestRejected, match="empty"):
                await _collect(engine, prompt=())
            with pytest.raises(RequestRejected, match="outside the vocabulary"):
                await _collect(engine, prompt=(999999,))
        finally:
            await engine.shutdown()

    run(go())


def test_requests_wait_for_budget_then_run_and_all_finish():
    async def go():
        engine = await _engine(kv_budget_tokens=30)  # room for one request of 4 + 20 at a time
        results = await asyncio.gather(*[_collect(engine, f"r{i}", max_tokens=20, ignore_eos=True) for i in range(3)])
        load = engine.load()
        await engine.shutdown()
        return results, load

    results, load = run(go())
    assert [len(r) for r in results] == [20, 20, 20]
    assert [e.token_id for e in results[0]] == [e.token_id for e in results[2]]
    assert (load.running, load.queue_depth, load.kv_cache_used) == (0, 0, 0.0)


def test_cancel_frees_the_slot_and_budget_while_others_keep_running():
    async def go():
        engine = await _engine(max_running=2)
        seen = asyncio.Event()

        task = asyncio.create_task(_long_request(engine, seen))
        await seen.wait()
        during = engine.load()
        engine.cancel("long")
        n = await task
        other = await _collect(engine, "other", max_tokens=3, ignore_eos=True)
        after = engine.load()
        await engine.shutdown()
        return during, n, other, after

    during, n, other, after = run(go())
    assert during.running == 1 and during.kv_cache_used > 0
    assert 3 <= n < 1500
    assert len(other) == 3
    assert (after.running, after.kv_cache_used) == (0, 0.0)


def test_a_late_request_joins_the_running_batch_between_decode_steps():
    async def go():
        engine = await _engine()
        first_started = asyncio.Event()
        order = []

        async def first():
            req = GenerationRequest(
                request_id="first", prompt_token_ids=PROMPT, sampling=SamplingParams(max_tokens=200, ignore_eos=True)
            )
            async for ev in engine.generate(req):
                order.append("first")
                first_started.set()

        task = asyncio.create_task(first())
        await first_started.wait()
        late = await _collect(engine, "late", max_tokens=5, ignore_eos=True)
        done_first = task.done()
        await task
        await engine.shutdown()
        return late, done_first

    late, done_first = run(go())
    assert len(late) == 5 and not done_first  # the late one finished while the first still ran


def test_health_goes_ready_then_stopped_and_generate_refuses_after_shutdown():
    async def go():
        engine = await _engine()
        ready = engine.health().state
        await engine.shutdown()
        with pytest.raises(EngineError, match="not ready"):
            await _collect(engine)
        return ready, engine.health().state

    assert run(go()) == (EngineState.READY, EngineState.STOPPED)


def test_a_consumer_that_stops_reading_frees_its_slot():
    async def go():
        engine = await _engine()
        req = GenerationRequest(
            request_id="gone", prompt_token_ids=PROMPT, sampling=SamplingParams(max_tokens=1500, ignore_eos=True)
        )
        stream = engine.generate(req)
        async for _ in stream:
            break
        await stream.aclose()  # what an HTTP server does when the client disconnects
        for _ in range(500):
            if engine.load().running == 0:
                break
            await asyncio.sleep(0.01)
        load = engine.load()
        await engine.shutdown()
        return load

    load = run(go())
    assert (load.running, load.kv_cache_used) == (0, 0.0)


def test_cancelling_a_queued_request_ends_its_stream_without_running_it():
    async def go():
        engine = await _engine(kv_budget_tokens=2000)  # the first request holds nearly all of it
        first = asyncio.create_task(_collect(engine, "first", max_tokens=1990, ignore_eos=True))
        await asyncio.sleep(0)
        second = asyncio.create_task(_collect(engine, "queued", max_tokens=25, ignore_eos=True))
        for _ in range(1000):
            load = engine.load()
            if (load.running, load.queue_depth) == (1, 1):
                break
            await asyncio.sleep(0.01)
        assert (load.running, load.queue_depth) == (1, 1)
        engine.cancel("queued")
        events = await second
        engine.cancel("first")
        await first
        await engine.shutdown()
        return events

    assert run(go()) == []


def test_a_burst_larger_than_the_prefill_cap_is_admitted_over_several_steps_with_same_tokens():
    async def go():
        engine = await _engine(max_prefill_tokens=len(PROMPT))  # one prompt per iteration
        burst = await asyncio.gather(*[_collect(engine, f"b{i}", max_tokens=6, ignore_eos=True) for i in range(4)])
        await engine.shutdown()
        return [[e.token_id for e in r] for r in burst]

    burst = run(go())
    assert all(r == burst[0] for r in burst) and len(burst[0]) == 6


def test_start_gives_up_with_a_clear_error_when_followers_never_join(free_ports):
    lonely = Membership(unit_id="u", revision="1", rank=0, world_size=2, dist_host="127.0.0.1", dist_port=free_ports(1))

    async def go():
        engine = ReferenceEngine(lonely, model="tiny", start_timeout_s=2, collective_timeout_s=5)
        with pytest.raises(EngineError, match="failed to start"):
            await engine.start()
        return engine.health()

    health = run(go())
    assert health.state is EngineState.BROKEN and health.detail


def test_a_request_that_arrives_as_the_engine_breaks_ends_with_engine_broken_not_a_silent_wait(monkeypatch):
    """The scheduler fails every request it knows of when a collective breaks; a request checked in
    just before that must not be queued just after it, where nobody would ever answer it."""
    from runtime.engines import reference
    from runtime.engines.base import EngineBroken

    peer_died = False
    real_signal = reference.ShardExecutor.leader_signal

    def heartbeat(self, op):
        if peer_died:
            raise EngineBroken("a follower is gone (heartbeat failed): injected")
        return real_signal(self, op)

    monkeypatch.setattr(reference.ShardExecutor, "leader_signal", heartbeat)

    async def go():
        engine = await _engine(heartbeat_s=0.05, collective_timeout_s=5)
        real_validate = engine._validate

        def validate_while_the_unit_breaks(request):
            # The request is past its first look at the engine's state; now the unit breaks.
            nonlocal peer_died
            peer_died = True
            for _ in range(500):
                if engine.health().state is EngineState.BROKEN:
                    break
                import time

                time.sleep(0.01)
            assert engine.health().state is EngineState.BROKEN
            return real_validate(request)

        engine._validate = validate_while_the_unit_breaks
        try:
            with pytest.raises(EngineBroken):
                await asyncio.wait_for(_collect(engine, "late", max_tokens=3), timeout=10)
        finally:
            await engine.shutdown()

    run(go())


def test_cancel_ends_a_running_request_within_one_step_and_its_slot_goes_to_the_next():
    async def go():
        engine = await _engine(max_running=1)
        produced_at_cancel = None
        seen = asyncio.Event()

        task = asyncio.create_task(_long_request(engine, seen))
        await seen.wait()
        queued = asyncio.create_task(_collect(engine, "next", max_tokens=3, ignore_eos=True))
        for _ in range(1000):
            if engine.load().queue_depth == 1:
                break
            await asyncio.sleep(0.01)
        waiting = engine.load()
        with engine._lock:  # how many tokens the scheduler had made when the cancel arrived
            produced_at_cancel = engine._by_id["long"].seqs[0].generated  # its only choice
            engine.cancel("long")
        received = await task
        nxt = await queued
        await engine.shutdown()
        return waiting, produced_at_cancel, received, nxt

    waiting, produced, received, nxt = run(go())
    assert (waiting.running, waiting.queue_depth) == (1, 1)  # the next one waited for the only slot
    assert received <= produced + 1  # at most the step already under way
    assert len(nxt) == 3 and nxt[-1].finish_reason == "length"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"prefill": "sideways"}, "prefill strategy 'sideways' is not one of pipeline, tensor, auto"),
        ({"decode": "data"}, "decode strategy 'data' is not one of pipeline, tensor, auto"),
        ({"collectives": "nccl"}, "collectives 'nccl' is not one of auto, shm, gloo"),
    ],
)
def test_a_bad_strategy_or_transport_is_refused_with_the_choices(kwargs, message):
    from runtime.engines.reference import ReferenceEngine
    from runtime.membership import Membership

    m = Membership(unit_id="u", revision="1", rank=0, world_size=2, dist_host="127.0.0.1", dist_port=1)
    with pytest.raises(ValueError, match=message):
        ReferenceEngine(m, model="tiny", **kwargs)
