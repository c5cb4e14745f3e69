"""One reading of a member's ready body (runtime.node.handshake.read_ready) for every reader: what
it accepts (bodies of older revisions, load-only watch lines, the newer `loading` and `keys`) and
rejects, the router's hand-read load-only fast path agreeing with it, and a polled member whose body
cannot be used marked as such while its health loop goes on."""

from __future__ import annotations

import pytest
from router_standins import StandInUnit
from router_testkit import router_over, run, wait_for

from contract.ready import ROUTED_NAMES, LoadReport, load_figures
from runtime.node.handshake import read_ready
from runtime.router.discovery import MemberEndpoint
from runtime.router.fleet import Member

LOAD_FIELDS = ROUTED_NAMES


def _unit() -> Member:
    return Member(MemberEndpoint(url="http://127.0.0.1:1"))


def _taken(unit: Member) -> tuple:
    return tuple(getattr(unit, f) for f in LOAD_FIELDS)


@pytest.mark.parametrize(
    "load",
    [
        {},
        {"in_flight": 3, "running": 2, "max_running": 8, "kv_cache_used": 0.5, "wait_s": 1.5, "prefill_tokens": 70},
        {"running": 2, "step_s": 4.2},  # a busy unit's longest recent step
        {"running": 1, "tokens_per_step": 2.4, "spec_draft_tokens": 90},  # a unit that speculates
        {"running": "4", "kv_cache_used": "0.25"},  # numbers as strings convert, as int()/float() do
        {"running": True, "queue_depth": 2.0},
        {"prefix_cache_hits": 9, "something_newer": [1]},  # keys a reader does not use are ignored
    ],
)
def test_the_hand_read_load_fast_path_takes_what_the_typed_report_takes(load):
    fast, typed = _unit(), _unit()
    fast.take_load(load_figures(load))
    typed.take_load(read_ready({"load": load}).load.figures())
    assert _taken(fast) == _taken(typed)


def test_a_leader_in_state_ready_that_says_not_ready_is_named_stalled():
    # Its progress watch found its engine silent past its stall bound (docs/node.md); "left routing
    # (ready)" in a stream's error would say nothing.
    unit = _unit()
    unit.apply_report(503, read_ready({"ready": False, "state": "ready", "role": "leader", "load": {"running": 2}}))
    assert (unit.ready, unit.state) == (False, "stalled")


@pytest.mark.parametrize("load", [{"running": [1]}, {"wait_s": "soon"}, {"in_flight": None}, {"running": {}}])
def test_a_load_figure_that_is_not_a_number_is_refused_by_both_readings(load):
    with pytest.raises((ValueError, TypeError)):
        load_figures(load)
    with pytest.raises(ValueError, match="load"):
        read_ready({"load": load})


def test_a_load_only_watch_line_has_no_state_and_the_reported_load():
    report = read_ready({"load": {"in_flight": 2}, "keys": [11, 12]})
    assert report.state is None and report.load.in_flight == 2 and report.keys == [11, 12]
    assert report.load.prefill_tokens == -1  # not said: the router falls back, as for older revisions


def test_a_body_without_role_leads_at_rank_0_only_and_a_bool_rank_is_no_rank():
    assert read_ready({"state": "ready", "rank": 0}).leads
    assert not read_ready({"state": "ready", "rank": 1}).leads
    assert read_ready({"state": "ready", "rank": True}).rank == -1
    assert read_ready({"state": "ready", "rank": 0, "role": "follower"}).leads is False


def test_the_newer_loading_field_is_read_and_a_malformed_one_does_not_spoil_the_body():
    report = read_ready({"state": "forming", "loading": {"phase": "load", "done_bytes": 5, "total_bytes": 10}})
    assert report.loading is not None and report.loading.phase == "load" and report.loading.done_bytes == 5
    assert read_ready({"state": "forming", "loading": {"done_bytes": "x"}}).loading is None


@pytest.mark.parametrize("doc", [[], "ready", 5, None])
def test_a_body_that_is_not_an_object_is_refused_naming_what_it_is(doc):
    with pytest.raises(ValueError, match="must be a JSON object"):
        read_ready(doc)


@pytest.mark.parametrize("doc", [{"load": 5}, {"keys": 5}])
def test_load_and_keys_of_the_wrong_shape_are_refused(doc):
    with pytest.raises(ValueError):
        read_ready(doc)


def test_a_polled_member_whose_load_is_unusable_is_marked_and_still_polled():
    async def scenario():
        a = await StandInUnit(name="a", watch=False).start()  # an older revision: polled, not watched
        async with router_over([a]) as router:
            good = a.ready_body
            a.ready_body = lambda: {**good(), "load": {"running": "many"}}  # type: ignore[method-assign]
            unit = router.fleet.members[a.url]
            await wait_for(lambda: unit.state == "bad_health_body", what="the body to be refused")
            polls = a.polls
            await wait_for(lambda: a.polls > polls + 2, what="the health loop to keep polling")
            a.ready_body = good  # type: ignore[method-assign]
            await wait_for(lambda: unit.routable, what="the member to be routable again")
        await a.stop()

    run(scenario())


def test_the_fast_load_reading_takes_every_figure_of_the_declaration_in_its_place():
    for i, name in enumerate(LOAD_FIELDS):
        assert load_figures({name: 7})[i] == 7 == LoadReport.model_validate({name: 7}).figures()[i], name
