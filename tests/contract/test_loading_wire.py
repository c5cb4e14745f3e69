"""A loading engine's progress is one type (contract.ready.Loading) from the engine to the reader: the
engine protocol's "progress" line and the ready body's `loading` read back as written, lines and
bodies as the earlier engine and node wrote them still read, and what is not progress is refused."""

from __future__ import annotations

import json

import pytest

from contract.ready import Loading, LoadPhase, read_ready
from runtime.engines.neuron import loop_wire
from runtime.membership import Role
from runtime.node.engine_protocol import Progress, ProtocolError, decode_event, encode
from runtime.node.handshake import Load, ReadyBody, UnitState

# A "progress" line exactly as the engine process wrote it before Loading was its one type (a
# dataclass of its own then), and a ready body's `loading` as the node of that revision wrote it.
EARLIER_LINE = b'{"op":"progress","phase":"fetch_model","done_bytes":412,"total_bytes":810,"phase_s":95.2}\n'
EARLIER_LOADING = {"phase": "fetch_model", "done_bytes": 412, "total_bytes": 810, "phase_s": 95.2}
FETCHING = Loading(phase=LoadPhase.FETCH_MODEL, done_bytes=412, total_bytes=810, phase_s=95.2)


def _body(loading: Loading | None) -> dict:
    return ReadyBody(
        ready=False,
        state=UnitState.FORMING,
        unit="u7",
        revision="r42",
        rank=0,
        world_size=2,
        role=Role.LEADER,
        cell="",
        load=Load(),
        loading=loading,
    ).to_dict()


def test_the_engine_protocols_progress_is_the_ready_bodys_loading():
    assert Progress is Loading


def test_the_engine_writes_progress_as_the_earlier_engine_did():
    assert encode(FETCHING) == EARLIER_LINE
    warming = b'{"op":"progress","phase":"warmup","done_bytes":0,"total_bytes":0,"phase_s":0.0}\n'
    assert encode(Loading(phase=LoadPhase.WARMUP)) == warming


@pytest.mark.parametrize("phase", list(LoadPhase))
def test_progress_reads_back_from_the_engine_line_through_the_ready_body(phase):
    sent = Loading(phase=phase, done_bytes=3, total_bytes=9, phase_s=1.5)
    node_has = decode_event(encode(sent))
    assert node_has == sent and node_has.phase is phase
    assert read_ready(json.loads(json.dumps(_body(node_has)))).loading == sent


def test_the_earlier_engines_line_and_the_earlier_nodes_body_still_read():
    assert decode_event(EARLIER_LINE) == FETCHING
    assert _body(FETCHING)["loading"] == EARLIER_LOADING
    report = read_ready({"state": "forming", "rank": 0, "loading": EARLIER_LOADING})
    assert report.loading == FETCHING and report.loading.phase is LoadPhase.FETCH_MODEL
    assert read_ready({"state": "ready", "rank": 0}).loading is None  # a node from before loading


def test_a_newer_members_phase_drops_its_loading_never_its_body():
    report = read_ready({"state": "forming", "unit": "u7", "loading": {"phase": "defragment", "phase_s": 2.0}})
    assert report.unit == "u7" and report.loading is None


@pytest.mark.parametrize(
    ("line", "named"),
    [
        ({"op": "progress", "phase": "defragment"}, "phase"),
        ({"op": "progress", "phase": "load", "done": 3}, "done"),
        ({"op": "progress", "done_bytes": 3}, "phase"),
        ({"op": "progress", "phase": "load", "done_bytes": "many"}, "done_bytes"),
    ],
    ids=["unknown phase", "unknown key", "no phase", "bytes not a number"],
)
def test_a_progress_line_that_is_not_progress_fails_naming_what_is_wrong(line, named):
    with pytest.raises(ProtocolError, match=named):
        decode_event(json.dumps(line))


def test_the_neuron_loops_phases_are_load_phases():
    # The loop (runtime/engines/neuron/spmd.py) imports no flotilla module, so it spells its phases itself.
    spelled = {loop_wire.PHASE_COMPILE, loop_wire.PHASE_LOAD, loop_wire.PHASE_WARMUP, loop_wire.PHASE_JOIN}
    assert spelled <= {p.value for p in LoadPhase}
