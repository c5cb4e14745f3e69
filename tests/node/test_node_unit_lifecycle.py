"""Unit lifecycle on real processes: a follower killed mid-stream, re-forming, revision mismatch,
the restart budget, and the SIGTERM drain."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from nodeproc import Unit, get_json, wait_for

import contract


class OpenStream:
    """A streamed completion read on a thread until the server closes it: its SSE data payloads as
    sent (JSON objects, then "[DONE]"). close() leaves it early, as a client that disconnects."""

    def __init__(self, unit: Unit, *, max_tokens: int, request_id: str) -> None:
        body = {
            "model": "tiny",
            "prompt": "tell me everything",
            "max_tokens": max_tokens,
            "stream": True,
            "temperature": 0,
            "ignore_eos": True,
        }
        req = urllib.request.Request(
            unit.url + "/completions",
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Content-Type": "application/json", contract.REQUEST_ID_HEADER: request_id},
        )
        self._resp = urllib.request.urlopen(req, timeout=60)
        self.events: list[str] = []
        self.first = threading.Event()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        try:
            for line in self._resp:
                line = line.strip()
                if line.startswith(b"data: "):
                    self.events.append(line[6:].decode())
                    self.first.set()
        except (OSError, ValueError, AttributeError):
            pass  # left by close()

    def errors(self) -> list[dict]:
        return [e for e in (json.loads(p) for p in self.events if p != "[DONE]") if "error" in e]

    def close(self) -> None:
        self._resp.close()
        self.reader.join(timeout=10)
        assert not self.reader.is_alive(), "the stream's reader did not end"


def stream_under_way(unit: Unit, *, max_tokens: int, request_id: str) -> tuple[list[str], threading.Thread]:
    """Open a streamed completion (OpenStream); return once the first payload has arrived (at most
    30 s): the payloads so far, growing, and the thread that reads them until the server closes."""
    stream = OpenStream(unit, max_tokens=max_tokens, request_id=request_id)
    assert stream.first.wait(30), f"no token of {request_id} within 30 s"
    return stream.events, stream.reader


def completion(unit: Unit, **kw) -> tuple[int, dict, dict]:
    body = {"model": "tiny", "prompt": "hello", "max_tokens": 4, **kw}
    req = urllib.request.Request(
        unit.url + "/completions",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers), json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), json.load(e)


@pytest.fixture
def unit(new_unit) -> Unit:
    return new_unit()


def test_killing_a_follower_mid_stream_ends_the_stream_with_an_error_and_the_unit_reforms(unit):
    unit.start().wait_ready()
    follower = unit.members[1]
    events, reader = stream_under_way(unit, max_tokens=2000, request_id="doomed-1")
    unary: list = []
    waiter = threading.Thread(
        target=lambda: unary.append(completion(unit, max_tokens=2000, ignore_eos=True)), daemon=True
    )
    waiter.start()
    wait_for(
        lambda: get_json(unit.leader.url + contract.NODE_READY_PATH)[1]["load"]["running"] == 2,
        timeout=20,
        what="both requests to be running",
    )
    killed_at = time.monotonic()
    follower.sigkill()
    reader.join(timeout=15)
    assert not reader.is_alive(), "the stream did not end within 15 s of the follower's death"
    waiter.join(timeout=15)
    assert not waiter.is_alive(), "the non-streamed request did not end within 15 s of the follower's death"
    status, headers, body = unary[0]
    assert status == 503 and body["error"]["type"] == "service_unavailable" and headers.get("Retry-After")
    ended_after = time.monotonic() - killed_at
    last = json.loads(events[-1])
    assert "error" in last and last["error"]["type"] == "service_unavailable", events[-3:]
    assert "[DONE]" not in events
    # The unit is not ready, but the leader stays alive while it re-forms.
    status, body = unit.leader.ready()
    assert status == 503 and body["ready"] is False and body["state"] in ("forming", "broken")
    assert unit.leader.live()[0] == 200
    assert completion(unit)[0] == 503
    # The follower comes back: the unit re-forms and serves again.
    follower.start()
    unit.wait_ready(timeout=120)
    status, headers, body = completion(unit, temperature=0)
    assert status == 200 and body["usage"]["completion_tokens"] >= 1
    reforms = unit.leader.log_events("unit_reform")
    assert reforms and reforms[0]["restarts_in_window"] == 1
    print(f"stream ended {ended_after:.2f}s after the follower was killed")


@pytest.mark.parametrize("frozen", [0, 1], ids=["leader", "follower"])
def test_a_node_held_up_past_the_peer_deadline_while_its_engine_steps_keeps_the_unit_and_its_answers(unit, frozen):
    """A member's node that misses its peer's status polls for longer than FLOTILLA_PEER_DEAD_AFTER_S
    while its engine keeps stepping with the other's (a busy host, a loop held up) is slow, not dead:
    the unit must not re-form under the requests it is running. (It did: the follower counted the
    leader gone, killed its engine, and the leader's answers ended in 503s naming rank 1's death.)"""
    dead_after = float(unit.env["FLOTILLA_PEER_DEAD_AFTER_S"])
    unit.start().wait_ready()
    # Four answers of 2,000 tokens: far longer than the freeze, so the engines step all through it.
    streams = [OpenStream(unit, max_tokens=2000, request_id=f"held-{k}") for k in range(4)]
    wait_for(
        lambda: get_json(unit.leader.url + contract.NODE_READY_PATH)[1]["load"]["running"] == 4,
        timeout=20,
        what="all four requests to be running",
    )
    node = unit.members[frozen]
    node.sigstop_node()
    time.sleep(dead_after + 1.5)  # past the deadline
    node.sigcont()
    resumed = [len(s.events) for s in streams]
    # Every answer goes on after the freeze (then the client leaves: the rest would only cost time).
    wait_for(
        lambda: all(len(s.events) > n + 10 for s, n in zip(streams, resumed)),
        timeout=30,
        what="every answer to go on after the freeze",
    )
    for s in streams:
        s.close()
    assert not [e for s in streams for e in s.errors()]
    for m in unit.members:
        assert not m.log_events("unit_reform"), m.log_events("unit_reform")
        assert [e["new"] for e in m.log_events("unit_state")] == ["ready"], m.log_events("unit_state")
    # The other member said so, once, and how long the frozen node was silent when it answered again.
    other = unit.members[1 - frozen]
    (ended,) = other.wait_for_event("peer_slow_ended", timeout=10)  # at its next status poll
    (slow,) = other.log_events("peer_slow")
    assert slow["peer"] == ended["peer"] == frozen and slow["silent_s"] > dead_after
    assert dead_after + 1.5 <= ended["silent_s"] < dead_after + 1.5 + 5, ended
    assert not node.log_events("peer_slow")


def test_sigterm_lets_the_long_generation_finish_refuses_new_work_and_exits_0(unit):
    unit.env["FLOTILLA_DRAIN_TIMEOUT_S"] = "120"
    unit.start().wait_ready()
    events, reader = stream_under_way(unit, max_tokens=400, request_id="long-1")
    unit.leader.sigterm()
    wait_for(lambda: unit.leader.ready()[0] == 503, timeout=5, what="not-ready right after SIGTERM")
    assert unit.leader.ready()[1]["state"] == "draining"
    status, headers, body = completion(unit)
    assert status == 503 and headers.get("Retry-After") and "draining" in body["error"]["message"]
    assert unit.leader.wait(timeout=150) == 0
    reader.join(timeout=10)
    assert events[-1] == "[DONE]"
    tokens = [e for e in events if e != "[DONE]"]
    assert len(tokens) == 400 and json.loads(tokens[-1])["choices"][0]["finish_reason"] == "length"
    # The follower notices its leader left and waits for a new one; SIGTERM stops it cleanly too.
    unit.members[1].sigterm()
    assert unit.members[1].wait(timeout=30) == 0


def test_members_of_different_revisions_never_form_a_unit(unit):
    unit.members[0].start()
    unit.members[1].start(**{contract.ENV_REVISION: "r2"})
    refusal = unit.leader.wait_for_event("refusing_member", timeout=60)[0]
    assert "revision" in refusal["problem"] and "r2" in refusal["problem"]
    for m in unit.members:
        status, body = m.ready()
        assert status == 503 and body["state"] == "forming"
        assert m.live()[0] == 200
    assert not unit.leader.log_events("formation_offered")


def test_an_exhausted_restart_budget_fails_liveness_and_exits_1(unit):
    unit.members[0].start(FLOTILLA_MAX_RESTARTS="0")
    unit.members[1].start()
    unit.wait_ready()
    unit.members[1].sigkill()
    assert unit.leader.wait(timeout=30) == 1
    assert unit.leader.log_events("restart_budget_exhausted")


def test_when_the_leader_dies_followers_turn_unready_stay_alive_and_rejoin_its_replacement(unit):
    unit.start().wait_ready()
    follower = unit.members[1]
    unit.leader.sigkill()
    wait_for(lambda: follower.ready()[0] == 503, timeout=15, what="the follower to report the unit unready")
    assert follower.live()[0] == 200
    unit.leader.start()
    unit.wait_ready(timeout=120)
    status, headers, body = completion(unit, temperature=0)
    assert status == 200 and body["usage"]["completion_tokens"] >= 1


def test_a_draining_follower_drains_the_whole_unit_then_the_unit_reforms_with_its_replacement(unit):
    unit.env["FLOTILLA_DRAIN_TIMEOUT_S"] = "120"
    unit.start().wait_ready()
    follower = unit.members[1]
    events, reader = stream_under_way(unit, max_tokens=300, request_id="outlives-1")
    follower.sigterm()
    wait_for(lambda: unit.leader.ready()[1]["state"] == "draining", timeout=10, what="the leader to drain the unit")
    status, headers, body = completion(unit)
    assert status == 503 and headers.get("Retry-After")
    reader.join(timeout=120)
    assert events[-1] == "[DONE]" and len(events) == 301  # the in-flight request finished whole
    assert follower.wait(timeout=30) == 0
    follower.start()
    unit.wait_ready(timeout=120)
    assert completion(unit, temperature=0)[0] == 200


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie waiting for its new parent to reap it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _engine_processes(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            if b"runtime.node.engine_host" in Path(f"/proc/{pid}/cmdline").read_bytes():
                out.append(pid)
        except OSError:
            pass
    return out


def test_a_leader_killed_while_its_engine_loads_leaves_no_engine_behind(tmp_path):
    # The engine process runs in a session of its own and reads its stdin only once started, so
    # nothing but its own watch ends it when its supervisor dies during a long load.
    unit = Unit(tmp_path, name="unit-orphan", world_size=1, engine="echo", FLOTILLA_ECHO_LOAD_S="100000")
    leader = unit.leader.start()
    engines: list[int] = []
    try:
        engines = wait_for(lambda: _engine_processes(leader._tree()), timeout=60, what="the engine process")
        # the engine told its supervisor it is starting and now only loads: it writes nothing more, so
        # no broken pipe would end it either
        leader.wait_for_event("engine_starting", timeout=60)
        assert leader.ready()[0] == 503
        leader.sigkill()
        wait_for(lambda: not any(_alive(p) for p in engines), timeout=30, what="the engine gone with its leader")
    finally:
        for p in engines:
            if _alive(p):
                os.kill(p, signal.SIGKILL)
        leader.stop()


def test_a_node_that_was_itself_held_up_gives_its_peer_the_whole_deadline_after_it_wakes(new_unit):
    """An idle unit whose two nodes are held up past the peer deadline while each waits on the other's
    status: the follower's node stops first, so the leader's poll of it is in flight when the leader's
    node stops too. On waking, the poll it waited on ends at once, unanswered: that is the leader's own
    silence, not its follower's, and the unit keeps its formation. An idle leader sees no engine step,
    so the status rule alone decides there (docs/node.md, "Slow is not dead")."""
    unit = new_unit(engine="echo")
    dead_after = float(unit.env["FLOTILLA_PEER_DEAD_AFTER_S"])
    unit.start().wait_ready()
    leader, follower = unit.members
    for _ in range(2):  # twice: the leader's node stops mid-poll in most tries, not in every one
        follower.sigstop_node()
        time.sleep(0.3)  # the leader's status round now waits on the stopped follower, up to its 1 s deadline
        leader.sigstop_node()
        time.sleep(dead_after + 1.5)
        follower.sigcont()
        leader.sigcont()
        # Past another deadline: a member that counted its own stop as its peer's silence re-formed by now.
        time.sleep(dead_after + 1.0)
    for m in unit.members:
        assert not m.log_events("unit_reform"), m.log_events("unit_reform")
    assert leader.ready()[0] == 200
