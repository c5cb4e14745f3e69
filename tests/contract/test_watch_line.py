"""The /health/watch line (contract.watch): what the node writes the router reads back, lines a leader
of an earlier revision wrote still read, and a line that is not one is refused."""

from __future__ import annotations

import pytest

from contract.ready import load_figures, read_ready
from contract.watch import WatchWriter, admitted_fields, read_watch_line
from runtime.membership import Role
from runtime.node.handshake import Load, ReadyBody, UnitState

# Lines exactly as the node wrote them before the format was declared in one module (its watch
# handler joined the bytes by hand): a router of this revision must read them while a rollout mixes
# revisions. LOAD_ONLY has no keys; KEYS_ONLY is a leader from before prompts; NO_MARKS from before marks.
_LOAD = (
    b'{"queue_depth":1,"running":4,"max_running":8,"kv_cache_used":0.25,"in_flight":5,"prefill_tokens":300,'
    b'"wait_s":0.5,"queue_timeout_s":30.0,"prefix_cache_queries":0,"prefix_cache_hits":0,'
    b'"prefix_cache_hit_rate":0.0,"step_s":0.04,"spec_draft_tokens":0,"spec_accepted_tokens":0,'
    b'"spec_acceptance_rate":0.0,"tokens_per_step":1.5}'
)
WHOLE = (
    b'{"ready":true,"state":"ready","unit":"u7","revision":"r42","rank":0,"world_size":2,"role":"leader",'
    b'"cell":"cell3","members":[],"leader":"","strategies":null,"loading":null,"load":' + _LOAD + b',"keys":[11,12,13],'
    b'"prompts":[[12,120,30,99],[13,64,16,5]],"marks":[[7,8],[]]}\n'
)
LOAD_ONLY = b'{"load":' + _LOAD + b"}\n"
WITH_KEYS = b'{"load":' + _LOAD + b',"keys":[11,12,13],"prompts":[[12,120,30,99],[13,64,16,5]],"marks":[[7,8],[]]}\n'
KEYS_ONLY = b'{"load":{"in_flight":2,"running":1},"keys":[11]}'
NO_MARKS = b'{"load":{"in_flight":2},"keys":[12],"prompts":[[12,120,30,99]]}'
ADMITTED = [(11, None), (12, (120, 30, 99, (7, 8))), (13, (64, 16, 5, ()))]
NOTED = [(12, 120, 30, 99, (7, 8)), (13, 64, 16, 5, ())]


def _body(**change: object) -> dict:
    load = Load(
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
    fields = dict(
        ready=True,
        state=UnitState.READY,
        unit="u7",
        revision="r42",
        rank=0,
        world_size=2,
        role=Role.LEADER,
        cell="cell3",
        load=load,
    )
    return ReadyBody(**{**fields, **change}).to_dict()  # type: ignore[arg-type]


def test_a_watch_writes_the_whole_body_then_the_load_alone_then_a_heartbeat_as_the_earlier_node_did():
    w = WatchWriter()
    assert w.line(_body(), ADMITTED) == WHOLE
    assert w.line(_body(), ADMITTED) == WITH_KEYS  # nothing beyond the load changed; keys go with it
    assert w.line(_body()) == b"\n"  # nothing changed: a heartbeat
    assert w.line(_body(load=Load(running=5))).startswith(b'{"load":{"queue_depth":0,"running":5,')
    assert w.line(_body(state=UnitState.DRAINING)).startswith(b'{"ready":true,"state":"draining",')


def test_what_the_node_writes_the_router_reads_back():
    w = WatchWriter()
    keys, prompts, load, body = read_watch_line(w.line(_body(), ADMITTED)[:-1]) or ((), (), None, None)
    assert (keys, prompts, load) == ([11, 12, 13], NOTED, None)
    report = read_ready(body)
    assert (report.unit, report.state, report.load.figures()) == ("u7", "ready", load_figures(_body()["load"]))
    keys, prompts, load, body = read_watch_line(w.line(_body(), ADMITTED)[:-1]) or ((), (), None, None)
    assert (keys, prompts, body) == ([11, 12, 13], NOTED, None)
    assert load is not None and load_figures(load) == (1, 4, 8, 0.25, 5, 300, 0.5, 30.0, 0.04, 1.5)
    assert read_watch_line(w.line(_body())[:-1]) is None


@pytest.mark.parametrize(
    ("line", "keys", "prompts"),
    [
        (LOAD_ONLY, [], []),
        (WITH_KEYS, [11, 12, 13], NOTED),
        (KEYS_ONLY, [11], []),
        (NO_MARKS, [12], [(12, 120, 30, 99, ())]),
    ],
)
def test_load_lines_of_the_earlier_node_and_of_revisions_before_prompts_and_marks_still_read(line, keys, prompts):
    read = read_watch_line(line.rstrip(b"\n"))
    assert read is not None and read[:2] == (keys, prompts) and read[3] is None


def test_a_whole_body_of_the_earlier_node_still_reads():
    read = read_watch_line(WHOLE[:-1])
    assert read is not None and read[2] is None and read[1] == NOTED
    assert read_ready(read[3]).load.in_flight == 5


def test_keys_and_prompts_are_written_in_order_with_marks_beside_them():
    assert admitted_fields([]) == b""
    assert admitted_fields([(5, None)]) == b',"keys":[5]'
    assert admitted_fields([(5, (1, 2, 3, (9,)))]) == b',"keys":[5],"prompts":[[5,1,2,3]],"marks":[[9]]'


@pytest.mark.parametrize(
    "line",
    [
        b"[1,2]",
        b'{"load":[1]}',
        b'{"keys":[1]}',
        b'{"load":{},"keys":[1],"prompts":[[1,2,3]]}',
        b'{"load":{},"keys":[1],"prompts":[[1,2,3,"x"]]}',
        b'{"load":{},"keys":[1],"prompts":[[1,2,3,4]],"marks":[]}',
        b'{"load":{},"keys":[1],"prompts":[[1,2,3,4]],"marks":[["a"]]}',
        b"not json",
    ],
)
def test_a_line_that_is_not_a_watch_line_is_refused(line):
    with pytest.raises((ValueError, KeyError, TypeError)):
        read_watch_line(line)
