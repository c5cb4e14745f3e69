"""The leader's expected wait for a batch slot (runtime/node/queue_wait.py), on a hand-driven clock:
expected values are worked out from the model in the module docstring, not taken from the code."""

from __future__ import annotations

import pytest

from runtime.node.queue_wait import QueueWait, retry_after_s


def _run(q: QueueWait, rid: str, max_tokens: int, *, first: float, tokens: int, pace: float) -> None:
    q.submitted(rid, max_tokens)
    for i in range(tokens):
        q.token(rid, first + i * pace)


def test_a_free_slot_means_no_wait_even_before_any_pace_is_known():
    q = QueueWait()
    q.submitted("a", 100)  # queued, no token yet
    assert q.expected_wait(slots=2, now=0.0) == 0.0


def test_a_full_batch_without_a_measured_pace_cannot_be_told():
    q = QueueWait()
    q.submitted("a", 100)
    q.token("a", 0.0)  # one token: no pace yet
    assert q.expected_wait(slots=1, now=0.0) is None
    assert q.expected_wait(slots=0, now=0.0) is None  # slot count unknown


def test_the_wait_plays_the_queue_forward_over_the_slots():
    q = QueueWait()
    # Two slots, pace 0.1 s a step: a has 11 of 100 tokens (10 steps since its first, at t=0), b 11 of 50.
    _run(q, "a", 100, first=0.0, tokens=11, pace=0.1)
    _run(q, "b", 50, first=0.0, tokens=11, pace=0.1)
    q.submitted("c", 30)  # queued
    now = 1.0
    # b frees its slot after 50 - 11 = 39 steps (3.9 s), a after 89 (8.9 s). c takes b's slot at 3.9 s
    # and holds it 30 steps, to 6.9 s. A request arriving now gets the slot that frees first after
    # that: c's, at 6.9 s.
    assert q.expected_wait(slots=2, now=now) == pytest.approx(6.9)
    # One more slot: c starts at once in it and ends after its 30 steps, 3.0 s, before b's 3.9 s.
    assert q.expected_wait(slots=3, now=now) == pytest.approx(3.0)


def test_progress_is_counted_by_the_clock_when_tokens_are_not_reported():
    q = QueueWait()
    q.step_s = 0.1  # learned earlier
    q.submitted("a", 100)
    q.token("a", 0.0)  # only its first token is reported
    # At t=5 s it has run 1 + 50 steps; 49 remain: 4.9 s.
    assert q.expected_wait(slots=1, now=5.0) == pytest.approx(4.9)


def test_finished_requests_teach_the_pace_and_the_share_of_max_tokens_used():
    q = QueueWait()
    for i in range(30):  # every request stops after 26 of its 100 max_tokens, at 0.2 s a step
        _run(q, f"r{i}", 100, first=100.0 * i, tokens=26, pace=0.2)
        q.finished(f"r{i}", 100.0 * i + 5.0)
    assert q.step_s == pytest.approx(0.2)
    assert q.length_share == pytest.approx(0.26)
    q.submitted("x", 100)
    q.token("x", 5000.0)  # runs alone in the one slot
    # Expected length ceil(0.26 * 100) = 26, one step done: 25 steps of 0.2 s left, far from the 99
    # that max_tokens alone would say.
    assert q.expected_wait(slots=1, now=5000.0) == pytest.approx(25 * 0.2)


def test_the_length_share_errs_long_the_one_nine_in_ten_requests_stayed_within():
    q = QueueWait()
    for i in range(100):  # shares 0.01 .. 1.00 of max_tokens 100
        _run(q, f"r{i}", 100, first=1000.0 * i, tokens=i + 1, pace=0.1)
        q.finished(f"r{i}", 1000.0 * i + 500.0)
    assert q.length_share == pytest.approx(0.91)  # the 91st of 100 sorted shares, not the mean 0.5


def test_retry_after_is_the_wait_in_whole_seconds_within_what_openai_clients_honour():
    assert retry_after_s(6.2) == 7
    assert retry_after_s(0.0) == 1
    assert retry_after_s(0.4, floor_s=2) == 2
    assert retry_after_s(10_000.0) == 120  # openai-python gives up at once on a Retry-After above 120 s
