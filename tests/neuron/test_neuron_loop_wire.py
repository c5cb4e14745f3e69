"""The neuron engine <-> NxD Inference loop lines (runtime/engines/neuron/loop_wire.py): each message
reads back as written, lines as the loop and engine wrote them before the format was declared still
read, and a line the loop cannot take names its request so the engine can tell its client."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from contract.ready import LoadPhase
from runtime.engines.neuron import loop_wire
from runtime.engines.neuron.loop_wire import (
    Add,
    BadMessage,
    Cancel,
    Following,
    Generated,
    Progress,
    Ready,
    Refused,
    Stop,
    from_loop_line,
    read_from_loop,
    read_to_loop,
    to_loop_line,
)

# Lines exactly as the engine and the loop wrote them by hand before (json.dumps of a dict).
EARLIER_ADD = (
    '{"op": "add", "id": "r1", "prompt": [1, 2, 3], "max_tokens": 16, "top_k": 1, "top_p": 1.0, '
    '"temperature": 1.0, "stop_token_ids": [2]}'
)
EARLIER_OUT = [
    ('{"event": "progress", "phase": "compile"}', Progress("compile")),
    ('{"event": "ready"}', Ready()),
    ('{"id": "r1", "token": 17, "finish": null}', Generated("r1", 17)),
    ('{"id": "r1", "token": 2, "finish": "stop"}', Generated("r1", 2, "stop")),
    ('{"id": "r1", "error": "KeyError: \'prompt\'"}', Refused("r1", "KeyError: 'prompt'")),
]


def test_every_message_to_the_loop_reads_back_as_written():
    for msg in (
        Add("r1", [1, 2, 3], 16, top_k=0, top_p=0.9, temperature=0.7, stop_token_ids=(2,)),
        Cancel("r1"),
        Stop(),
    ):
        line = to_loop_line(msg)
        assert line.endswith(b"\n") and line.count(b"\n") == 1
        assert read_to_loop(line) == msg


def test_every_message_from_the_loop_reads_back_as_written():
    for msg in [*(msg for _, msg in EARLIER_OUT), Following(12)]:
        line = from_loop_line(msg)
        assert line.endswith("\n") and line.count("\n") == 1
        assert read_from_loop(line) == msg


def test_the_earlier_lines_read_and_the_encoders_write_them_again():
    assert read_to_loop(EARLIER_ADD) == Add("r1", [1, 2, 3], 16, stop_token_ids=(2,))
    assert json.loads(to_loop_line(Add("r1", [1, 2, 3], 16, stop_token_ids=(2,)))) == json.loads(EARLIER_ADD)
    assert json.loads(to_loop_line(Cancel("r9"))) == {"op": "cancel", "id": "r9"}
    assert json.loads(to_loop_line(Stop())) == {"op": "stop"}
    for line, msg in EARLIER_OUT:
        assert read_from_loop(line) == msg
        assert json.loads(from_loop_line(msg)) == json.loads(line)


def test_an_add_the_loop_cannot_take_names_its_request():
    for bad, rid in [
        ('{"op": "add", "id": "r2", "max_tokens": 4}', "r2"),
        ('{"op": "add", "id": "r3", "prompt": ["x"], "max_tokens": 4}', "r3"),
        ('{"op": "add", "prompt": [1], "max_tokens": 4}', None),
        ('{"op": "cancel", "id": 7}', "7"),
        ("[1, 2]", None),
    ]:
        with pytest.raises(BadMessage) as e:
            read_to_loop(bad)
        assert e.value.id == rid


def test_lines_of_no_known_kind_are_passed_over():
    assert read_to_loop('{"op": "resize", "id": "r1"}') is None
    assert read_from_loop('{"event": "neuron_node_loaded", "node_rank": 1}') is None


def test_a_followers_line_is_one_an_engine_from_before_it_passes_over():
    # Before Following, a line with an event other than ready or progress and neither "token" nor
    # "error" read as None (passed over): a follower's loop of this revision under an older engine
    # costs nothing.
    line = json.loads(from_loop_line(Following(3)))
    assert line == {"event": "following", "commands": 3}
    assert "token" not in line and "error" not in line


def test_the_phases_the_loop_reports_are_ones_the_node_knows():
    spelled = {loop_wire.PHASE_COMPILE, loop_wire.PHASE_LOAD, loop_wire.PHASE_WARMUP, loop_wire.PHASE_JOIN}
    assert spelled == {LoadPhase.COMPILE.value, LoadPhase.LOAD.value, LoadPhase.WARMUP.value, LoadPhase.JOIN.value}


def test_the_loop_script_reads_the_module_without_the_flotilla_package():
    # spmd.py runs as a script with the image's Python: its folder is sys.path[0], the package is not.
    folder = Path(loop_wire.__file__).parent
    code = "import sys, loop_wire; assert 'runtime' not in sys.modules; print(loop_wire.to_loop_line(loop_wire.Stop()))"
    out = subprocess.run([sys.executable, "-c", code], cwd=folder, capture_output=True, text=True, check=True)
    assert "stop" in out.stdout
