"""What the scaler, the deployment config and `flotilla scale` agree on: booked peaks (scheduled
minimums), the temporary floor an operator sets during an incident, and the names of the scaler's
parameter, metrics and settings. Standard library only, like the rest of contract/.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from typing import Any

from contract.bad_input import BadInput

# The temporary floor's SSM String parameter (one per deployment). Written by `flotilla scale floor`,
# read by the scaler on every pass; never created by the stacks, so a `cdk deploy` cannot reset an
# incident's floor (the same reasoning as contract/admission.py).
PARAMETER_PREFIX = "/flotilla/"


def parameter_name(deployment: str) -> str:
    return f"{PARAMETER_PREFIX}{deployment}/scaling-floor"


# The scaler's own metrics (EMF, namespace contract.METRICS_NAMESPACE, [Service] dimension only),
# one line per pass: what the dashboard plots and the capacity alarm reads.
METRIC_TARGET_UNITS = "ScalerTargetUnits"  # Count: units the scaler wants serving or starting
METRIC_ACTIVE_UNITS = "ScalerActiveUnits"  # Count: units in rotation
METRIC_PENDING_UNITS = "ScalerPendingUnits"  # Count: units started, not ready yet
METRIC_DRAINING_UNITS = "ScalerDrainingUnits"  # Count: units handing their streams over before release
METRIC_UNMET_UNITS = "ScalerUnmetUnits"  # Count: units wanted beyond what capacity allows (alarm > 0)
# The router's traffic line, every ready-units interval (runtime/router/unit_report.py): requests it
# sent on and requests answered 429 (shed by the router or refused by a full unit) in the interval.
METRIC_REQUESTS = "RoutedRequests"  # Count
METRIC_BUSY_REFUSALS = "BusyRefusals"  # Count
# The router's log record of the same interval (the scaler reads per-unit load from `unit_states`).
TRAFFIC_EVENT = "traffic"
DECISION_EVENT = "scaler_decision"  # the scaler's log record of each pass

# Settings the scaler's runner reads from its environment (stacks/scaler.py sets them).
ENV_DEPLOYMENT = "FLOTILLA_DEPLOYMENT"
ENV_SCALING_POLICY = "FLOTILLA_SCALING_POLICY"  # JSON: ScalingPolicy's fields (runtime/scaler/policy.py)
ENV_UNIT_SERVICES = "FLOTILLA_UNIT_SERVICES"  # JSON: {unit id: [cluster name, service name]}
ENV_NODES_PER_UNIT = "FLOTILLA_NODES_PER_UNIT"
ENV_ROUTER_LOG_GROUP = "FLOTILLA_ROUTER_LOG_GROUP"
ENV_STATE_PARAMETER = "FLOTILLA_SCALER_STATE_PARAMETER"  # SSM parameter of the scaler's memory

MAX_UNITS = 10_000  # the deployment config's own bound on `units`
MAX_SCHEDULED = 20  # scheduled minimums one config may book


class ScalingError(BadInput):
    """A scaling value that is not valid, in the project's one wording (contract/bad_input.py)."""


_TIME = "an ISO 8601 time with its offset, like 2026-07-08T06:00:00Z"


def parse_utc(text: Any, field: str) -> float:
    """An ISO 8601 time with its offset (2026-07-08T06:00:00Z) -> unix seconds."""
    if not isinstance(text, str):
        raise ScalingError(field, text, "is not a time", _TIME)
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ScalingError(field, text, "is not a time", _TIME) from None
    if moment.tzinfo is None:
        raise ScalingError(field, text, "has no offset", "add Z (UTC) or +hh:mm, like 2026-07-08T06:00:00Z")
    return moment.timestamp()


def _whole(value: Any, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= MAX_UNITS


def format_utc(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class ScheduledMinimum:
    """A booked peak: from `start_s` to `end_s` at least `units` units serve. The scaler starts them a
    cold start ahead, so they are ready at `start_s`; `reservation` names the capacity bought for it
    (a Capacity Block or future-dated On-Demand Capacity Reservation id), shown by `flotilla scale`."""

    name: str
    start_s: float
    end_s: float
    units: int
    reservation: str = ""

    def __post_init__(self) -> None:
        if not _whole(self.units, 1):
            raise ScalingError(f"scheduled {self.name}: units", self.units, "is out of range", f"1 to {MAX_UNITS}")
        if not self.end_s > self.start_s:
            raise ScalingError(
                f"scheduled {self.name}: end",
                format_utc(self.end_s),
                "is not after its start",
                f"a time after {format_utc(self.start_s)}",
            )

    def applies(self, now_s: float, lead_s: float) -> bool:
        """True from `lead_s` before the start (the units must be ready at the start) to the end."""
        return self.start_s - lead_s <= now_s < self.end_s

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "start": format_utc(self.start_s),
            "end": format_utc(self.end_s),
            "units": self.units,
        }
        if self.reservation:
            out["reservation"] = self.reservation
        return out

    @classmethod
    def from_json(cls, doc: Any) -> ScheduledMinimum:
        fields = "a mapping with name, start, end, units (and optionally reservation)"
        if not isinstance(doc, dict):
            raise ScalingError("scheduled entry", doc, "is not a mapping", fields)
        unknown = sorted(set(doc) - {"name", "start", "end", "units", "reservation"})
        if unknown:
            raise ScalingError("scheduled entry", ", ".join(unknown), "is not a known field", fields)
        missing = sorted({"name", "start", "end", "units"} - set(doc))
        if missing:
            raise ScalingError(f"scheduled entry {doc.get('name', '?')}", ", ".join(missing), "is missing", fields)
        name = doc["name"]
        if not isinstance(name, str) or not 1 <= len(name) <= 64:
            raise ScalingError("scheduled name", name, "is not allowed", "1-64 characters")
        return cls(
            name=name,
            start_s=parse_utc(doc["start"], f"scheduled {name}: start"),
            end_s=parse_utc(doc["end"], f"scheduled {name}: end"),
            units=doc["units"],
            reservation=str(doc.get("reservation") or ""),
        )


@dataclass(frozen=True)
class TemporaryFloor:
    """An operator's floor during an incident: at least `units` units until `until_s`, then it lapses
    by itself (a forgotten floor must not pay for idle Trainium for weeks)."""

    units: int
    until_s: float
    reason: str = ""

    def __post_init__(self) -> None:
        if not _whole(self.units, 0):
            raise ScalingError("units", self.units, "is out of range", f"a whole number from 0 to {MAX_UNITS}")
        if not isinstance(self.reason, str) or len(self.reason) > 256:
            raise ScalingError("reason", self.reason, "is too long", "text of at most 256 characters")

    def in_force(self, now_s: float) -> bool:
        return now_s < self.until_s

    def dumps(self) -> str:
        doc = asdict(self)
        doc["until"] = format_utc(doc.pop("until_s"))
        return json.dumps({k: v for k, v in doc.items() if v != ""}, sort_keys=True)

    @classmethod
    def loads(cls, text: str) -> TemporaryFloor:
        example = 'an object such as {"units": 8, "until": "2026-07-08T06:00:00Z"}'
        try:
            doc: Any = json.loads(text)
        except json.JSONDecodeError as err:
            raise ScalingError("temporary floor", text, f"is not JSON ({err.msg})", example) from None
        if not isinstance(doc, dict) or "units" not in doc or "until" not in doc:
            raise ScalingError("temporary floor", text, "lacks units or until", example)
        unknown = sorted(set(doc) - {"units", "until", "reason"})
        if unknown:
            raise ScalingError("temporary floor", ", ".join(unknown), "is not a known field", "reason, units, until")
        return cls(units=doc["units"], until_s=parse_utc(doc["until"], "until"), reason=doc.get("reason", ""))
