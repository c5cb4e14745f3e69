"""What the scaler, the deployment config and `flotilla scale` agree on: booked peaks (scheduled
minimums), the temporary floor an operator sets during an incident, and the names of the scaler's
parameter, metrics and settings. Standard library only, like the rest of contract/.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import datetime, timezone
from typing import Any

from contract.bad_input import OUT_OF_RANGE, BadInput, integer_range, number_range

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
ENV_SCALING_POLICY = "FLOTILLA_SCALING_POLICY"  # JSON: ScalingPolicy (below)
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
            raise ScalingError(
                f"scheduled {self.name}: units", self.units, OUT_OF_RANGE, f"give {integer_range(1, MAX_UNITS)}"
            )
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
            raise ScalingError("units", self.units, OUT_OF_RANGE, f"give {integer_range(0, MAX_UNITS)}")
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


# --- the scaler's settings: one JSON form, so the deployment config (synth), the cloud runner
# (environment) and `make local` (flags) hand the same object to decide() ---------------------------
# Defaults, each a stated choice (docs/scaling.md explains them):
# the share of a unit's batch slots the fleet may fill before another unit is wanted, and the share
# the survivors may fill after one leaves (below the first, so that removing a unit can never by
# itself call for adding one back: the gap is the no-flap margin).
TARGET_OCCUPANCY = 0.75
SCALE_IN_OCCUPANCY = 0.6
# p99 time to first token the fleet is held to, and the wait for a batch slot a unit may report
# before the fleet counts as pressed (the leader's own estimate, load.wait_s).
TTFT_TARGET_S = 2.0
WAIT_TARGET_S = 1.0
# At most this share of the units in rotation leaves in one pass (at least one unit).
STEP_DOWN_FRACTION = 0.1
# Under pressure with no unit pending and the slot arithmetic content, this share more is asked for.
PRESSURE_STEP_FRACTION = 0.1
# One pass asks for at most this many times the demand it measures (a fleet refusing nearly
# everything has a demand it cannot measure: the next pass measures again, with the added units).
MAX_GROWTH = 3.0
# The rate trend is fitted over this much history.
PREDICT_WINDOW_S = 600.0


@dataclass(frozen=True)
class ScalingPolicy:
    floor: int
    ceiling: int
    cold_start_s: float  # from the start of a unit to its first request, stated (docs/scaling.md)
    hold_s: float = -1.0  # no reversal of direction within this; < 0: twice the cold start
    target_occupancy: float = TARGET_OCCUPANCY
    scale_in_occupancy: float = SCALE_IN_OCCUPANCY
    ttft_target_s: float = TTFT_TARGET_S
    wait_target_s: float = WAIT_TARGET_S
    slots_per_unit: int = 16  # used only while no unit reports its batch slots (the node's --max-running)
    step_down_fraction: float = STEP_DOWN_FRACTION
    pressure_step_fraction: float = PRESSURE_STEP_FRACTION
    max_growth: float = MAX_GROWTH
    predict_window_s: float = PREDICT_WINDOW_S
    schedule: tuple[ScheduledMinimum, ...] = ()
    temporary_floor: TemporaryFloor | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        for name, low in (("floor", 1), ("ceiling", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= MAX_UNITS:
                raise ScalingError(name, value, OUT_OF_RANGE, f"give {integer_range(low, MAX_UNITS)}")
        if self.ceiling < self.floor:
            raise ScalingError("ceiling", self.ceiling, "is below the floor", f"at least floor ({self.floor})")
        if not (isinstance(self.cold_start_s, (int, float)) and 0 < self.cold_start_s <= 86400):
            raise ScalingError(
                "cold_start_s", self.cold_start_s, OUT_OF_RANGE, f"give {number_range(0, 86400, above=True)} (seconds)"
            )
        if not 0 < self.scale_in_occupancy < self.target_occupancy <= 1:
            raise ScalingError(
                "scale_in_occupancy",
                self.scale_in_occupancy,
                "is not below target_occupancy",
                f"0 < scale_in_occupancy < target_occupancy ({self.target_occupancy}) <= 1 (the gap stops flapping)",
            )
        for name in ("ttft_target_s", "wait_target_s", "predict_window_s"):
            if not getattr(self, name) > 0:
                raise ScalingError(name, getattr(self, name), "is not positive", "a number of seconds above 0")
        if not 0 < self.step_down_fraction <= 1 or not 0 < self.pressure_step_fraction <= 1:
            raise ScalingError(
                "step fractions", self.step_down_fraction, OUT_OF_RANGE, f"give {number_range(0, 1, above=True)}"
            )
        if not self.max_growth >= 1:
            raise ScalingError("max_growth", self.max_growth, "is below 1", "a factor of at least 1")
        if not isinstance(self.slots_per_unit, int) or self.slots_per_unit < 1:
            raise ScalingError("slots_per_unit", self.slots_per_unit, OUT_OF_RANGE, f"give {integer_range(1)}")
        if len(self.schedule) > MAX_SCHEDULED:
            raise ScalingError("schedule", len(self.schedule), "is too long", f"at most {MAX_SCHEDULED} entries")
        over = [s.name for s in self.schedule if s.units > self.ceiling]
        if over:
            raise ScalingError(
                f"scheduled {over[0]}: units",
                next(s.units for s in self.schedule if s.name == over[0]),
                "is above the ceiling",
                f"at most the ceiling ({self.ceiling}), or raise the ceiling",
            )

    @property
    def hold(self) -> float:
        """Seconds within which the scaler does not reverse direction (twice the cold start unless
        stated): a unit added is worth keeping at least as long as it took to start two."""
        return self.hold_s if self.hold_s >= 0 else 2 * self.cold_start_s

    def minimum(self, now_s: float, within_s: float = 0.0) -> tuple[int, str]:
        """The floor in force now and what sets it: the configured floor, a booked peak (from a cold
        start before it, so its units are ready at its start), or an operator's temporary floor.
        With within_s, a booked peak that comes into force in the next within_s counts already: a
        unit it would need that soon is not let go (it would have to start again: a reversal)."""
        best, why = self.floor, "the floor"
        for entry in self.schedule:
            if entry.applies(now_s, self.cold_start_s + within_s) and entry.units > best:
                best, why = entry.units, f"scheduled {entry.name}"
        temp = self.temporary_floor
        if temp is not None and temp.in_force(now_s) and temp.units > best:
            best, why = temp.units, "the temporary floor"
        return min(best, self.ceiling), why

    def with_temporary_floor(self, temp: TemporaryFloor | None) -> ScalingPolicy:
        return replace(self, temporary_floor=temp)

    def units_for(self, slots_demand: float, slots: float, occupancy: float) -> int:
        """Units whose batch slots hold `slots_demand` at `occupancy` of them."""
        return math.ceil(slots_demand / (slots * occupancy) - 1e-9) if slots_demand > 0 else 0

    # --- one JSON form --------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name in ("schedule", "temporary_floor"):
                continue
            out[f.name] = getattr(self, f.name)
        out["schedule"] = [s.to_json() for s in self.schedule]
        return out

    def dumps(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, doc: Any) -> ScalingPolicy:
        if not isinstance(doc, dict):
            raise ScalingError("scaling policy", doc, "is not a mapping", "a JSON object of ScalingPolicy's fields")
        known = {f.name for f in fields(cls)} - {"temporary_floor"}
        unknown = sorted(set(doc) - known)
        if unknown:
            raise ScalingError("scaling policy", ", ".join(unknown), "is not a known field", ", ".join(sorted(known)))
        args = dict(doc)
        args["schedule"] = tuple(ScheduledMinimum.from_json(s) for s in doc.get("schedule", ()))
        return cls(**args)

    @classmethod
    def loads(cls, text: str) -> ScalingPolicy:
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as err:
            raise ScalingError("scaling policy", text[:80], f"is not JSON ({err.msg})", "a JSON object") from None
        return cls.from_json(doc)
