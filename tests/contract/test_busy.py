"""The Retry-After a full unit and a router give: whole seconds, never past what OpenAI SDKs honour."""

from __future__ import annotations

from contract import busy


def test_a_wait_rounds_up_to_whole_seconds_between_the_floor_and_the_cap():
    assert busy.retry_after_s(6.2) == 7
    assert busy.retry_after_s(0.0) == 1
    assert busy.retry_after_s(0.4, floor_s=2) == 2
    assert busy.retry_after_s(10_000.0) == busy.RETRY_AFTER_MAX_S
    assert busy.retry_after_s(0.0, floor_s=busy.RETRY_AFTER_MAX_S + 5) == busy.RETRY_AFTER_MAX_S


def test_a_units_retry_after_passed_on_is_capped_and_a_date_or_nothing_becomes_the_default():
    assert busy.retry_after_header("7", 1) == "7"
    assert busy.retry_after_header("3600", 1) == str(busy.RETRY_AFTER_MAX_S)
    assert busy.retry_after_header(None, 3) == "3"
    assert busy.retry_after_header("Wed, 21 Oct 2026 07:28:00 GMT", 2) == "2"


def test_a_unit_is_full_only_past_a_queue_timeout_it_reported():
    assert busy.full(wait_s=3.0, queue_timeout_s=2.0)
    assert not busy.full(wait_s=2.0, queue_timeout_s=2.0)
    assert not busy.full(wait_s=99.0, queue_timeout_s=0.0)  # an older revision does not say
