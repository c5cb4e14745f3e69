"""Routing by cache and by work (runtime/router/balance.py, docs/routing.md): routers that see the same
units agree on a key's unit without talking to each other, one hot prefix cannot pile onto one unit,
an unready preferred unit hands its keys on, and the request's key is read the same way by every
router. The trace model (bench/fleet/trace_sim.py) runs small at the end: its figures are simulated
time from a fixed trace, not wall-clock."""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import get_args

import aiohttp
import pytest
from router_standins import StandInUnit
from router_testkit import base_url, router_over, run

import contract
from bench.fleet import trace_sim
from runtime import emf
from runtime.node.engine_protocol import Done, Error, Token
from runtime.node.handshake import read_ready
from runtime.node.server import _Prefilling
from runtime.router import balance
from runtime.router import fleet as fleet_module
from runtime.router.discovery import MemberEndpoint, StaticDiscovery
from runtime.router.fleet import Fleet, Member
from runtime.router.settings import RouterSettings

REPO = Path(__file__).resolve().parents[2]


@dataclass
class V:
    name: str
    in_flight: int = 0
    queue_depth: int = 0
    running: int = 0
    max_running: int = 8
    kv_cache_used: float = 0.0
    prefill_tokens: int = 0
    outstanding: int = 0
    outstanding_at_report: int = 0
    sent_tokens: int = 0
    sent_tokens_at_report: int = 0
    tokens_per_step: float = 0.0


def _ring(units: list[V]) -> balance.Ring[V]:
    return balance.Ring(units, lambda v: balance.ring_points(v.name))


def _always(_: V) -> bool:
    return True


def _chat(first_user: str, turns: int = 1) -> bytes:
    messages = [{"role": "system", "content": "You are a shopping assistant."}]
    for t in range(turns):
        messages.append({"role": "user", "content": first_user if t == 0 else f"and turn {t}?"})
        if t < turns - 1:
            messages.append({"role": "assistant", "content": f"answer {t} " * 40})
    return json.dumps({"model": "m", "messages": messages}).encode()


# --- the key -------------------------------------------------------------------------------------------
def test_every_turn_of_a_conversation_has_the_key_of_its_first_turn_and_other_conversations_differ():
    keys = {balance.request_key(_chat("find me red shoes", turns=n)).key for n in range(1, 6)}
    assert len(keys) == 1
    other = balance.request_key(_chat("find me a blue hat")).key
    assert other not in keys


def test_a_later_turn_counts_the_messages_before_its_last_question_as_cached():
    first = balance.request_key(_chat("find me red shoes", turns=1))
    third = balance.request_key(_chat("find me red shoes", turns=3))
    assert first.cached == 0 and first.source == "prefix"
    # The system prompt, the first two questions and two answers: what the previous turn left cached.
    earlier = json.loads(_chat("find me red shoes", turns=3))["messages"][:-1]
    assert third.cached == len(json.dumps(earlier, separators=(",", ":")).encode()) // balance.BYTES_PER_TOKEN
    assert 0 < third.cached < third.tokens


def test_a_session_header_or_the_openai_user_field_outranks_the_prefix():
    body = _chat("find me red shoes")
    by_header = balance.request_key(body, "conv-42")
    by_user = balance.request_key(json.dumps({**json.loads(body), "user": "conv-42"}).encode())
    assert by_header.source == by_user.source == "session"
    assert by_header.key == by_user.key != balance.request_key(body).key


def test_completion_prompts_key_on_their_leading_bytes_and_unreadable_bodies_have_no_key():
    lead = "x" * balance.PREFIX_KEY_BYTES
    a = balance.request_key(json.dumps({"prompt": lead + " one"}).encode())
    b = balance.request_key(json.dumps({"prompt": lead + " two, longer"}).encode())
    assert a.key == b.key is not None
    assert balance.request_key(json.dumps({"prompt": [1, 2, 3]}).encode()).tokens == 3
    assert balance.request_key(b"{not json").key is None
    assert balance.request_key(b"[1, 2]").key is None


def test_the_key_hash_is_the_same_in_every_process():
    # blake2b, not Python's per-process salted hash(): another router process must agree. The value is
    # the first 8 bytes of hashlib.blake2b(b"abc", digest_size=8), big-endian (RFC 7693 BLAKE2b-64).
    import hashlib

    assert balance.key_hash(b"abc") == int.from_bytes(hashlib.blake2b(b"abc", digest_size=8).digest(), "big")
    assert balance.ring_points("unit-a")[:2] == [balance.key_hash(b"unit-a#0"), balance.key_hash(b"unit-a#1")]


# --- agreement ---------------------------------------------------------------------------------------
def test_routers_with_the_same_view_send_every_key_to_the_same_unit_whatever_their_order_and_luck():
    names = [f"cell{c}-unit{u}" for c in range(5) for u in range(20)]
    views = []
    for r in range(4):  # four routers: each lists the units in its own order and draws its own samples
        order = names[:]
        random.Random(r).shuffle(order)
        views.append([V(n) for n in order])
    rings = [_ring(vs) for vs in views]
    rngs = [random.Random(100 + r) for r in range(4)]
    chosen_units = set()
    for k in range(500):
        req = balance.request_key(_chat(f"question {k}"))
        picks = {
            balance.by_cache_and_work(
                rings[r], views[r], _always, rngs[r], key=req.key, tokens=req.tokens, cached=req.cached, mean_load=0.0
            ).name
            for r in range(4)
        }
        assert len(picks) == 1, f"key {k}: routers disagree: {picks}"
        chosen_units |= picks
    # and the keys spread over the fleet rather than onto a few units
    assert len(chosen_units) > 80


def test_a_unit_leaving_moves_only_its_own_keys():
    units = [V(f"u{i}") for i in range(50)]
    before = _ring(units)
    after = _ring([u for u in units if u.name != "u7"])
    keys = [balance.key_hash(f"k{i}".encode()) for i in range(2000)]
    moved = [k for k in keys if next(before.walk(k)).name != next(after.walk(k)).name]
    assert moved and all(next(before.walk(k)).name == "u7" for k in moved)


def test_a_ring_kept_in_step_unit_by_unit_equals_one_built_from_scratch():
    units = [V(f"u{i}") for i in range(40)]
    ring = _ring(units)
    keys = [balance.key_hash(f"k{i}".encode()) for i in range(500)]
    now = units[:7] + units[8:] + [V("late-1")]  # one leaves, one joins: an incremental update
    ring.update(now)
    fresh = _ring(now)
    assert len(ring) == len(fresh) == 40
    assert [list(ring.walk(k))[:3] for k in keys] == [list(fresh.walk(k))[:3] for k in keys]
    assert all(next(ring.walk(k)) is not units[7] for k in keys)


# --- bounded load ------------------------------------------------------------------------------------
def test_one_hot_prefix_never_loads_any_unit_past_the_bound_and_spills_to_the_least_work():
    units = [V(f"u{i}") for i in range(20)]
    ring = _ring(units)
    rng = random.Random(3)
    hot = balance.request_key(_chat("the same question everybody asks"))
    preferred = next(ring.walk(hot.key))
    for _ in range(400):  # requests that stay in flight: the load only grows
        mean = sum(balance.estimated_load(u) for u in units) / len(units)
        u = balance.by_cache_and_work(
            ring, units, _always, rng, key=hot.key, tokens=hot.tokens, cached=hot.cached, mean_load=mean
        )
        bound = balance.load_bound(mean, len(units))
        assert u is not preferred or u.in_flight + 1 <= bound
        u.in_flight += 1
    loads = sorted(u.in_flight for u in units)
    mean = sum(loads) / len(loads)
    assert preferred.in_flight <= (1 + balance.BOUND_EPS) * mean + 1
    assert loads[-1] <= (1 + balance.BOUND_EPS) * mean + 1 and loads[0] >= mean / 2


def test_one_hot_prefix_followed_to_its_last_unit_never_loads_that_unit_past_the_bound():
    units = [V(f"u{i}") for i in range(20)]
    ring = _ring(units)
    rng = random.Random(4)
    holders: balance.KeyHolders[V] = balance.KeyHolders()
    hot = balance.request_key(_chat("the same question everybody asks", turns=3))
    assert hot.key is not None and hot.cached > 0
    for _ in range(400):  # requests that stay in flight, each followed to the unit that took the last
        mean = sum(balance.estimated_load(u) for u in units) / len(units)
        last = holders.get(hot.key)
        u = balance.by_cache_and_work(
            ring, units, _always, rng, key=hot.key, tokens=hot.tokens, cached=hot.cached, mean_load=mean, holder=last
        )
        assert u is not None
        bound = balance.load_bound(mean, len(units))
        assert u is not last or u.in_flight + 1 <= bound
        u.in_flight += 1
        holders.note(hot.key, u)
    loads = sorted(u.in_flight for u in units)
    mean = sum(loads) / len(loads)
    assert loads[-1] <= (1 + balance.BOUND_EPS) * mean + 1 and loads[0] >= mean / 2


def test_the_preferred_unit_loses_to_a_sampled_one_when_its_prefill_queue_outweighs_the_cache():
    units = [V(f"u{i}") for i in range(8)]
    ring = _ring(units)
    req = balance.RequestKey(key=balance.key_hash(b"conv"), tokens=1000, source="prefix", cached=900)
    preferred = next(ring.walk(req.key))
    pick = lambda: balance.by_cache_and_work(  # noqa: E731
        ring, units, _always, random.Random(1), key=req.key, tokens=1000, cached=900, mean_load=0.0
    )
    # The preferred unit wins while 100 new tokens behind its queue take no longer than 1,000 behind
    # nothing plus the slack, the 900 tokens it holds (docs/routing.md: 1,000 + 1 x 900 = 1,900, so a
    # queue of 1,800).
    assert balance.AFFINITY_SLACK == 1.0
    preferred.prefill_tokens = 1800
    assert pick() is preferred
    preferred.prefill_tokens = 1801  # 1,901 > 1,900: the work wins
    assert pick() is not preferred


def test_the_estimate_adds_the_prompt_tokens_this_router_sent_since_the_report():
    u = V("u", prefill_tokens=500, sent_tokens=1700, sent_tokens_at_report=1200)
    assert balance.estimated_prefill(u) == 1000
    assert balance.estimated_ttft(u, 300) == 1300
    # 10 requests on 8 batch slots: a new one is the third beyond them and waits for three running
    # answers to end, charged a prompt like its own for each
    u.in_flight, u.max_running = 10, 8
    assert balance.estimated_ttft(u, 300) == 1000 + 300 * 4
    # every slot taken and none waiting: the new request still waits for one answer to end
    u.in_flight = 8
    assert not balance.has_free_slot(u)
    assert balance.estimated_ttft(u, 300) == 1000 + 300 * 2
    u.in_flight = 7  # a slot free: its own prompt only
    assert balance.has_free_slot(u)
    assert balance.estimated_ttft(u, 300) == 1000 + 300


def test_answers_that_gain_several_tokens_per_step_end_sooner_in_the_estimate():
    """A unit that speculates (tokens_per_step 2) ends the answers a new request waits for in half the
    steps: each counts half a prompt; its own prefill and the prefill queued there count in full. A
    unit that does not say (0, an older revision) or gains one token per step counts as before."""
    slow = V("slow", prefill_tokens=1000, in_flight=10, max_running=8)
    fast = V("fast", prefill_tokens=1000, in_flight=10, max_running=8, tokens_per_step=2.0)
    own = 1000 + 300  # the prefill ahead and the request's own
    waiting = balance.estimated_ttft(slow, 300) - own  # three answers to wait for, a prompt each
    assert waiting == 3 * 300
    assert balance.estimated_ttft(fast, 300) - own == waiting / 2
    for said in (0.0, 1.0):
        assert (
            balance.estimated_ttft(V("u", prefill_tokens=1000, in_flight=10, tokens_per_step=said), 300)
            == own + waiting
        )
    pick = balance.least_work([slow, fast], _always, random.Random(0), 300)
    assert pick is fast


def test_a_preferred_unit_with_requests_waiting_for_a_batch_slot_is_passed_over():
    units = [V(f"u{i}") for i in range(8)]
    ring = _ring(units)
    key = balance.key_hash(b"conv")
    preferred = next(ring.walk(key))
    preferred.in_flight = 9  # one beyond its 8 slots, and within (1 + eps) x the mean of 9/8
    chosen = balance.by_key(ring, key, _always, mean_load=9 / 8)
    assert chosen is None


def test_a_preferred_unit_whose_every_slot_is_taken_loses_to_an_idle_one_whatever_the_slack():
    """Two units of one batch slot, the key's unit running one long answer and its prefill queue empty:
    by prefill alone it is ahead of the idle unit (it holds 40 of the request's 50 tokens), and the slack
    would keep the request there, where it would wait for the long answer to end. A unit with no slot
    free is not the preferred one."""
    units = [V("u0", max_running=1), V("u1", max_running=1)]
    ring = _ring(units)
    key_h = next(h for h in map(balance.key_hash, (b"%d" % k for k in range(1000))) if next(ring.walk(h)) is units[0])
    units[0].in_flight = units[0].running = 1
    for seed in range(10):
        chosen = balance.by_cache_and_work(
            ring, units, _always, random.Random(seed), key=key_h, tokens=50, cached=40, mean_load=0.5, slack=4.0
        )
        assert chosen is units[1]
    units[0].in_flight = units[0].running = 0  # its slot free again: the key's unit keeps its key
    assert (
        balance.by_cache_and_work(ring, units, _always, random.Random(0), key=key_h, tokens=50, cached=0, mean_load=0.0)
        is units[0]
    )


# --- following a conversation that left its key's unit -------------------------------------------------
def test_the_unit_that_took_a_keys_last_request_is_preferred_over_the_keys_unit_on_the_ring():
    units = [V(f"u{i}") for i in range(8)]
    ring = _ring(units)
    req = balance.RequestKey(key=balance.key_hash(b"conv"), tokens=1000, source="prefix", cached=900)
    on_ring = next(ring.walk(req.key))
    holder = next(u for u in units if u is not on_ring)
    for seed in range(20):  # whatever the sample: the holder's 100 new tokens beat anyone's 1,000
        chosen = balance.by_cache_and_work(
            ring,
            units,
            _always,
            random.Random(seed),
            key=req.key,
            tokens=1000,
            cached=900,
            mean_load=0.0,
            holder=holder,
        )
        assert chosen is holder


def test_an_unready_or_overloaded_holder_falls_back_to_the_keys_unit_on_the_ring():
    units = [V(f"u{i}") for i in range(8)]
    ring = _ring(units)
    key = balance.key_hash(b"conv")
    on_ring = next(ring.walk(key))
    holder = next(u for u in units if u is not on_ring)

    def pick(usable, mean_load=0.0):
        return balance.by_cache_and_work(
            ring, units, usable, random.Random(1), key=key, tokens=1000, cached=900, mean_load=mean_load, holder=holder
        )

    assert pick(lambda u: u is not holder) is on_ring  # unready (or already tried for this request)
    holder.in_flight = 3  # above ceil(2 x (1/8 + 1/8)) = 1 on an otherwise idle fleet: the bound
    assert pick(_always, mean_load=1 / 8) is on_ring


def test_key_holders_forget_the_least_recently_noted_key_past_their_capacity():
    holders: balance.KeyHolders[str] = balance.KeyHolders(capacity=3)
    for k, unit in ((1, "a"), (2, "b"), (3, "c")):
        holders.note(k, unit)
    holders.note(1, "d")  # noted again: now the most recent, and moved
    holders.note(4, "e")  # one past the capacity: key 2, the least recently noted, goes
    assert (holders.get(1), holders.get(2), holders.get(3), holders.get(4), len(holders)) == ("d", None, "c", "e", 3)


def test_a_completion_prompt_resending_the_keys_last_one_is_taken_as_cached_and_others_are_not():
    prompts = balance.KeyPrompts()
    first = balance.request_key(json.dumps({"prompt": list(range(100, 140))}).encode(), "conv-1")
    assert (first.source, first.tokens) == ("session", 40)  # token ids counted as tokens, not bytes
    length, tail, _ = first.prompt_summary
    prompts.note(first.key, length, first.tokens, tail)  # no checkpoints: a whole resend or nothing

    def cached(ids: list[int]) -> int:
        return prompts.cached(first.key, balance.request_key(json.dumps({"prompt": ids}).encode(), "conv-1").prompt)

    assert cached(list(range(100, 140)) + [7, 8, 9]) == 40  # the next turn resends the whole first
    assert cached(list(range(100, 140))) == 40
    assert cached(list(range(100, 139))) == 0  # shorter
    assert cached(list(range(100, 139)) + [1390]) == 0  # "...,139," is not a prefix of "...,1390,"
    assert cached(list(range(200, 260))) == 0  # another conversation under the same session
    lead = "You are a shopping assistant. " * 200  # past PREFIX_KEY_BYTES: every turn has the same key
    text = balance.request_key(json.dumps({"prompt": lead + "Red shoes?"}).encode())
    length, tail, marks = text.prompt_summary
    prompts.note(text.key, length, text.tokens, tail, marks)
    later = balance.request_key(json.dumps({"prompt": lead + "Red shoes? Size 9."}).encode())
    assert later.key == text.key and prompts.cached(later.key, later.prompt) == text.tokens
    # Another question after the same lead: what it resends of the last prompt, through its checkpoints.
    assert text.tokens * 15 // 16 - 1 <= prompts.cached(later.key, (lead + "Blue hat?").encode()) < text.tokens


def test_a_completion_prompt_resending_most_of_the_keys_last_one_is_credited_with_about_what_it_resends():
    """A next prompt that changes the end of the last one (its last few token ids re-tokenized, the last
    turn re-rendered) is credited from the last prompt's checkpoints: never more than the tokens it
    resends, at least half of those when it resends at least half of the last prompt, nothing when it
    resends less than half, and its key's whole prompt when it resends all of it."""
    prompts = balance.KeyPrompts()
    last = list(range(100_000, 100_400))  # 400 ids of 7 bytes each in the compared text ("100000,")
    first = balance.request_key(json.dumps({"prompt": last}).encode(), "conv-1")
    length, tail, marks = first.prompt_summary
    assert len(marks) == balance.PROMPT_CHECKPOINTS
    prompts.note(first.key, length, first.tokens, tail, marks)

    def cached(kept: int) -> int:
        """Credit for a prompt that resends the first `kept` ids of the last one, then goes on differently."""
        ids = last[:kept] + list(range(900_000, 900_000 + 400 - kept + 50))
        return prompts.cached(first.key, balance.request_key(json.dumps({"prompt": ids}).encode(), "conv-1").prompt)

    assert cached(400) == 400  # the whole of it
    for kept in (397, 390, 376, 350, 300, 250, 200):
        assert kept // 2 <= cached(kept) <= kept, kept
    assert cached(397) >= 400 * 15 // 16 - 1  # all but its last 3 ids: the furthest checkpoint, 15/16
    assert cached(199) == 0  # less than half of it: nothing, as before
    assert cached(0) == 0
    unmarked = balance.KeyPrompts()  # a unit of the revision before reports no marks
    unmarked.note(first.key, length, first.tokens, tail)
    ids = last[:397] + [1, 2, 3]
    assert unmarked.cached(first.key, balance.request_key(json.dumps({"prompt": ids}).encode(), "conv-1").prompt) == 0


# --- the router's fleet ------------------------------------------------------------------------------
def _fleet(n: int, **settings) -> Fleet:
    s = RouterSettings(units=("http://127.0.0.1:1",), **settings)
    fleet = Fleet(settings=s, discovery=StaticDiscovery(units=()))
    for i in range(n):
        url = f"http://127.0.0.1:{20000 + i}"
        u = Member(MemberEndpoint(url=url), fleet._index)
        u.apply_report(
            200,
            read_ready(
                {"ready": True, "state": "ready", "role": "leader", "unit": f"unit-{i}", "load": {"max_running": 8}}
            ),
        )
        fleet.members[url] = u
    return fleet


def _pick_served(fleet: Fleet, req: balance.RequestKey, exclude: tuple[Member, ...] = ()) -> Member | None:
    """A pick whose request was then prefilled: the unit's next report (here, a heartbeat: nothing
    waiting) takes the place of the router's own count of what it sent."""
    unit = fleet.pick(exclude, req).unit
    if unit is not None:
        assert fleet.on_watch_line(unit, b"\n")
    return unit


def test_an_unready_preferred_unit_hands_its_keys_to_the_next_and_gets_them_back_when_ready():
    fleet, fresh = _fleet(10), _fleet(10)
    req = balance.request_key(_chat("red shoes"))
    first = _pick_served(fleet, req)
    assert first is not None and all(_pick_served(fleet, req) is first for _ in range(20))
    first.mark_unready("broken")
    others = {_pick_served(fleet, req) for _ in range(20)}
    assert first not in others and len(others) == 1  # all to the same next unit: still agreed on
    (second,) = others
    assert second is not None
    fresh.members[first.url].mark_unready("broken")  # a router that sent nothing meanwhile agrees
    assert _pick_served(fresh, req).url == second.url
    first.apply_report(
        200, read_ready({"ready": True, "state": "ready", "role": "leader", "unit": first.unit, "load": {}})
    )
    fresh.members[first.url].apply_report(
        200, read_ready({"ready": True, "state": "ready", "role": "leader", "unit": first.unit})
    )
    # The ring gives the key back to its unit (a router that never saw the conversation moved sends
    # it there); a router that knows where the conversation's cache now is keeps it there.
    fresh.holders = balance.KeyHolders()
    assert _pick_served(fresh, req).url == first.url
    assert _pick_served(fleet, req) is second


def test_a_saturated_or_already_tried_preferred_unit_is_skipped():
    fleet = _fleet(6, max_outstanding_per_unit=2)
    req = balance.request_key(_chat("red shoes"))
    first = _pick_served(fleet, req)
    assert first is not None
    assert _pick_served(fleet, req, (first,)) not in (first, None)
    first.outstanding = 2
    assert _pick_served(fleet, req) not in (first, None)


def test_a_completion_prompts_next_turn_stays_with_its_cache_where_counting_it_whole_would_move_it():
    """A session's second turn of token ids resends its first (200 ids) and adds 200. Its unit has 250
    prompt tokens waiting; the other is idle. Counted whole, the turn looks cheaper on the idle unit
    (250 + 400 against 400, and no slack for a turn expected to hold nothing); with the first turn's 200
    tokens taken as cached it stays (250 + 200 <= 400 + a slack of those 200). A prompt that does not
    resend the first goes by work."""
    fleet = _fleet(2)
    first_ids = list(range(1000, 1200))
    first = balance.request_key(json.dumps({"prompt": first_ids}).encode(), "conv-7")
    unit = _pick_served(fleet, first)
    assert unit is not None
    assert fleet.on_watch_line(unit, b'{"load":{"prefill_tokens":250,"in_flight":1}}')
    fleet._index.mean_at = -1e9  # the fleet's mean load is recomputed at most every 50 ms: that long passed
    second = balance.request_key(json.dumps({"prompt": first_ids + list(range(5000, 5200))}).encode(), "conv-7")
    assert second.cached == 0  # nothing in the request itself says what is cached
    assert fleet.pick((), second).unit is unit
    other = balance.request_key(json.dumps({"prompt": list(range(7000, 7400))}).encode(), "conv-7")
    assert fleet.pick((), other).unit is not unit


def test_another_conversations_same_opening_counts_as_cached_on_the_unit_that_took_it():
    """Two conversations open with the same system prompt and question: a prefix key, the same for
    both. The unit that took the first holds those messages, so the second's first turn counts them as
    cached there (docs/routing.md, step 4: it stays while its queue ahead, plus what it lacks, is within
    an idle unit's whole prompt plus a slack of the lead tokens). A session key says nothing of what another session
    left, and a router that knows no unit for the key credits nothing."""
    fleet = _fleet(2)
    body = _chat("the same question everybody asks")
    first = balance.request_key(body)
    assert first.source == "prefix" and first.cached == 0 and 0 < first.lead_tokens <= first.tokens
    unit = _pick_served(fleet, first)
    assert unit is not None
    tokens, lead = first.tokens, first.lead_tokens
    stays = 2 * lead  # its queue + (tokens - lead) <= tokens + 1 x lead
    assert stays > 0  # counted whole, any queue would move the turn: nothing to keep it

    def report(queued: int) -> None:
        line = json.dumps({"load": {"prefill_tokens": queued, "in_flight": 1}}).encode()
        assert fleet.on_watch_line(unit, line)
        fleet._index.mean_at = -1e9  # the fleet's mean load is recomputed at most every 50 ms: that long passed

    report(stays)
    assert _pick_served(fleet, balance.request_key(body)) is unit
    report(stays + 1)
    assert _pick_served(fleet, balance.request_key(body)) is not unit
    report(stays)
    session = balance.request_key(body, "conv-9")
    assert session.lead_tokens == 0
    fleet.holders.note(session.key, unit)  # its own earlier turn there: still nothing said to be cached
    assert fleet.pick((), session).unit is not unit
    units = [V("a"), V("b")]
    ring = _ring(units)
    on_ring = next(ring.walk(first.key))
    on_ring.prefill_tokens = stays
    for holder, expected in ((on_ring, on_ring), (None, next(u for u in units if u is not on_ring))):
        chosen = balance.by_cache_and_work(
            ring, units, _always, random.Random(0), key=first.key, tokens=tokens, cached=0, mean_load=0.0,
            holder=holder, lead=lead,
        )  # fmt: skip
        assert chosen is expected  # the key's ring unit, not known to have taken the key, gets no credit


def test_another_router_credits_a_completion_prompts_next_turn_once_the_unit_reports_the_prompt():
    """The same second turn as above, at a router that did not send the first: it learns the first
    prompt only from the unit's watch line (`prompts`: [key, bytes, tokens, tail], the bytes and tail
    as the sending router told the unit, the tokens as the engine counted them)."""
    a, b = _fleet(2), _fleet(2)
    first_ids = list(range(1000, 1200))
    first = balance.request_key(json.dumps({"prompt": first_ids}).encode(), "conv-7")
    unit = _pick_served(a, first)
    assert unit is not None
    second = balance.request_key(json.dumps({"prompt": first_ids + list(range(5000, 5200))}).encode(), "conv-7")
    assert b.prompts.cached(second.key, second.prompt) == 0  # b sent nothing of this conversation
    length, tail, _ = balance.KeyPrompts.summary(first.prompt)
    held = next(u for u in b.members.values() if u.url == unit.url)
    line = b'{"load":{"prefill_tokens":250,"in_flight":1},"keys":[%d],"prompts":[[%d,%d,200,%d]]}' % (
        first.key,
        first.key,
        length,
        tail,
    )
    assert b.on_watch_line(held, line)
    assert b.prompts.cached(second.key, second.prompt) == 200
    b._index.mean_at = -1e9
    assert b.pick((), second).unit is held  # stays with its cache, as at the router that sent the first
    other = balance.request_key(json.dumps({"prompt": list(range(7000, 7400))}).encode(), "conv-7")
    assert b.prompts.cached(other.key, other.prompt) == 0


def test_another_router_credits_most_of_a_prompt_resent_but_for_its_end_from_the_units_marks():
    """A second prompt that keeps all but the first prompt's last 8 of 200 ids: a router that did not
    send the first credits it from the `marks` the unit reports beside `prompts`, and sends it to the
    unit holding the first, as the router that sent the first does."""
    a, b = _fleet(2), _fleet(2)
    first_ids = list(range(1000, 1200))
    first = balance.request_key(json.dumps({"prompt": first_ids}).encode(), "conv-8")
    unit = _pick_served(a, first)
    assert unit is not None
    second = balance.request_key(json.dumps({"prompt": first_ids[:-8] + list(range(5000, 5200))}).encode(), "conv-8")
    assert 0 < a.prompts.cached(second.key, second.prompt) <= 192  # the sender's own note has the marks
    length, tail, marks = balance.KeyPrompts.summary(first.prompt)
    held = next(u for u in b.members.values() if u.url == unit.url)
    entry = {"keys": [first.key], "prompts": [[first.key, length, 200, tail]]}
    assert b.on_watch_line(held, json.dumps({"load": {"prefill_tokens": 250, "in_flight": 1}, **entry}).encode())
    assert b.prompts.cached(second.key, second.prompt) == 0  # no marks (a unit of the revision before)
    line = {"load": {"prefill_tokens": 250, "in_flight": 1}, **entry, "marks": [list(marks)]}
    assert b.on_watch_line(held, json.dumps(line).encode())
    credit = b.prompts.cached(second.key, second.prompt)
    assert credit == a.prompts.cached(second.key, second.prompt) and 200 * 7 // 8 <= credit <= 192
    b._index.mean_at = -1e9
    assert b.pick((), second).unit is held  # stays with its cache


def test_a_watch_line_whose_prompts_are_not_four_integers_or_marks_not_one_list_each_marks_its_unit_unreadable():
    for bad in (
        b'"prompts":[[1,2,3]]',
        b'"prompts":[[1,"2",3,4]]',
        b'"prompts":[7]',
        b'"prompts":[[1,2,3,4]],"marks":[]',
        b'"prompts":[[1,2,3,4]],"marks":[[1,"2"]]',
        b'"prompts":[[1,2,3,4]],"marks":[5]',
        b'"prompts":[[1,2,3,4]],"marks":{"1":[]}',
    ):
        fleet = _fleet(1)
        (u,) = fleet.members.values()
        line = b'{"load":{"in_flight":1},"keys":[1],' + bad + b"}"
        assert not fleet.on_watch_line(u, line) and u.state == "bad_health_body", bad


def test_a_burst_inside_one_period_of_the_mean_counts_the_routers_own_sends_in_it(monkeypatch):
    """Three idle units, one key, three requests with no report between them (a burst inside the 50 ms
    the fleet's mean is kept). The paper's bound with m requests placed, the new one counted, is
    ceil((1 + eps) m / n): 1 for the first, 2 for the second and the third (eps 1, n 3). So the key's
    unit takes two and the third goes by work; with the mean of before the burst (0) it took one."""
    monkeypatch.setattr(fleet_module, "time", types.SimpleNamespace(monotonic=lambda: 100.0))  # one instant
    fleet = _fleet(3)
    req = balance.request_key(_chat("red shoes"))
    picked: list[Member] = []
    for _ in range(3):
        unit = fleet.pick((), req).unit
        assert unit is not None
        unit.outstanding += 1  # what the proxy counts as it sends the request
        picked.append(unit)
        # Its prompt prefilled at once, the request decoding: the unit's report counts it in flight.
        line = b'{"load":{"prefill_tokens":0,"in_flight":%d}}' % picked.count(unit)
        assert fleet.on_watch_line(unit, line)
    assert picked[0] is picked[1] and picked[2] is not picked[0]


def test_a_router_follows_a_conversation_another_router_sent_elsewhere_once_the_unit_reports_its_key():
    a, b = _fleet(8), _fleet(8)
    req = balance.request_key(_chat("red shoes", turns=2))
    assert req.key is not None and req.cached > 0
    on_ring = _pick_served(a, req)
    assert on_ring is not None and _pick_served(b, req).unit == on_ring.unit  # agreed, without the holder
    # Router a sent the conversation's last turn to another unit (its key's unit was busy then); that
    # turn has finished there.
    elsewhere = next(u for u in b.members.values() if u.unit != on_ring.unit)
    assert b.on_watch_line(elsewhere, b'{"load":{"in_flight":0},"keys":[%d]}' % req.key)
    assert b.holders.get(req.key) is elsewhere
    assert all(_pick_served(b, req) is elsewhere for _ in range(5))
    elsewhere.mark_unready("broken")  # the holder goes: back to the key's unit on the ring
    assert _pick_served(b, req).unit == on_ring.unit
    assert b.holders.get(req.key).unit == on_ring.unit  # and the router's own send is noted at once


def test_a_watch_line_that_is_not_one_whole_json_object_marks_its_unit_unreadable():
    for bad in (b'{"load":{}}x', b'{"load":', b"[1]", b'{"load":{},"keys":7}'):
        fleet = _fleet(1)
        (u,) = fleet.members.values()
        assert not fleet.on_watch_line(u, bad) and (u.routable, u.state) == (False, "bad_health_body"), bad
    fleet = _fleet(1)
    (u,) = fleet.members.values()
    assert fleet.on_watch_line(u, b' {"load":{"in_flight":4},"keys":[5]} ') and (u.in_flight, u.routable) == (4, True)


def test_watch_lines_the_fast_parser_refuses_but_json_takes_are_read_as_before():
    """orjson refuses NaN / Infinity (json.dumps writes them for such floats) and integers beyond 64
    bits (orjson 3.13.0 README, "Deserialize" and "int"); the standard library takes both, so they
    must still reach the unit as the standard library reads them."""
    fleet = _fleet(1)
    (u,) = fleet.members.values()
    line = json.dumps({"load": {"in_flight": 3, "kv_cache_used": float("nan")}}).encode()
    assert b"NaN" in line
    assert fleet.on_watch_line(u, line) and u.in_flight == 3 and u.kv_cache_used != u.kv_cache_used  # NaN
    big = 2**70
    assert fleet.on_watch_line(u, b'{"load":{"in_flight":4},"keys":[%d]}' % big)
    assert (u.in_flight, fleet.holders.get(big)) == (4, u)
    assert u.routable


def test_an_image_without_orjson_still_starts_and_reads_watch_lines_with_json():
    """The Neuron node images hold the router's modules (`python -m runtime --help` imports every
    subcommand) without the router's pins: a missing orjson must not break them."""
    code = (
        "import sys; sys.modules['orjson'] = None\n"
        "import runtime.__main__\n"
        "runtime.__main__.modules([])\n"
        "from contract.watch import watch_json\n"
        'print(watch_json(b\'{"load":{"in_flight":2},"keys":[7]}\'))\n'
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "{'load': {'in_flight': 2}, 'keys': [7]}"


def test_the_router_counts_the_prompt_tokens_it_sends_until_the_next_report():
    fleet = _fleet(1)
    (u,) = fleet.members.values()
    req = balance.RequestKey(key=None, tokens=700, source="none")
    assert fleet.pick((), req).unit is u and fleet.pick((), req).unit is u
    assert balance.estimated_prefill(u) == 1400
    assert fleet.on_watch_line(u, b'{"load":{"prefill_tokens":300,"in_flight":2}}')
    assert (u.prefill_tokens, balance.estimated_prefill(u)) == (300, 300)


def test_the_router_reports_how_many_keyed_requests_reached_their_unit_and_how_hot_the_busiest_is():
    fleet = _fleet(4)
    conv = balance.request_key(_chat("red shoes"))
    for _ in range(3):
        _pick_served(fleet, conv)
    fleet.pick((), balance.RequestKey(key=None, tokens=10, source="none"))
    assert fleet.routes == {"preferred": 3, "by_work": 0, "unkeyed": 1}
    units = list(fleet.members.values())
    for u, n in zip(units, (6, 2, 2, 2)):
        u.in_flight, u.outstanding, u.outstanding_at_report = n, 0, 0
    share, busiest = fleet.routing_figures()
    assert share == 100.0 and busiest == 100.0 * 6 / 3
    assert fleet.routing_figures()[0] is None  # nothing keyed since the last report
    line = json.loads(emf.routing_line(routed_to_preferred_pct=share, busiest_unit_load_pct=busiest))
    assert line[contract.METRIC_ROUTED_TO_PREFERRED] == 100.0 and line[contract.METRIC_BUSIEST_UNIT_LOAD] == 200.0
    assert {"Name": contract.METRIC_BUSIEST_UNIT_LOAD, "Unit": "Percent"} in line["_aws"]["CloudWatchMetrics"][0][
        "Metrics"
    ]


def test_the_policy_setting_is_checked_and_least_requests_ignores_work():
    with pytest.raises(ValueError, match="balance"):
        RouterSettings(balance="round_robin")
    # the router's choices are the ones the CDK config and make local offer
    assert get_args(RouterSettings.model_fields["balance"].annotation) == contract.ROUTER_BALANCE_POLICIES
    fleet = _fleet(2, balance="least_requests")
    a, b = fleet.members.values()
    a.prefill_tokens, b.in_flight = 100_000, 1
    req = balance.RequestKey(key=None, tokens=10, source="none")
    assert fleet.pick((), req).unit is a
    fleet = _fleet(2, balance="least_work")
    a, b = fleet.members.values()
    a.prefill_tokens, b.in_flight = 100_000, 1
    assert fleet.pick((), req).unit is b


def test_two_routers_send_a_conversation_to_the_same_unit_end_to_end():
    async def scenario():
        units = [await StandInUnit(name=f"u{i}").start() for i in range(6)]
        try:
            async with router_over(units) as r1, router_over(units) as r2, aiohttp.ClientSession() as s:
                served = []
                for turn in range(1, 5):
                    for router in (r1, r2):
                        async with s.post(
                            base_url(router) + "/v1/chat/completions", data=_chat("red shoes", turns=turn)
                        ) as resp:
                            assert resp.status == 200
                            served.append(resp.headers[contract.UNIT_HEADER])
                            await resp.read()
                assert len(set(served)) == 1
                # Each router tells the unit the request's key, which the unit reports to every router.
                (unit,) = [u for u in units if u.name == served[0]]
                assert set(unit.route_keys) == {str(balance.request_key(_chat("red shoes")).key)}
                async with s.post(
                    base_url(r1) + "/v1/chat/completions",
                    data=_chat("red shoes"),
                    headers={contract.SESSION_HEADER: "another conversation", contract.ROUTE_KEY_HEADER: "1"},
                ) as resp:
                    assert resp.status == 200
                    (unit,) = [u for u in units if u.name == resp.headers[contract.UNIT_HEADER]]
                # a client's own route key never reaches a unit: the router's replaces it
                assert unit.route_keys[-1] == str(balance.key_hash(b"s:another conversation"))
                assert unit.route_prompts[-1] == ""  # a chat has no completion prompt to summarise
                # A completion prompt: the router tells the unit its bytes and tail, as it compares them.
                prompt = list(range(300, 340))
                async with s.post(
                    base_url(r2) + "/v1/completions",
                    data=json.dumps({"model": "m", "prompt": prompt, "max_tokens": 2}).encode(),
                    headers={
                        contract.SESSION_HEADER: "conv-9",
                        contract.ROUTE_PROMPT_HEADER: "1:1",
                        contract.ROUTE_MARKS_HEADER: "1,2",
                    },
                ) as resp:
                    assert resp.status == 200
                    (unit,) = [u for u in units if u.name == resp.headers[contract.UNIT_HEADER]]
                length, tail, marks = balance.KeyPrompts.summary(
                    balance.request_key(json.dumps({"prompt": prompt}).encode(), "conv-9").prompt
                )
                assert (unit.route_keys[-1], unit.route_prompts[-1], unit.route_marks[-1]) == (
                    str(balance.key_hash(b"s:conv-9")),
                    f"{length}:{tail}",
                    ",".join(map(str, marks)),
                )
        finally:
            for u in units:
                await u.stop()

    run(scenario())


# --- the unit's report -------------------------------------------------------------------------------
class _Sup:
    prefill_tokens = 0


_EVENT = {
    "token": lambda: Token(id="r", token_id=7, text="x"),
    "done": lambda: Done(id="r"),
    "error": lambda: Error(id="r", kind="cancelled", message="cancelled by the server"),
}


async def _events(ops):
    for op in ops:
        await asyncio.sleep(0)
        yield _EVENT[op]()


def test_a_unit_counts_a_prompt_as_outstanding_prefill_until_its_first_token_exactly_once():
    async def scenario():
        sup = _Sup()
        p = _Prefilling(sup, 120)  # type: ignore[arg-type]
        seen = []
        async for ev in p.until_first_token(_events(["token", "token", "done"])):
            seen.append(sup.prefill_tokens)
        p.end()  # the handler's finally: must not subtract again
        assert seen == [0, 0, 0] and sup.prefill_tokens == 0
        q = _Prefilling(sup, 50)  # type: ignore[arg-type]
        r = _Prefilling(sup, 70)  # type: ignore[arg-type]
        assert sup.prefill_tokens == 120
        q.end()  # cancelled before any token (the client left)
        async for _ in r.until_first_token(_events(["error"])):
            pass
        assert sup.prefill_tokens == 0

    run(scenario())


# --- the trace model, small --------------------------------------------------------------------------
SMALL = trace_sim.Params(units=32, copies=1, limit=3000, load=0.8)


def test_on_the_conversation_trace_cache_aware_routing_beats_todays_policy_and_keeps_units_even():
    results, scaling = trace_sim.compare(SMALL, ("p4c", "least_work", "cache_aware", "oracle"))
    today, work, cache, oracle = (results[p] for p in ("p4c", "least_work", "cache_aware", "oracle"))
    assert scaling["requests"] == 3000
    assert cache["mean_s"] < work["mean_s"] < today["mean_s"]
    assert cache["hit_rate"] > 2 * today["hit_rate"]
    assert oracle["mean_s"] <= cache["mean_s"]
    assert cache["busiest_over_mean"] < 1.5
