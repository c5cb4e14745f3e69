"""The leader's OpenAI-compatible API, spoken to by the official `openai` client, on a real
two-member unit (reference engine, `tiny` model, 127.0.0.1)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
import urllib.request
from collections.abc import Callable, Iterator

import openai
import pytest
from engine_alone import greedy_texts
from nodeproc import READY_LOAD_KEYS, get_json, wait_for

import contract

PROMPTS = [f"prompt number {i}: the quick brown fox" + " jumps" * i for i in range(8)]


def client(unit, **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=unit.url, api_key="unused", max_retries=0, timeout=60, **kw)


def test_models_lists_the_served_model(shared_unit):
    models = client(shared_unit).models.list()
    assert [m.id for m in models.data] == ["tiny"]


def test_chat_completion_returns_the_client_request_id_and_its_own_completion_id(shared_unit):
    raw = client(shared_unit).chat.completions.with_raw_response.create(
        model="tiny",
        messages=[{"role": "user", "content": "hello there"}],
        max_tokens=12,
        temperature=0,
        extra_headers={contract.REQUEST_ID_HEADER: "client-chosen-id-1"},
    )
    c = raw.parse()
    # The client's id comes back as sent; the completion's own id (the body's) is the leader's.
    assert raw.headers[contract.REQUEST_ID_HEADER] == "client-chosen-id-1"
    assert raw.headers[contract.COMPLETION_ID_HEADER] == c.id and c.id.startswith("chatcmpl-")
    assert raw.headers[contract.UNIT_HEADER] == "unit-t" and raw.headers[contract.REVISION_HEADER] == "r1"
    arrival = float(raw.headers[contract.ARRIVAL_HEADER])
    assert arrival <= float(raw.headers[contract.FIRST_TOKEN_HEADER]) <= float(raw.headers[contract.FINISH_HEADER])
    assert c.object == "chat.completion" and c.choices[0].message.role == "assistant"
    assert c.usage.completion_tokens >= 1 and c.usage.prompt_tokens > 0
    assert c.usage.total_tokens == c.usage.prompt_tokens + c.usage.completion_tokens


def test_a_request_without_an_id_gets_a_generated_one(shared_unit):
    raw = client(shared_unit).completions.with_raw_response.create(model="tiny", prompt="abc", max_tokens=3)
    c = raw.parse()
    assert c.id == raw.headers[contract.REQUEST_ID_HEADER] and c.id.startswith("cmpl-")


def test_streamed_chat_equals_the_non_streamed_greedy_answer(shared_unit):
    cl = client(shared_unit)
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "name a colour"}]
    full = cl.chat.completions.create(
        model="tiny", messages=msgs, max_tokens=24, temperature=0, extra_body={"ignore_eos": True}
    )
    chunks = list(
        cl.chat.completions.create(
            model="tiny",
            messages=msgs,
            max_tokens=24,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    )
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == full.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == 24 == full.usage.completion_tokens
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
    assert len({ch.id for ch in chunks}) == 1


def test_streamed_completion_equals_the_non_streamed_greedy_answer(shared_unit):
    cl = client(shared_unit)
    full = cl.completions.create(
        model="tiny", prompt="once upon a time", max_tokens=20, temperature=0, extra_body={"ignore_eos": True}
    )
    chunks = list(
        cl.completions.create(
            model="tiny",
            prompt="once upon a time",
            max_tokens=20,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
        )
    )
    assert "".join(ch.choices[0].text for ch in chunks) == full.choices[0].text
    assert full.usage.completion_tokens == 20 and full.choices[0].finish_reason == "length"


def test_eight_concurrent_streams_give_the_engine_alone_greedy_tokens(shared_unit):
    async def one(cl: openai.AsyncOpenAI, p: str) -> str:
        stream = await cl.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": p}],
            max_tokens=16,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        return "".join([ch.choices[0].delta.content or "" async for ch in stream])

    async def all_at_once() -> list[str]:
        async with openai.AsyncOpenAI(base_url=shared_unit.url, api_key="unused", max_retries=0, timeout=120) as cl:
            return await asyncio.gather(*(one(cl, p) for p in PROMPTS))

    got = asyncio.run(all_at_once())
    assert got == greedy_texts([(p, True, 16) for p in PROMPTS])


def test_ready_body_carries_the_load_the_router_reads(shared_unit):
    for m in shared_unit.members:
        status, body = m.ready()
        assert status == 200
        assert set(body) == {
            "ready",
            "state",
            "unit",
            "revision",
            "rank",
            "world_size",
            "role",
            "cell",
            "load",
            "members",
            "leader",
            "strategies",
            "loading",
        }
        assert body["loading"] is None  # loaded (the reference engine does not report its load anyway)
        assert (body["ready"], body["state"], body["unit"], body["revision"], body["rank"], body["world_size"]) == (
            True,
            "ready",
            "unit-t",
            "r1",
            m.rank,
            2,
        )
        assert (body["role"], body["cell"]) == ("leader" if m.rank == 0 else "follower", "cell-t")
        assert set(body["load"]) == READY_LOAD_KEYS
        assert body["load"]["max_running"] > 0 and 0.0 <= body["load"]["kv_cache_used"] <= 1.0


def _leader_reports_follower_ready(leader) -> dict:
    # The leader's word on a follower is at most one handshake round (0.25 s) behind the follower.
    return wait_for(
        lambda: (lambda b: b if b["members"] and b["members"][0]["ready"] else None)(leader.ready()[1]),
        timeout=10,
        what="the leader to report its follower ready",
    )


def test_the_leader_reports_its_follower_and_the_follower_names_its_leader(shared_unit):
    leader, follower = shared_unit.members
    body = _leader_reports_follower_ready(leader)
    assert body["members"] == [
        {
            "rank": 1,
            "address": f"127.0.0.1:{follower.port}",
            "state": "ready",
            "ready": True,
            "revision": "r1",
            "loading": None,  # a formed unit's members have finished loading (docs/node.md, ready body)
        }
    ]
    _, fbody = follower.ready()
    assert (fbody["members"], fbody["leader"]) == ([], f"127.0.0.1:{leader.port}")


def test_the_watch_streams_the_ready_body_then_empty_lines_while_nothing_changes(shared_unit):
    leader = shared_unit.members[0]
    _leader_reports_follower_ready(leader)
    with socket.create_connection(("127.0.0.1", leader.port), timeout=10) as sock:
        sock.sendall(f"GET {contract.NODE_WATCH_PATH}?interval=0.05 HTTP/1.0\r\n\r\n".encode())
        data = b""
        while data.count(b"\n") < 40:  # the head, then the first line and some heartbeats
            data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200") and b"transfer-encoding" not in head.lower()
    first, *rest = body.split(b"\n")
    now = leader.ready()[1]  # a moment later: same shape and identity, the values may have moved
    line = json.loads(first)
    assert set(line) == set(now) and (line["unit"], line["rank"], line["role"]) == (now["unit"], 0, "leader")
    assert rest[:3] == [b"", b"", b""]  # idle: nothing changed


@contextlib.contextmanager
def _watching(leader) -> Iterator[Callable[[], dict]]:
    """The leader's watch stream past its head and first whole body: each call gives its next line,
    parsed ({} for a heartbeat). A line comes within 20 ms of each change; the socket bounds the wait."""
    with socket.create_connection(("127.0.0.1", leader.port), timeout=30) as sock:
        sock.sendall(f"GET {contract.NODE_WATCH_PATH}?interval=1&changes=0.02 HTTP/1.0\r\n\r\n".encode())
        reader = sock.makefile("rb")
        while reader.readline() not in (b"\r\n", b""):
            pass  # the response head
        reader.readline()  # the whole body

        def next_line() -> dict:
            line = reader.readline().strip()
            return json.loads(line) if line else {}

        yield next_line


def test_the_leader_lists_the_routing_key_of_each_request_it_admits_in_its_watch(shared_unit):
    key = 2**64 - 12345  # a router's 64-bit key (runtime/router/balance.py key_hash)
    with _watching(shared_unit.members[0]) as next_line:
        for header in ("not-a-key", str(key)):  # a malformed key is ignored, not listed
            client(shared_unit).completions.create(
                model="tiny", prompt="abc", max_tokens=2, extra_headers={contract.ROUTE_KEY_HEADER: header}
            )
        listed: list[int] = []
        for _ in range(200):
            listed += next_line().get("keys", [])
            if key in listed:
                break
    assert listed == [key]


def test_the_leader_lists_a_completion_prompts_bytes_tail_marks_and_engine_token_count_beside_its_key(shared_unit):
    key = 2**64 - 54321
    with _watching(shared_unit.members[0]) as next_line:
        # A malformed prompt loses its credit, not its key; malformed marks lose only the marks; a router
        # of the revision before sends no marks.
        sent = {
            "bad": ("12:x", "1,2"),
            "good": (f"40:{2**64 - 1}", f"7,{2**64 - 2}"),
            "bad marks": ("41:5", "7,-8"),
            "too many marks": ("42:5", ",".join(["1"] * (contract.ROUTE_MARKS_MAX + 1))),
            "no marks": ("43:5", None),
        }
        usage = {}
        for name, (header, marks) in sent.items():
            headers = {contract.ROUTE_KEY_HEADER: str(key), contract.ROUTE_PROMPT_HEADER: header}
            if marks is not None:
                headers[contract.ROUTE_MARKS_HEADER] = marks
            out = client(shared_unit).completions.create(
                model="tiny", prompt=f"abc {name}", max_tokens=2, extra_headers=headers
            )
            usage[name] = out.usage.prompt_tokens
        keys: list[int] = []
        prompts: list[list[int]] = []
        marks_listed: list[list[int]] = []
        for _ in range(200):
            doc = next_line()
            keys += doc.get("keys", [])
            prompts += doc.get("prompts", [])
            marks_listed += doc.get("marks", [])
            if len(keys) >= len(sent):
                break
    assert keys == [key] * len(sent)
    assert prompts == [
        [key, 40, usage["good"], 2**64 - 1],
        [key, 41, usage["bad marks"], 5],
        [key, 42, usage["too many marks"], 5],
        [key, 43, usage["no marks"], 5],
    ]
    assert marks_listed == [[7, 2**64 - 2], [], [], []]  # one list per prompts entry, in its order


def test_the_watch_refuses_an_interval_out_of_range(shared_unit):
    status, body = get_json(shared_unit.members[0].url + contract.NODE_WATCH_PATH + "?interval=0")
    assert status == 400 and "interval" in body["error"]


def test_the_leader_reports_strategies_timed_at_formation_and_followers_none(shared_unit):
    leader, follower = (m.ready()[1] for m in shared_unit.members)
    assert follower["strategies"] is None
    got = leader["strategies"]
    # The default is auto: every prefill/decode pair was timed and the lowest latency kept.
    assert got["chosen_by"] == "calibration" and got["transport"] == "shm"
    assert set(got["figures"]) == {"pipeline/pipeline", "pipeline/tensor", "tensor/pipeline", "tensor/tensor"}
    fastest = min(got["figures"], key=lambda k: got["figures"][k]["latency_ms"])
    assert fastest == f"{got['prefill']}/{got['decode']}"


def test_followers_refuse_api_requests_and_point_at_the_leader(shared_unit):
    req = urllib.request.Request(
        shared_unit.members[1].url + "/v1/completions",
        method="POST",
        data=json.dumps({"model": "tiny", "prompt": "x"}).encode(),
    )
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=5)
    assert e.value.code == 421 and "leader" in json.load(e.value)["error"]["message"]


def test_metrics_and_logs_record_arrival_first_token_and_finish(shared_unit):
    cl = client(shared_unit)
    cl.completions.create(
        model="tiny",
        prompt="metrics please",
        max_tokens=4,
        extra_headers={contract.REQUEST_ID_HEADER: "metrics-probe-1"},
    )
    with urllib.request.urlopen(shared_unit.leader.url + contract.METRICS_PATH, timeout=5) as r:
        text = r.read().decode()
    for name in (
        "flotilla_requests_total",
        "flotilla_time_to_first_token_seconds_bucket",
        "flotilla_time_per_output_token_seconds_bucket",
        "flotilla_queue_depth",
        "flotilla_running_sequences",
        "flotilla_kv_cache_used_ratio",
        "flotilla_request_errors_total",
    ):
        assert name in text
    assert 'flotilla_requests_total{endpoint="/v1/completions",status="200"}' in text
    rec = wait_for(
        lambda: [e for e in shared_unit.leader.log_events("request") if e["request_id"] == "metrics-probe-1"],
        timeout=10,
        what="the request log line",
    )[0]
    assert rec["arrival"] <= rec["first_token"] <= rec["finish"]
    assert (rec["status"], rec["completion_tokens"], rec["unit"], rec["revision"]) == (200, 4, "unit-t", "r1")


def test_a_client_that_disconnects_cancels_its_request(shared_unit):
    cl = client(shared_unit)
    stream = cl.completions.create(
        model="tiny",
        prompt="a long one",
        max_tokens=2000,
        stream=True,
        extra_body={"ignore_eos": True},
        extra_headers={contract.REQUEST_ID_HEADER: "walks-away-1"},
    )
    for i, _ in enumerate(stream):
        if i == 2:
            break
    stream.close()
    rec = wait_for(
        lambda: [e for e in shared_unit.leader.log_events("request") if e["request_id"] == "walks-away-1"],
        timeout=20,
        what="the cancelled request",
    )[0]
    assert rec["error_kind"] == "client_disconnected" and rec["completion_tokens"] < 2000
    wait_for(
        lambda: get_json(shared_unit.leader.url + contract.NODE_READY_PATH)[1]["load"]["running"] == 0,
        timeout=20,
        what="the cancelled sequence to leave the batch",
    )


def _cached_expected(history: list[list[int]], prompt: list[int], block: int = 16) -> int:
    """From the token ids alone: the whole blocks of `prompt` some earlier prompt starts with,
    leaving its last token to compute (docs/engine.md, Prefix caching)."""
    best = 0
    for before in history:
        same = 0
        while same < min(len(before), len(prompt)) and before[same] == prompt[same]:
            same += 1
        best = max(best, min(same, len(prompt) - 1) // block * block)
    return best


def test_usage_reports_the_prompt_tokens_served_from_the_prefix_cache_in_responses_and_the_usage_chunk(shared_unit):
    from runtime.models.registry import resolve_model

    tok = resolve_model("tiny").make_tokenizer()
    system = {"role": "system", "content": "You help shoppers compare tents; answer in one line. " * 3}
    turns = [
        [system, {"role": "user", "content": "which tent for two?"}],
        [system, {"role": "user", "content": "and for four people?"}],
    ]
    ids = [list(tok.apply_chat_template(m)) for m in turns]
    cl = client(shared_unit)
    first = cl.chat.completions.create(model="tiny", messages=turns[0], max_tokens=4, temperature=0)
    second = cl.chat.completions.create(model="tiny", messages=turns[1], max_tokens=4, temperature=0)
    chunks = list(
        cl.chat.completions.create(
            model="tiny",
            messages=turns[1],
            max_tokens=4,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    want = [_cached_expected(ids[:i], p) for i, p in enumerate(ids)]
    assert want[1] >= 3 * 16  # the system prompt alone fills several blocks
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.usage.prompt_tokens_details.cached_tokens == want[1]
    usage = chunks[-1].usage
    assert usage.prompt_tokens == len(ids[1])
    assert usage.prompt_tokens_details.cached_tokens == _cached_expected(ids, ids[1])


def _metric(text: str, name: str) -> float:
    return next(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " "))


def test_the_ready_body_and_metrics_count_prefix_cache_queries_and_hits_in_prompt_tokens(shared_unit):
    from runtime.models.registry import resolve_model

    def counters():
        _, body = shared_unit.leader.ready()
        with urllib.request.urlopen(shared_unit.leader.url + contract.METRICS_PATH, timeout=5) as r:
            text = r.read().decode()
        load = body["load"]
        return load, (
            _metric(text, "flotilla_prefix_cache_queries_total"),
            _metric(text, "flotilla_prefix_cache_hits_total"),
        )

    tok = resolve_model("tiny").make_tokenizer()
    msgs = [
        {"role": "system", "content": "Counters for the cache: " + "blocks " * 12},
        {"role": "user", "content": "hi"},
    ]
    ids = list(tok.apply_chat_template(msgs))
    # The unit is shared with the tests before this one: count from a moment nothing of theirs is
    # still queued or running, or a straggler's prompt would land between the two readings. The
    # engine reports its counters every LOAD_EVERY_S, so an idle reading can still lack the last
    # requests' prompts: take one that held over more than a report period.
    from runtime.node.engine_host import LOAD_EVERY_S

    def settled():
        first = counters()[0]
        time.sleep(2 * LOAD_EVERY_S)
        again = counters()[0]
        return first == again and again["in_flight"] == again["queue_depth"] == again["running"] == 0 and again

    before = wait_for(settled, timeout=60, what="the shared unit to be idle with its counters reported")
    for _ in range(2):
        client(shared_unit).chat.completions.create(model="tiny", messages=msgs, max_tokens=2)
    want_q = before["prefix_cache_queries"] + 2 * len(ids)
    load = wait_for(
        lambda: (ld := counters()[0])["prefix_cache_queries"] == want_q and ld,
        timeout=10,
        what="the engine's load report with both prompts counted",
    )
    hit = (len(ids) - 1) // 16 * 16  # the second ask reuses every whole block but the last token's
    assert load["prefix_cache_hits"] == before["prefix_cache_hits"] + hit
    assert load["prefix_cache_hit_rate"] == pytest.approx(load["prefix_cache_hits"] / load["prefix_cache_queries"])
    load, scraped = counters()
    assert scraped == (load["prefix_cache_queries"], load["prefix_cache_hits"])
