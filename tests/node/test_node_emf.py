"""The leader's CloudWatch EMF lines (docs/observability.md): one per request on stdout, read back
from a real two-member unit (reference engine, `tiny` model) and checked against the answer itself."""

from __future__ import annotations

import json

import openai
import pytest
from nodeproc import wait_for

import contract
from runtime import emf

SERVICE, CELL = contract.METRIC_DIM_SERVICE, contract.METRIC_DIM_CELL
TTFT, TOKENS = contract.METRIC_TIME_TO_FIRST_TOKEN, contract.METRIC_OUTPUT_TOKENS


def client(unit) -> openai.OpenAI:
    return openai.OpenAI(base_url=unit.url, api_key="unused", max_retries=0, timeout=60)


def the_line_of(unit, request_id: str) -> dict:
    lines = wait_for(
        lambda: [x for x in unit.leader.emf_lines() if x.get("request_id") == request_id],
        timeout=10,
        what=f"the EMF line of {request_id}",
    )
    assert len(lines) == 1, lines  # exactly one line per request
    return lines[0]


def assert_request_line_shape(line: dict, *, cell: str) -> None:
    [directive] = line["_aws"]["CloudWatchMetrics"]
    assert directive["Namespace"] == contract.METRICS_NAMESPACE == "Flotilla"
    assert directive["Dimensions"] == [[SERVICE], [SERVICE, CELL]]
    assert directive["Metrics"] == [{"Name": TTFT, "Unit": "Milliseconds"}, {"Name": TOKENS, "Unit": "Count"}]
    assert isinstance(line["_aws"]["Timestamp"], int)
    assert (line[SERVICE], line[CELL]) == (contract.METRIC_SERVICE_VALUE, cell)


def test_a_completion_writes_one_emf_line_with_its_time_to_first_token_and_output_tokens(shared_unit):
    raw = client(shared_unit).chat.completions.with_raw_response.create(
        model="tiny",
        messages=[{"role": "user", "content": "count to seven"}],
        max_tokens=7,
        temperature=0,
        extra_body={"ignore_eos": True},
        extra_headers={contract.REQUEST_ID_HEADER: "emf-plain-1"},
    )
    usage = raw.parse().usage
    line = the_line_of(shared_unit, "emf-plain-1")
    assert_request_line_shape(line, cell="cell-t")
    assert line[TOKENS] == usage.completion_tokens == 7
    arrival = float(raw.headers[contract.ARRIVAL_HEADER])
    first = float(raw.headers[contract.FIRST_TOKEN_HEADER])
    # the headers carry microseconds; the metric is the same interval in milliseconds
    assert line[TTFT] == pytest.approx((first - arrival) * 1000, abs=0.01)
    assert arrival * 1000 <= line["_aws"]["Timestamp"] <= float(raw.headers[contract.FINISH_HEADER]) * 1000 + 1


def test_a_streamed_completion_writes_its_line_at_the_end(shared_unit):
    chunks = list(
        client(shared_unit).completions.create(
            model="tiny",
            prompt="stream and count",
            max_tokens=5,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
            extra_headers={contract.REQUEST_ID_HEADER: "emf-stream-1"},
        )
    )
    line = the_line_of(shared_unit, "emf-stream-1")
    assert_request_line_shape(line, cell="cell-t")
    assert line[TOKENS] == chunks[-1].usage.completion_tokens == 5
    assert line[TTFT] > 0


def test_followers_write_no_metric_lines(shared_unit):
    client(shared_unit).completions.create(
        model="tiny", prompt="x", max_tokens=2, extra_headers={contract.REQUEST_ID_HEADER: "emf-follower-1"}
    )
    the_line_of(shared_unit, "emf-follower-1")
    assert shared_unit.members[1].emf_lines() == []


def test_without_a_cell_a_line_carries_only_the_fleet_wide_dimension_set():
    line = json.loads(emf.request_line(request_id="r", cell="", output_tokens=3, ttft_ms=12.5, timestamp_s=1.5))
    assert line["_aws"] == {
        "Timestamp": 1500,
        "CloudWatchMetrics": [
            {
                "Namespace": "Flotilla",
                "Dimensions": [["Service"]],
                "Metrics": [{"Name": TTFT, "Unit": "Milliseconds"}, {"Name": TOKENS, "Unit": "Count"}],
            }
        ],
    }
    assert CELL not in line and (line[TTFT], line[TOKENS], line["request_id"]) == (12.5, 3, "r")


def test_a_request_without_a_token_reports_output_tokens_only():
    line = json.loads(emf.request_line(request_id="r", cell="c", output_tokens=0, ttft_ms=None))
    assert line["_aws"]["CloudWatchMetrics"][0]["Metrics"] == [{"Name": TOKENS, "Unit": "Count"}]
    assert TTFT not in line and line[TOKENS] == 0


@pytest.mark.parametrize(
    "metrics, message",
    [
        ({"X": (float("nan"), "Count")}, "finite"),
        ({"X": (1, "Seconds")}, "Milliseconds"),
        ({}, "at least one metric"),
    ],
)
def test_a_bad_metric_is_refused_by_name(metrics, message):
    with pytest.raises(ValueError, match=message):
        emf.emf_line(metrics)
