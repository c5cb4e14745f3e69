"""A leader's report of its engine's speculative decoding: the ready body's figures, /metrics' counters,
and the minute's EMF line the dashboard reads."""

from __future__ import annotations

import json
import urllib.request

from prometheus_client import generate_latest

import contract
from contract.ready import read_ready
from contract.speculation import ENV_SPECULATIVE_METHOD, NGRAM
from runtime.engines.base import EngineState
from runtime.node.engine_protocol import Load
from runtime.node.handshake import Load as BodyLoad
from runtime.node.metrics import NodeMetrics
from runtime.node.speculation import SpeculationLine, speculation_report


def _load(drafted: int, kept: int, per_step: float = 1.5) -> Load:
    return Load(state=EngineState.READY, spec_draft_tokens=drafted, spec_accepted_tokens=kept, tokens_per_step=per_step)


def test_the_ready_body_says_acceptance_and_tokens_per_step_and_old_readers_take_the_body():
    body = BodyLoad(running=2, **speculation_report(_load(200, 150, 2.25))).to_dict()
    assert (body["spec_acceptance_rate"], body["tokens_per_step"]) == (0.75, 2.25)
    assert read_ready({"load": body}).load.tokens_per_step == 2.25
    # a body of a revision before speculation: the figure is not said (0), read as one token per step
    older = {k: v for k, v in body.items() if not k.startswith("spec_") and k != "tokens_per_step"}
    assert read_ready({"load": older}).load.tokens_per_step == 0.0
    assert speculation_report(_load(0, 0, 1.0))["spec_acceptance_rate"] == 0.0


def _samples(metrics: NodeMetrics) -> dict[str, float]:
    out = {}
    for line in generate_latest(metrics.registry).decode().splitlines():
        if line.startswith("flotilla_spec_decode") or line.startswith("flotilla_decode_tokens_per_step"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_metrics_count_drafted_and_kept_tokens_across_an_engine_restart():
    m = NodeMetrics()
    m.engine_counters(_load(100, 60, 1.8))
    m.engine_counters(_load(150, 90, 1.7))
    m.engine_counters(_load(10, 4, 1.2))  # a new engine process counts from 0 again
    got = _samples(m)
    assert got["flotilla_spec_decode_num_draft_tokens_total"] == 160
    assert got["flotilla_spec_decode_num_accepted_tokens_total"] == 94
    assert got["flotilla_decode_tokens_per_step"] == 1.2


def test_the_minute_line_gives_the_minutes_acceptance_and_is_quiet_while_nothing_was_drafted():
    line = SpeculationLine(every_s=60)
    t0 = line._at
    assert line.tick(_load(100, 50), "cell0", now=t0 + 30) is None  # not a minute yet
    doc = json.loads(line.tick(_load(100, 50, 1.9), "cell0", now=t0 + 61))
    assert doc[contract.METRIC_SPEC_ACCEPTANCE] == 50.0 and doc[contract.METRIC_DECODE_TOKENS_PER_STEP] == 1.9
    assert doc[contract.METRIC_DIM_CELL] == "cell0"
    doc = json.loads(line.tick(_load(140, 80), "cell0", now=t0 + 122))  # 30 of the minute's 40 kept
    assert doc[contract.METRIC_SPEC_ACCEPTANCE] == 75.0
    assert line.tick(_load(140, 80), "cell0", now=t0 + 183) is None  # switched off all minute: no line


def test_the_leaders_queue_wait_follows_answers_that_gain_two_tokens_a_step():
    """The wait for a batch slot plays the running answers forward at their pace per token, so an answer
    whose tokens come two per step (speculation) frees its slot in half the time per token."""
    from runtime.node.queue_wait import QueueWait

    waits = {}
    for per_step in (1, 2):
        q = QueueWait()
        q.submitted("a", max_tokens=100)
        for step in range(11):  # a step every 0.1 s
            for _ in range(per_step):
                q.token("a", now=step * 0.1)
        produced = 11 * per_step
        pace = 1.0 / (produced - 1)  # seconds per token: from the first token to the last
        waits[per_step] = (q.expected_wait(slots=1, now=1.0), (100 - produced) * pace)
    for got, want in waits.values():
        assert abs(got - want) < 1e-9
    assert waits[2][0] < waits[1][0] / 2


def _complete(unit, prompt: list[int], max_tokens: int) -> str:
    body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}).encode()
    req = urllib.request.Request(unit.url + "/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())["choices"][0]["text"]


def _drafted(unit) -> dict | None:
    load = unit.leader.ready()[1]["load"]
    return load if load["spec_draft_tokens"] > 0 else None


def _counted(unit) -> dict[str, float] | None:
    with urllib.request.urlopen(unit.leader.url + contract.METRICS_PATH, timeout=5) as r:
        lines = r.read().decode().splitlines()
    got = {name: float(v) for name, v in (line.rsplit(" ", 1) for line in lines if line.startswith("flotilla_spec"))}
    return got if got.get("flotilla_spec_decode_num_draft_tokens_total", 0) > 0 else None


def test_a_unit_with_prompt_lookup_answers_as_one_without_it_and_reports_its_drafts(tmp_path):
    """Two ranks of tiny through the node's HTTP API: greedy answers with n-gram speculation on are those
    of a unit without it, and the leader's ready body and /metrics count the drafts it verified."""
    from nodeproc import Unit, wait_for

    # tiny's greedy answers to these repeat stretches of the prompt (tests/engine/test_speculative.py)
    prompts = [[5, 6, 7, 8, 9, 10, 11, 12] * 6, list(range(30, 80)) + list(range(30, 60))]
    answers = {}
    for on in (False, True):
        env = {ENV_SPECULATIVE_METHOD: NGRAM} if on else {}
        unit = Unit(tmp_path, name=f"spec-{'on' if on else 'off'}", **env)
        try:
            unit.start().wait_ready(timeout=180)
            answers[on] = [_complete(unit, p, 24) for p in prompts]
            if on:  # the engine's load reaches the leader's body and counters with its next report
                load = wait_for(lambda: _drafted(unit), timeout=10, what="the ready body to count the drafts")
                metrics = wait_for(lambda: _counted(unit), timeout=10, what="/metrics to count the drafts")
        finally:
            unit.stop()
    assert answers[True] == answers[False]
    assert load["spec_draft_tokens"] > 0 and load["spec_accepted_tokens"] > 0 and load["tokens_per_step"] > 1.0
    assert metrics["flotilla_spec_decode_num_accepted_tokens_total"] > 0
