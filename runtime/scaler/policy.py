"""The scaler's settings: the range of units, booked peaks, the stated cold start, and the targets
its rules use. One JSON form, so the deployment config (synth), the cloud runner (environment) and
`make local` (flags) hand the same object to decide()."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields, replace
from typing import Any

from contract.scaling import MAX_SCHEDULED, MAX_UNITS, ScalingError, ScheduledMinimum, TemporaryFloor

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
                raise ScalingError(name, value, "is out of range", f"a whole number from {low} to {MAX_UNITS}")
        if self.ceiling < self.floor:
            raise ScalingError("ceiling", self.ceiling, "is below the floor", f"at least floor ({self.floor})")
        if not (isinstance(self.cold_start_s, (int, float)) and 0 < self.cold_start_s <= 86400):
            raise ScalingError("cold_start_s", self.cold_start_s, "is out of range", "seconds from 1 to 86400")
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
            raise ScalingError("step fractions", self.step_down_fraction, "is out of range", "0 < fraction <= 1")
        if not self.max_growth >= 1:
            raise ScalingError("max_growth", self.max_growth, "is below 1", "a factor of at least 1")
        if not isinstance(self.slots_per_unit, int) or self.slots_per_unit < 1:
            raise ScalingError("slots_per_unit", self.slots_per_unit, "is out of range", "a whole number of at least 1")
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
