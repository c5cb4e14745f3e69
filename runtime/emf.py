"""CloudWatch embedded metric format (EMF): the one place flotilla builds its runtime metric lines.

The unit leader (time to first token, output tokens) and every router (ready units) write one JSON
line per measurement to stdout; the awslogs driver ships it and CloudWatch Logs extracts the metrics
the Observability stack's dashboard and alarms read. Contract: docs/observability.md.
"""

from __future__ import annotations

import json
import math
import sys
import time
from typing import Any, Iterable, Mapping, TextIO

import contract

MILLISECONDS = "Milliseconds"
COUNT = "Count"
PERCENT = "Percent"
UNITS = (MILLISECONDS, COUNT, PERCENT)

SERVICE = contract.METRIC_DIM_SERVICE
CELL = contract.METRIC_DIM_CELL


def emf_line(
    metrics: Mapping[str, tuple[float, str]],
    *,
    cell: str = "",
    fleet_series: bool = True,
    timestamp_s: float | None = None,
    properties: Mapping[str, Any] | None = None,
) -> str:
    """One EMF JSON line. `metrics` maps a metric name to (value, unit).

    Dimension sets: [Service] when fleet_series (the fleet-wide series), plus [Service, Cell] when a
    cell is given. CloudWatch rejects an empty dimension value, so without a cell (local runs) the
    line carries the Service set only. `properties` (e.g. request_id) ride along as log fields.
    """
    doc = emf_document(metrics, cell=cell, fleet_series=fleet_series, timestamp_s=timestamp_s, properties=properties)
    return json.dumps(doc, separators=(",", ":"))


def emf_document(
    metrics: Mapping[str, tuple[float, str]],
    *,
    cell: str = "",
    fleet_series: bool = True,
    timestamp_s: float | None = None,
    properties: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """emf_line's JSON object, for a writer that serializes its own lines (the router's access log)."""
    dimension_sets: list[list[str]] = []
    if fleet_series:
        dimension_sets.append([SERVICE])
    if cell:
        dimension_sets.append([SERVICE, CELL])
    if not dimension_sets:
        raise ValueError("an EMF line needs a dimension set: give a cell or keep fleet_series=True")
    if not metrics:
        raise ValueError("an EMF line needs at least one metric")
    doc: dict[str, Any] = {"_aws": None}  # first, as in the documented example; filled below
    for key, value in (properties or {}).items():
        if key in metrics or key in (SERVICE, CELL, "_aws"):
            raise ValueError(f"property {key!r} would overwrite a metric or dimension of the EMF line")
        doc[key] = value
    declared = []
    for name, (value, unit) in metrics.items():
        if unit not in UNITS:
            raise ValueError(f"metric {name}: unit {unit!r} is not one of {', '.join(UNITS)}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"metric {name}: value {value!r} is not a finite number")
        declared.append({"Name": name, "Unit": unit})
        doc[name] = value
    doc[SERVICE] = contract.METRIC_SERVICE_VALUE
    if cell:
        doc[CELL] = cell
    ts = time.time() if timestamp_s is None else timestamp_s
    doc["_aws"] = {
        "Timestamp": int(ts * 1000),
        "CloudWatchMetrics": [
            {"Namespace": contract.METRICS_NAMESPACE, "Dimensions": dimension_sets, "Metrics": declared}
        ],
    }
    return doc


def request_line(
    *, request_id: str, cell: str, output_tokens: int, ttft_ms: float | None, timestamp_s: float | None = None
) -> str:
    """The leader's line for one request: output tokens and, if a token came, time to first token."""
    metrics: dict[str, tuple[float, str]] = {}
    if ttft_ms is not None:
        metrics[contract.METRIC_TIME_TO_FIRST_TOKEN] = (round(ttft_ms, 3), MILLISECONDS)
    metrics[contract.METRIC_OUTPUT_TOKENS] = (int(output_tokens), COUNT)
    return emf_line(metrics, cell=cell, timestamp_s=timestamp_s, properties={"request_id": request_id})


def speculation_line(
    *, acceptance_pct: float, tokens_per_step: float, cell: str, timestamp_s: float | None = None
) -> str:
    """A leader's speculative-decoding line (runtime/node/speculation.py): fleet-wide and per cell."""
    metrics = {
        contract.METRIC_SPEC_ACCEPTANCE: (round(acceptance_pct, 2), PERCENT),
        contract.METRIC_DECODE_TOKENS_PER_STEP: (round(tokens_per_step, 3), COUNT),
    }
    return emf_line(metrics, cell=cell, timestamp_s=timestamp_s)


def ready_units_lines(*, per_cell: Mapping[str, int], fleet: int, timestamp_s: float | None = None) -> list[str]:
    """A router's ReadyUnits: one line per cell ([Service, Cell] only, so a cell's count never lands
    in the fleet-wide series whose Minimum the FleetReadyUnits alarm reads), then the fleet line."""
    ts = time.time() if timestamp_s is None else timestamp_s
    lines = [
        emf_line({contract.METRIC_READY_UNITS: (int(n), COUNT)}, cell=cell, fleet_series=False, timestamp_s=ts)
        for cell, n in sorted(per_cell.items())
        if cell
    ]
    lines.append(emf_line({contract.METRIC_READY_UNITS: (int(fleet), COUNT)}, timestamp_s=ts))
    return lines


def routing_line(
    *, routed_to_preferred_pct: float | None, busiest_unit_load_pct: float | None, timestamp_s: float | None = None
) -> str | None:
    """A router's routing figures of the last interval (fleet-wide series only); None with nothing to say."""
    metrics: dict[str, tuple[float, str]] = {}
    if routed_to_preferred_pct is not None:
        metrics[contract.METRIC_ROUTED_TO_PREFERRED] = (round(routed_to_preferred_pct, 2), PERCENT)
    if busiest_unit_load_pct is not None:
        metrics[contract.METRIC_BUSIEST_UNIT_LOAD] = (round(busiest_unit_load_pct, 2), PERCENT)
    return emf_line(metrics, timestamp_s=timestamp_s) if metrics else None


def router_request_document(
    record: Mapping[str, Any], *, added_latency_ms: float | None, fault: bool, timestamp_s: float | None = None
) -> dict[str, Any]:
    """A router's access-log record made an EMF document: RouterFaults (1 when the router itself failed
    the request) and, once the response reached the client, RouterAddedLatency. The record's fields
    stay log fields, so the one line per request is both the access log and the metric."""
    metrics: dict[str, tuple[float, str]] = {contract.METRIC_ROUTER_FAULTS: (1 if fault else 0, COUNT)}
    if added_latency_ms is not None:
        metrics[contract.METRIC_ROUTER_ADDED_LATENCY] = (round(added_latency_ms, 3), MILLISECONDS)
    return emf_document(metrics, timestamp_s=timestamp_s, properties=record)


def write_lines(lines: Iterable[str], stream: TextIO | None = None) -> None:
    """Write whole lines in one call and flush, so lines from concurrent writers never interleave
    and none waits in a buffer (stdout is a pipe to the log driver, not a terminal)."""
    text = "".join(line + "\n" for line in lines)
    if not text:
        return
    out = stream if stream is not None else sys.stdout
    out.write(text)
    out.flush()
