"""The trace replay's arithmetic (bench/trace/replay.py): the oracle's hit rate, scaling that keeps the
same requests at every rate, goodput that counts rejected requests as failed, and a table with every
column filled. The replay itself runs against `make local` (`make bench-trace`), not here."""

from __future__ import annotations

import json
import random

import pytest

from bench.trace import bound, replay


def rows(*blocks: tuple[int, ...], gap_ms: int = 1000, output: int = 64) -> list[dict]:
    return [
        {"timestamp": i * gap_ms, "hash_ids": list(b), "input_length": 512 * len(b), "output_length": output}
        for i, b in enumerate(blocks)
    ]


def test_oracle_hit_rate_counts_leading_blocks_seen_before_over_all_prompt_tokens():
    qs = replay.scale(rows((1, 2), (1, 2, 3), (4,), (1, 5)), block_tokens=2, max_input=100, max_output=4, rate=1)
    # by hand: (1,2) new; (1,2,3) reuses 1,2 = 4 tokens; (4,) new; (1,5) reuses 1 = 2 tokens; of 4+6+2+4
    assert replay.oracle_hit_rate(qs, 2) == pytest.approx(6 / 16)


def test_the_median_requests_reusable_share_is_the_median_of_each_requests_own_share():
    qs = replay.scale(rows((1, 2), (1, 2, 3), (4,), (1, 5)), block_tokens=2, max_input=100, max_output=4, rate=1)
    # by hand, per request: 0 of 4, 4 of 6, 0 of 2, 2 of 4 tokens; sorted 0, 0, 1/2, 2/3: median 1/4,
    # where the token-weighted rate above is 6/16
    assert replay.oracle_median_share(qs, 2) == pytest.approx(0.25)


def test_every_rate_replays_the_same_prompts_only_sooner():
    trace = rows((1, 2), (1, 2, 3), (4,), (1, 5))
    slow = replay.scale(trace, block_tokens=4, max_input=100, max_output=4, rate=0.5)
    fast = replay.scale(trace, block_tokens=4, max_input=100, max_output=4, rate=2)
    assert replay.requests_digest(slow) == replay.requests_digest(fast)
    assert [q.prompt for q in slow] == [q.prompt for q in fast]
    assert [round(q.at * 4, 9) for q in fast] == [round(q.at, 9) for q in slow]  # 4x the rate: a quarter the time
    assert replay.oracle_hit_rate(slow, 4) == replay.oracle_hit_rate(fast, 4)


def test_arrivals_come_at_the_rate_asked():
    trace = rows(*[(i,) for i in range(10)], gap_ms=300)  # the trace's own rate: 10 requests in 2.7 s
    for rate in (0.5, 1.0, 4.0):
        qs = replay.scale(trace, block_tokens=4, max_input=100, max_output=4, rate=rate)
        assert len(qs) / qs[-1].at == pytest.approx(rate)  # the trace's definition of its rate: count / span


def rec(
    status: int, ttft: float | None, tpot: float | None, cached: int = 0, engine: int | None = 10, prompt: int = 10
) -> dict:
    return {
        "status": status,
        "ttft_s": ttft,
        "tpot_s": tpot,
        "cached": cached,
        "prompt_tokens": prompt,
        "engine_prompt_tokens": engine,
        "unit": "u1",
    }


def test_goodput_counts_rejected_and_failed_requests_as_misses():
    recs = [rec(200, 0.5, 0.1, cached=5), rec(200, 3.0, 0.1), rec(429, None, None, engine=None), rec(200, 0.2, 0.9)]
    s = replay.summarize(recs, ttft_target_s=2.0, tpot_target_s=0.5)
    assert s["goodput"] == pytest.approx(1 / 4)  # only the first meets both targets; the 429 is a miss
    assert (s["ok"], s["rejected_or_failed"]) == (3, 1)
    assert s["late"] == {"ttft": 1, "tpot": 1} and s["tpot_max_s"] == 0.9  # the second and the fourth
    assert s["hit_rate"] == pytest.approx(5 / 40)  # the rejected request's prompt counts in the denominator
    assert (s["engine_prompt_mismatches"], s["engine_prompt_counted"]) == (0, 3)


def test_a_prompt_the_engine_counted_otherwise_is_reported():
    s = replay.summarize([rec(200, 0.5, 0.1, engine=11)], ttft_target_s=2.0, tpot_target_s=0.5)
    assert s["engine_prompt_mismatches"] == 1


def test_the_table_fills_every_column_and_states_the_scaling():
    qs = replay.scale(rows((1, 2), (1, 2, 3), (1, 2, 3, 4)), block_tokens=2, max_input=100, max_output=4, rate=1)
    scaling = {
        "trace": "conversation",
        "requests": len(qs),
        "block_tokens": 2,
        "max_input_tokens": 100,
        "max_output_tokens": 4,
        "output_divisor": 256.0,
        "rate_per_s": 1.0,
        "mean_prompt_tokens": 6.0,
        "prompt_tokens": 18,
        "requests_digest": replay.requests_digest(qs),
        "oracle_hit_rate": replay.oracle_hit_rate(qs, 2),
        "oracle_median_share": replay.oracle_median_share(qs, 2),
        "units": 3,
        "nodes": 1,
        "model": "smollm2",
        "max_prefill_tokens": 256,
        "ttft_target_s": 2.0,
        "tpot_target_s": 0.5,
    }
    recs = [
        rec(200, 0.4, 0.05, cached=0, engine=4, prompt=4),
        rec(200, 0.6, 0.07, cached=4, engine=6, prompt=6),
        rec(503, None, None, engine=None, prompt=8),
    ]
    result = replay.summarize(recs, 2.0, 0.5) | {"requests_digest": replay.requests_digest(qs)}
    entry = {"scaling": scaling, "results": {"cache_aware": result}, "loadavg_before": ["0.1"], "loadavg": ["0.2"]}
    lines = replay.table([entry])
    # by hand: prompts of 4, 6 and 8 tokens; the second reuses (1,2) = 4 tokens, the third (1,2,3) = 6
    assert "oracle (infinite cache) hit rate 55.6 % of 18 prompt tokens, 67 % of the median request's" in lines[0]
    assert "512-token blocks -> 2 tokens" in lines[0] and "1 req/s" in lines[0]
    assert "3 units x 1 node(s) of smollm2, 256 prompt tokens per step;" in lines[0]
    header, row = lines[2], lines[4]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert len(cells) == len(header.strip("|").split("|"))
    assert all(c and c != "-" for c in cells), cells
    assert cells[6:9] == ["22.2 %", "55.6 %", "40%"]  # 4 of 18 prompt tokens cached; the oracle's; the share
    assert cells[10] == "2 / 3 (1)"
    assert "same requests as the oracle" in replay.result_line("cache_aware", result, scaling)


def test_rates_that_are_not_numbers_are_refused_naming_the_flag(capsys):
    with pytest.raises(SystemExit):
        replay.main(["--rates", "fast"])
    assert "--rates fast" in capsys.readouterr().err


def test_records_name_each_requests_turn_and_the_blocks_it_shares_with_its_conversations_last_one(tmp_path):
    def q(at: float, session: str, blocks: tuple[int, ...]) -> replay.Scaled:
        return replay.Scaled(at=at, prompt=[1, 2, 3], max_tokens=2, session=session, blocks=blocks)

    requests = [q(0.0, "a", (1, 2)), q(1.0, "b", (5,)), q(2.0, "a", (1, 2, 3)), q(3.0, "a", (1, 9))]
    recs = [{"status": 200, "unit": f"u{i}", "ttft_s": 0.1 * i} for i in range(4)]
    out = tmp_path / "runs" / "cache_aware-0.4.jsonl"
    replay.write_records(out, requests, recs)
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [(x["session"], x["turn"], x["shared_blocks"]) for x in lines] == [
        ("a", 1, 0),
        ("b", 1, 0),
        ("a", 2, 2),
        ("a", 3, 1),  # shares only the first block with the turn before it
    ]
    assert [x["unit"] for x in lines] == ["u0", "u1", "u2", "u3"]


def test_records_given_a_file_are_refused_before_any_run_naming_the_flag(capsys, tmp_path):
    there = tmp_path / "records.jsonl"
    there.write_text("")
    with pytest.raises(SystemExit):
        replay.main(["--records", str(there)])
    assert f"--records {there}: a file is there; give a directory" in capsys.readouterr().err


def test_conversation_sample_keeps_every_turn_of_each_conversation_it_draws():
    # two-block conversation keys: (0, 1) has three turns spread over the trace, (0, 2) two, (0, 3) one
    trace = rows((0, 1), (0, 2), (0, 3), (0, 1, 7), (0, 2, 8), (0, 1, 7, 9))
    for seed in range(6):
        got = replay.select(trace, 3, "conversations", seed)
        convs = {replay.conversation_of(r) for r in got}
        assert len(got) >= 3
        for c in convs:  # whole conversations only
            assert [r for r in got if replay.conversation_of(r) == c] == [
                r for r in trace if replay.conversation_of(r) == c
            ]
        assert [r["timestamp"] for r in got] == sorted(r["timestamp"] for r in got)  # in the trace's order
    assert replay.select(trace, 2, "first") == trace[:2]
    assert replay.select(trace, 4, "conversations", 1) == replay.select(trace, 4, "conversations", 1)  # seeded


def test_conversation_sample_finds_the_reuse_the_first_requests_lack():
    # conversations whose follow-up turns come long after the first requests: the first 3 are all first turns
    trace = rows((0, 1), (0, 2), (0, 3), (0, 1, 7), (0, 2, 8), (0, 3, 9))
    first = replay.scale(replay.select(trace, 3, "first"), block_tokens=2, max_input=100, max_output=4, rate=1)
    convs = replay.scale(replay.select(trace, 3, "conversations"), block_tokens=2, max_input=100, max_output=4, rate=1)
    # by hand: the first three share block 0 only: 2 + 2 of 12 tokens; two whole conversations
    # (0,a),(0,b),(0,a,x),(0,b,y): 2 + 4 + 4 = 10 of 4+4+6+6 = 20 tokens
    assert replay.oracle_hit_rate(first, 2) == pytest.approx(4 / 12)
    assert replay.oracle_hit_rate(convs, 2) == pytest.approx(10 / 20)


def test_missed_hits_say_whether_a_turn_went_elsewhere_came_too_soon_or_found_its_prompt_evicted():
    # one conversation (its first two blocks 1, 2) growing by a block a turn, and another conversation
    # that shares only the preamble block 1
    qs = replay.scale(
        rows((1, 2), (1, 2, 3), (1, 2, 3, 4), (1, 9), (1, 2, 3, 4, 5), (1, 2, 3, 4, 5, 6)),
        block_tokens=2,
        max_input=100,
        max_output=4,
        rate=1,
    )

    def sent(unit: str, at: float, first: float | None, cached: int = 0) -> dict:
        return {
            "status": 200,
            "unit": unit,
            "sent_s": at,
            "ttft_s": None if first is None else first - at,
            "cached": cached,
        }

    recs = [
        sent("u1", 0.0, 0.5),
        sent("u2", 1.0, 3.0),  # to another unit than its previous turn: its 4 reusable tokens went elsewhere
        sent("u2", 2.0, 4.0),  # its previous turn's first token came at 3.0: 6 tokens too soon
        sent("u3", 3.0, 3.5),  # another conversation's first turn: the oracle's 2 preamble tokens are not counted
        sent("u2", 5.0, 5.5, cached=2),  # after 4.0, 8 reusable, 2 found: 6 evicted
        sent("u2", 6.0, 6.5, cached=10),  # all 10 found: nothing missed
    ]
    assert replay.missed_hits(qs, recs, 2) == {"elsewhere": 4, "too_soon": 6, "evicted": 6}
    # a failed request misses nothing the routing could have found
    recs[1]["status"] = 503
    assert replay.missed_hits(qs, recs, 2)["elsewhere"] == 0


def test_resend_has_a_later_turn_begin_with_its_previous_prompt_where_the_trace_refilled_its_last_block():
    """The trace hashes 512-token blocks: turn 1 of 1,200 tokens ends in a partial block (hash 3), and
    turn 2 resends its 1,200 tokens then fills that block, which gets another hash (4). Replayed with
    --resend, turn 2 takes hash 3 there and begins with turn 1's prompt token for token. A previous turn
    that ended on a whole block, and a turn of another conversation, keep their hashes."""

    def row(t: int, blocks: tuple[int, ...], tokens: int) -> dict:
        return {"timestamp": t, "hash_ids": list(blocks), "input_length": tokens, "output_length": 64}

    trace = [
        row(0, (1, 2, 3), 1200),  # conversation (1, 2): a partial last block
        row(1000, (1, 2, 4, 5), 1800),  # its next turn: every block but the last, which filled
        row(2000, (1, 7, 3), 1536),  # conversation (1, 7): whole blocks only
        row(3000, (1, 7, 8, 9), 1900),  # its next turn: block 3 was whole, so 8 is new text
        row(4000, (1, 2, 4, 10, 11), 2400),  # conversation (1, 2) again: turn 2's blocks, the last refilled
    ]
    kw = {"block_tokens": 2, "max_input": 100, "max_output": 4, "rate": 1}
    plain = replay.scale(trace, **kw)
    sent = replay.scale(trace, resend=True, **kw)
    # turn 3 of (1, 2) carries turn 2's hash 4, which the replay took back to 3: it resends turn 2 as replayed
    assert [q.blocks for q in sent] == [(1, 2, 3), (1, 2, 3, 5), (1, 7, 3), (1, 7, 8, 9), (1, 2, 3, 5, 11)]
    assert sent[1].prompt[: len(sent[0].prompt)] == sent[0].prompt
    assert plain[1].prompt[: len(plain[0].prompt)] != plain[0].prompt
    assert sent[4].prompt[: len(sent[1].prompt)] == sent[1].prompt
    assert [q.session for q in sent] == [q.session for q in plain]  # the conversations stay the same
    # of 19 blocks the oracle reuses 8 as the trace has them (2 + 1 + 2 + 3 leading blocks seen before) and
    # 10 as resent: turn 2's third block and turn 3's fourth besides
    assert replay.oracle_hit_rate(plain, 2) == 8 / 19
    assert replay.oracle_hit_rate(sent, 2) == 10 / 19


def test_the_replay_resends_previous_prompts_unless_told_not_to():
    """A client rendering its conversation resends the earlier turns whole, so that is the default."""
    assert replay.parser().parse_args([]).resend is True
    assert replay.parser().parse_args(["--no-resend"]).resend is False


def test_the_prefill_line_is_the_lower_edge_of_the_answers_not_their_mean():
    """Half the answers sit on 50 ms + 3 ms a token; the rest waited 0.2-1 s behind other work. The
    line is the first half's, which a least-squares fit through all of them would miss."""
    rng = random.Random(7)
    on_line = [(n, 0.05 + 0.003 * n) for n in range(0, 520, 16)]
    waited = [(n, 0.05 + 0.003 * n + rng.uniform(0.2, 1.0)) for n in range(8, 520, 16)]
    a, b = bound.prefill_line(on_line + waited, 32)
    assert a == pytest.approx(0.05, abs=1e-9) and b == pytest.approx(0.003, abs=1e-12)
    with pytest.raises(ValueError, match="a line needs two"):  # every answer of one size class: no slope
        bound.prefill_line([(5, 0.1), (20, 0.2)], 32)


BOUND_SIZES = [4, 6, 8]  # the bound tests' three prompts, block tokens 2: the oracle reuses 0, 4 and 6


def bound_flags(tmp_path) -> list[str]:
    """bound.py's flags for three requests of 2, 3 and 4 blocks sharing their leading blocks, and the
    records directory the tests write (write_records)."""
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows((1, 2), (1, 2, 3), (1, 2, 3, 4))))
    flags = ["--trace", str(path), "--requests", "3", "--sample", "first", "--block-tokens", "2"]
    return [*flags, "--records", str(tmp_path / "runs"), "--no-resend"]


def write_records(tmp_path, policy: str, cached: list[int], ttft: list[float], sizes=BOUND_SIZES, **per) -> None:
    """A run's records at 0.5 req/s: each request's cached tokens and TTFT, and any other field given
    as a list (sent_s, unit, tpot_s)."""
    recs = [
        {"status": 200, "ttft_s": t, "cached": c, "prompt_tokens": n, **{k: v[i] for k, v in per.items()}}
        for i, (c, t, n) in enumerate(zip(cached, ttft, sizes))
    ]
    (tmp_path / "runs").mkdir(exist_ok=True)
    (tmp_path / "runs" / f"{policy}-0.5.jsonl").write_text("\n".join(json.dumps(r) for r in recs))


def test_the_floor_bounds_every_policy_and_records_of_other_requests_are_refused(tmp_path, capsys):
    """A replay's records of three requests: the floor counts the oracle's hits with no queueing, so it
    is at most any policy's median; records whose prompt sizes are not the requests drawn again (another
    --requests, --seed or --resend) are refused naming the flags."""
    flags = bound_flags(tmp_path)
    # on the line 0.1 s + 0.01 s an uncached token, but least_requests' last two answers waited
    write_records(tmp_path, "least_requests", [0, 0, 4], [0.14, 0.30, 0.24])  # uncached 4, 6, 4
    write_records(tmp_path, "cache_aware", [0, 0, 6], [0.14, 0.16, 0.12])  # uncached 4, 6, 2
    assert bound.main(flags) == 0
    out = capsys.readouterr().out
    assert "prefill line 100 ms + 10.00 ms per uncached token" in out
    # the oracle leaves 4, 2 and 2 tokens uncached: 140, 120 and 120 ms on the line, median 120 ms
    assert "floor p50 (every oracle hit, no queueing) 120 ms" in out
    # medians by nearest rank, the 2nd of 3, as the replay's result lines give them
    assert "| 0.5 | least_requests | 240 | 1.00 x | 140 | 100 | 20 | 0.50 x |  |" in out
    assert "| 0.5 | cache_aware | 140 | 0.58 x | 140 | 0 | 20 |  |  |" in out
    assert "| 0.5 | cache_aware | records without sent_s or unit: no breakdown |" in out
    write_records(tmp_path, "least_requests", [0, 0], [0.14, 0.18], sizes=[4, 6])
    with pytest.raises(SystemExit):
        bound.main(flags)
    assert "least_requests at 0.5 req/s did not replay these requests" in capsys.readouterr().err


def test_each_answers_wait_is_put_down_to_what_the_host_was_doing_and_lone_answers_raise_the_floor(tmp_path, capsys):
    """Three requests of two output tokens each (a request runs until its first token plus one TPOT),
    on the line 0.1 s + 0.01 s an uncached token. least_requests: the second is sent to unit u0 while
    the first is still before its first token (behind a prefill, 140 ms above the line), the first
    shares u0 with it (its unit busy, on the line), the third runs alone 100 ms above the line.
    cache_aware: the first two overlap on two units (other units busy), the third runs alone on it."""
    flags = bound_flags(tmp_path)
    for policy, cached, ttft, sent, units in (
        ("least_requests", [0, 0, 4], [0.14, 0.30, 0.24], [0.0, 0.1, 1.0], ["u0", "u0", "u1"]),
        ("cache_aware", [0, 0, 6], [0.14, 0.16, 0.12], [0.0, 0.05, 1.0], ["u0", "u1", "u0"]),
    ):
        write_records(tmp_path, policy, cached, ttft, sent_s=sent, unit=units, tpot_s=[0.01] * 3)
    assert bound.main(flags) == 0
    out = capsys.readouterr().out
    # lone answers 0 and 100 ms above the line: the nearest-rank median of two is the second, and the
    # floor of 120 ms (the test above) becomes 220 ms, 0.92 x least_requests' p50 of 240 ms
    assert "sit a median 100 ms above the line (2 answers): a typical answer's floor is 220 ms" in out
    assert "| 0.5 | least_requests | 240 | 1.00 x | 140 | 100 | 20 | 0.50 x | 0.92 x |" in out
    assert "| 0.5 | least_requests | 100 (1) | - (0) | 0 (1) | 140 (1) | 100 (3) |" in out
    assert "| 0.5 | cache_aware | 0 (1) | 0 (2) | - (0) | - (0) | 0 (3) |" in out
