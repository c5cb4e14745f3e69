"""`flotilla smoke --roll-unit` on the ECS model (ecs_world.py): the unit goes to a new task definition
revision and back through ECS deployments while smoke requests keep flowing through a front door
that serves only while the unit is formed and ready, as the router does. The model is paced by the
traffic: each scheduler tick waits for a request answered since the previous one, so a moment the
unit cannot serve is always met by a request."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import ops.commands.smoke as smoke

pytestmark = pytest.mark.timeout(300)
MODEL = "smollm2-135m-instruct"


class FrontDoor:
    """An OpenAI-shaped front door over the world's one unit: 200 while some formation of its members
    is ready (their /health/ready answers 200), else 503 as a router with no routable unit answers."""

    def __init__(self, world) -> None:
        self.world = world
        self.ready = True  # recomputed on every model tick, on the thread that ticks
        self.pace = False
        self.served = threading.Event()
        self.answers: list[int] = []
        door = self

        class Handler(BaseHTTPRequestHandler):
            def _send(self, status: int, body: dict | None = None, sse: list[dict] | None = None) -> None:
                self.send_response(status)
                if sse is not None:
                    self.send_header("Content-Type", "text/event-stream")
                    self.end_headers()
                    for event in sse:
                        self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
                    self.wfile.write(b"data: [DONE]\n\n")
                else:
                    data = json.dumps(body).encode()
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                door.answers.append(status)
                door.served.set()

            def do_GET(self):  # noqa: N802
                self._send(
                    200, {"object": "list", "data": [{"id": MODEL, "object": "model", "created": 0, "owned_by": "x"}]}
                )

            def do_POST(self):  # noqa: N802
                req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if req.get("max_tokens", 1) < 1:
                    return self._send(
                        400, {"error": {"message": "max_tokens: at least 1", "type": "invalid_request_error"}}
                    )
                if not door.ready:
                    return self._send(503, {"error": {"message": "no unit is ready", "type": "service_unavailable"}})
                usage = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
                if self.path.endswith("/completions") and "messages" not in req:
                    choice = {"index": 0, "text": "red, blue", "finish_reason": "length", "logprobs": None}
                    return self._send(
                        200,
                        {
                            "id": "c",
                            "object": "text_completion",
                            "created": 0,
                            "model": MODEL,
                            "choices": [choice],
                            "usage": usage,
                        },
                    )
                if req.get("stream"):
                    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": MODEL}
                    return self._send(
                        200,
                        sse=[
                            {**chunk, "choices": [{"index": 0, "delta": {"content": "red, "}, "finish_reason": None}]},
                            {
                                **chunk,
                                "choices": [{"index": 0, "delta": {"content": "blue"}, "finish_reason": "length"}],
                            },
                        ],
                    )
                message = {"role": "assistant", "content": "red, blue"}
                choice = {"index": 0, "message": message, "finish_reason": "length"}
                return self._send(
                    200,
                    {
                        "id": "c",
                        "object": "chat.completion",
                        "created": 0,
                        "model": MODEL,
                        "choices": [choice],
                        "usage": usage,
                    },
                )

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        world.model.on_tick.append(self.on_tick)

    def on_tick(self) -> None:
        if self.pace:
            # One answered request per scheduler tick: the traffic sees every state the unit passes.
            assert self.served.wait(10), "no smoke request reached the front door for 10 s"
            self.served.clear()
        self.ready = any(m.server.status == 200 for m in list(self.world.members.values()))

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def paced(world, monkeypatch):
    """(world, front door): the front door paces the model once the roll's traffic starts."""
    door = FrontDoor(world)
    start = smoke.Traffic.start

    def start_and_pace(self) -> None:
        start(self)
        door.served.clear()
        door.pace = True

    monkeypatch.setattr(smoke.Traffic, "start", start_and_pace)
    yield world, door
    door.pace = False
    door.close()


def test_smoke_rolls_a_surge_unit_to_a_new_revision_and_back_without_a_failed_request(paced, run_cli):
    world, door = paced
    unit = world.add_unit(cell=0, index=0, rollout="surge")
    before = world.service(unit)["taskDefinition"]
    ticks = world.model.ticks
    code, out = run_cli(
        "smoke", "--url", door.url, "--roll-unit", "cell0-unit0", "--wait", "3000", "--timeout", "10", "--yes"
    )
    flat = " ".join(out.split())
    assert code == 0, out
    assert "roll cell0-unit0" in flat and "PASS: every check" in flat
    assert f"revision {before.rsplit(':', 1)[1]} -> 2 -> 1" in flat and ", 0 failed" in flat
    # Two ECS deployments, each through the task lifecycle: the traffic ran through all of them.
    updates = [p["taskDefinition"] for op, p in world.model.calls if op == "UpdateService"]
    assert [u.rsplit(":", 1)[1] for u in updates] == ["2", "1"]
    assert world.model.ticks - ticks >= 12
    assert door.answers.count(200) >= world.model.ticks - ticks - 5
    # Back where it was, and the copy is deregistered: rollback targets are unchanged.
    assert world.service(unit)["taskDefinition"] == before
    (deployment,) = world.service(unit)["deployments"]
    assert deployment["rolloutState"] == "COMPLETED"
    assert world.model.task_defs[updates[0]].status == "INACTIVE"


def test_smoke_roll_fails_when_requests_fail_while_the_unit_rolls(paced, run_cli):
    """A unit on `replace` (minimum healthy 0 %) stops its tasks before the new ones form: with no
    other unit, requests meet a front door without a ready unit, and the roll row says so."""
    world, door = paced
    world.add_unit(cell=0, index=0, rollout="replace")
    code, out = run_cli(
        "smoke", "--url", door.url, "--roll-unit", "cell0-unit0", "--wait", "3000", "--timeout", "10", "--yes"
    )
    flat = " ".join(out.split())
    assert code == 1, out
    assert "FAIL: roll cell0-unit0" in flat
    assert "503" in flat or "InternalServerError" in flat or "APIStatusError" in flat
    assert 503 in door.answers


def test_smoke_roll_of_a_unit_the_fleet_does_not_have_is_an_error_naming_it(paced, run_cli):
    world, door = paced
    world.add_unit(cell=0, index=0)
    code, out = run_cli("smoke", "--url", door.url, "--roll-unit", "cell3-unit9", "--timeout", "10", "--yes")
    assert code != 0 and "cell3-unit9" in " ".join(out.split())


def test_smoke_roll_asks_first_refuses_without_a_terminal_and_a_dry_run_rolls_nothing(paced, run_cli):
    world, door = paced
    world.add_unit(cell=0, index=0, rollout="surge")
    calls = len(world.model.calls)
    code, out = run_cli("smoke", "--url", door.url, "--roll-unit", "cell0-unit0", "--timeout", "10")
    assert code == 1 and "refusing to roll cell0-unit0 to a copy of its task definition" in " ".join(out.split())
    assert door.answers == []  # refused before any request
    code, out = run_cli("smoke", "--url", door.url, "--roll-unit", "cell0-unit0", "--timeout", "10", "--dry-run")
    flat = " ".join(out.split())
    assert code == 0 and "skipped: dry run (nothing changed)" in flat and "PASS: every check" in flat
    changes = [op for op, _ in world.model.calls[calls:] if op in ("UpdateService", "RegisterTaskDefinition")]
    assert changes == []


def test_smoke_json_reports_every_check_on_stdout(paced, run_cli):
    world, door = paced
    world.add_unit(cell=0, index=0)
    code, out = run_cli("smoke", "--url", door.url, "--timeout", "10", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["passed"] is True and doc["url"] == door.url
    assert [c["check"] for c in doc["checks"]] == [
        "models",
        "chat",
        "chat, streamed",
        "completion",
        "bad request refused",
        "roll a unit",
    ]
    assert [c["result"] for c in doc["checks"]] == ["PASS"] * 5 + ["SKIP"]
