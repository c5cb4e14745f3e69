"""A member's load figures are declared once (contract.ready.Load): what readers take of them
(LoadReport, load_figures, a router's Member) is derived from that declaration, a load a member
writes reads back figure for figure, and a load as members of earlier revisions wrote it still reads."""

from __future__ import annotations

import json
from dataclasses import fields

import pytest

from contract.ready import ROUTED_FIGURES, ROUTED_NAMES, Load, LoadReport, Routed, load_figures, read_ready
from runtime.router.discovery import MemberEndpoint
from runtime.router.fleet import Member

# A load exactly as a leader wrote it before readers were derived from Load (tests/contract/test_watch_line.py
# has the same bytes inside whole watch lines), and one of a revision before in_flight and prefill_tokens.
EARLIER = (
    b'{"queue_depth":1,"running":4,"max_running":8,"kv_cache_used":0.25,"in_flight":5,"prefill_tokens":300,'
    b'"wait_s":0.5,"queue_timeout_s":30.0,"prefix_cache_queries":0,"prefix_cache_hits":0,'
    b'"prefix_cache_hit_rate":0.0,"step_s":0.04,"spec_draft_tokens":0,"spec_accepted_tokens":0,'
    b'"spec_acceptance_rate":0.0,"tokens_per_step":1.5}'
)
BEFORE_IN_FLIGHT = {"queue_depth": 2, "running": 3, "max_running": 8, "kv_cache_used": 0.5}


def _written() -> Load:
    return Load(
        queue_depth=1,
        running=4,
        max_running=8,
        kv_cache_used=0.25,
        in_flight=5,
        prefill_tokens=300,
        wait_s=0.5,
        queue_timeout_s=30.0,
        step_s=0.04,
        tokens_per_step=1.5,
    )


def test_readers_take_every_figure_load_declares_of_the_same_kind():
    assert LoadReport.model_fields.keys() == Load.model_fields.keys()
    for name, info in Load.model_fields.items():
        assert LoadReport.model_fields[name].annotation is info.annotation, name


def test_the_routed_figures_are_the_marked_ones_in_loads_order():
    marked = [n for n, info in Load.model_fields.items() if any(isinstance(m, Routed) for m in info.metadata)]
    assert list(ROUTED_NAMES) == marked
    assert {"in_flight", "running", "max_running", "wait_s", "step_s"} <= set(marked)


def test_a_written_load_is_the_bytes_the_earlier_member_wrote():
    assert json.dumps(_written().to_dict(), separators=(",", ":")).encode() == EARLIER


def test_a_written_load_reads_back_figure_for_figure():
    sent = _written().to_dict()
    report = LoadReport.model_validate(sent)
    assert report.model_dump() == sent and report.model_fields_set == set(sent)
    assert load_figures(sent) == report.figures() == tuple(sent[name] for name in ROUTED_NAMES)


@pytest.mark.parametrize("name,kind,unsaid", ROUTED_FIGURES, ids=ROUTED_NAMES)
def test_each_routed_figure_reads_in_its_place_by_both_readings(name, kind, unsaid):
    i = ROUTED_NAMES.index(name)
    assert load_figures({name: "7"})[i] == kind(7) == LoadReport.model_validate({name: "7"}).figures()[i]
    assert load_figures({})[i] == unsaid == LoadReport().figures()[i]


def test_a_router_member_takes_each_figure_under_its_name_and_starts_as_a_silent_leaders():
    member = Member(MemberEndpoint(url="http://127.0.0.1:1"))
    assert tuple(getattr(member, name) for name in ROUTED_NAMES) == load_figures({})
    member.take_load(tuple(range(len(ROUTED_NAMES))))
    assert [getattr(member, name) for name in ROUTED_NAMES] == list(range(len(ROUTED_NAMES)))


def test_the_earlier_members_load_reads_as_written():
    sent = json.loads(EARLIER)
    figures = (1, 4, 8, 0.25, 5, 300, 0.5, 30.0, 0.04, 1.5)
    assert read_ready({"load": sent}).load.figures() == load_figures(sent) == figures


def test_a_figure_a_member_of_an_older_revision_leaves_out_reads_as_not_said():
    report = read_ready({"load": BEFORE_IN_FLIGHT}).load
    assert (report.in_flight, report.prefill_tokens) == (-1, -1) == (load_figures(BEFORE_IN_FLIGHT)[4:6])
    assert not report.given("in_flight") and report.given("running")
    assert report.model_dump(exclude_unset=True) == BEFORE_IN_FLIGHT
    assert Load().in_flight == 0  # a member writes 0 where it has none (a follower)


def test_each_figure_the_engine_reports_and_a_member_passes_on_is_of_the_same_kind():
    # The engine's counters (runtime.engines.base.EngineLoad) are the source of the figures a member
    # passes on as they are (runtime/node/supervisor.py builds Load from them each ready body).
    from runtime.engines.base import EngineLoad  # noqa: PLC0415

    shared = [f for f in fields(EngineLoad) if f.name in Load.model_fields]
    assert {f.name for f in shared} >= {"queue_depth", "running", "max_running", "kv_cache_used", "tokens_per_step"}
    for f in shared:
        assert f.type == Load.model_fields[f.name].annotation.__name__, f.name
