"""A streaming client that stays connected but stops reading (docs/node.md, "How a request ends": one
that accepts no bytes for FLOTILLA_CLIENT_STALL_S counts as gone): once the leader's write to it has
waited that long, its request is cancelled in the engine, its batch slot goes to the next request,
and its connection is dropped."""

from __future__ import annotations

import json
import urllib.request

import pytest
from nodeproc import wait_for
from testnet import StalledReader

import contract

LONG = 1900  # tokens: within the echo engine's context of 2,048, and hundreds of KiB of events
MSS = 536  # keeps the leader's send buffer to the client at tens of KiB (testnet.StalledReader)
BELOW_DEFAULT_S = 50  # every wait on the stall is shorter than the default bound (60 s)


def _complete(url: str, body: dict, request_id: str) -> tuple[int, dict]:
    req = urllib.request.Request(
        url + "/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", contract.REQUEST_ID_HEADER: request_id},
    )
    with urllib.request.urlopen(req, timeout=BELOW_DEFAULT_S) as r:
        return r.status, json.load(r)


@pytest.mark.timeout(240)
def test_a_client_that_stops_reading_is_cancelled_after_the_stall_bound_and_its_slot_serves_the_next_request(
    new_unit,
):
    # One batch slot, so the next request can only run once the stalled one has left the engine; a
    # queue timeout far past the stall, so it waits for that rather than ending 429.
    unit = (
        new_unit(
            engine="echo",
            world_size=1,
            FLOTILLA_MAX_RUNNING="1",
            FLOTILLA_CLIENT_STALL_S="1",
            FLOTILLA_QUEUE_TIMEOUT_S="180",
            FLOTILLA_SHED="queue-timeout",
        )
        .start()
        .wait_ready()
    )
    stalled = StalledReader(
        unit.leader.port,
        "/v1/completions",
        {"model": "tiny", "prompt": "stall", "max_tokens": LONG, "stream": True},
        headers={contract.REQUEST_ID_HEADER: "stops-reading"},
        mss=MSS,
    )
    try:
        assert stalled.open().startswith(b"HTTP/1.1 200")
        wait_for(lambda: unit.leader.ready()[1]["load"]["running"] == 1, timeout=30, what="the stream to hold the slot")
        status, body = _complete(unit.url, {"model": "tiny", "prompt": "next", "max_tokens": 4}, "waits")
        assert status == 200 and body["usage"]["completion_tokens"] == 4
        gone = wait_for(
            lambda: next((r for r in unit.leader.log_events("request") if r["request_id"] == "stops-reading"), None),
            timeout=BELOW_DEFAULT_S,
            what="the leader to end the request of a client that reads nothing",
        )
        assert (gone["status"], gone["error_kind"]) == (499, "client_disconnected")
        assert stalled.closed_by_peer(), "the leader kept the connection of a client that reads nothing"
    finally:
        stalled.close()

    def engine_ends() -> dict[str, dict]:
        return {e["request_id"]: e for e in unit.leader.log_events("engine_request_end")}

    ends = wait_for(lambda: len(engine_ends()) == 2 and engine_ends(), timeout=30, what="the engine's account of both")
    # Cancelled, not run to its end: the slot came free because the client was given up on.
    assert ends["stops-reading"]["ending"] == "cancelled" and ends["stops-reading"]["generated"] < LONG
    assert (ends["waits"]["ending"], ends["waits"]["generated"]) == ("length", 4)
    # The engine process reports its load on its own cadence: the slot shows free once it has.
    wait_for(
        lambda: (lambda load: (load["in_flight"], load["running"]) == (0, 0))(unit.leader.ready()[1]["load"]),
        timeout=30,
        what="nothing left in flight or running",
    )
