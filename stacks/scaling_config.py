"""The deployment config's `scaling` section: the fleet's range of units and what the scaler works
with. With it, `units` is the ceiling (every unit's resources exist; the scaler starts and drains
them) and `scaling.floor` the units that always serve (the first ones of the layout, their desired
count stated in the template). Validated here, beside stacks/config.py, which only holds the field.
Must not import aws_cdk (config-only tests import it).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Annotated, Any, get_args

from pydantic import BaseModel, ConfigDict, field_validator

from contract import scaling
from contract.bad_input import Allowed
from contract.declare import NOT_ALLOWED, Integer, Number, refusal
from contract.scaling import ScalingError, ScalingPolicy, ScheduledMinimum

if TYPE_CHECKING:
    from stacks.config import FlotillaConfig

# The Scaler stack: its role and policy, the function, its log group, the schedule and its permission,
# plus one SSM parameter per cell (the cell's desired counts). Observability gains two alarms.
SCALER_FIXED_RESOURCES = 6
OBSERVABILITY_SCALER_ALARMS = 2
MAX_RESOURCES_PER_STACK = 500  # CloudFormation, as stacks/config.py


_SCHEDULE = "a list of booked peaks: [{name, start, end, units, reservation}]"


def _schedule(value: Any) -> Any:
    if not isinstance(value, (list, tuple)):
        raise refusal(NOT_ALLOWED, f"give {_SCHEDULE}")
    try:
        return tuple(ScheduledMinimum.from_json(dict(v) if isinstance(v, dict) else v) for v in value)
    except ScalingError as err:
        raise refusal(NOT_ALLOWED, str(err)) from None


class ScalingConfig(BaseModel):
    """Whole units follow demand between `floor` and `units` (docs/scaling.md)."""

    # A field's docstring is its description in docs/configuration.md (stacks/config_doc.py).
    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True, use_attribute_docstrings=True)

    floor: Annotated[int, Integer(1, scaling.MAX_UNITS)] = 1
    """Units that always serve, at most `units`: the first ones of the layout (cell 0 first); their desired
    count is in the template and the scaler never drains them."""
    cold_start_s: Annotated[float, Number(60, 7200)] = 900.0
    """Seconds from a unit's start to its first request (instance launch, image, model, compile cache,
    warm-up; [scaling.md](scaling.md#cold-start)): the scaler adds units this far ahead, and gives back a
    unit that does not serve within three of them."""
    hold_s: Annotated[float, Number(0, 86400)] = 0.0
    """No reversal of direction within this many seconds; 0: twice the cold start."""
    ttft_target_s: Annotated[float, Number(0.05, 600)] = 2.0
    """The p99 time to first token above which the fleet counts as pressed."""
    target_occupancy: Annotated[float, Number(0.1, 1.0)] = scaling.TARGET_OCCUPANCY
    """The share of the batch slots the fleet may fill before another unit is wanted."""
    scale_in_occupancy: Annotated[float, Number(0.05, 0.95)] = scaling.SCALE_IN_OCCUPANCY
    """The share the other units may fill after one leaves; below `target_occupancy`."""
    scheduled: Annotated[tuple[ScheduledMinimum, ...], Allowed(_SCHEDULE)] = ()
    """Booked peaks: at least `units` from `start` to `end` (ISO 8601 with an offset), started a cold start
    early; `reservation` names the Capacity Block or future-dated ODCR bought for it
    ([runbook](runbooks/scale-for-peak.md))."""

    @field_validator("scheduled", mode="before")
    @classmethod
    def _parse_schedule(cls, value: Any) -> Any:
        return _schedule(value)

    def policy(self, ceiling: int, slots_per_unit: int = 16) -> ScalingPolicy:
        return ScalingPolicy(
            floor=self.floor,
            ceiling=ceiling,
            cold_start_s=self.cold_start_s,
            hold_s=self.hold_s or -1.0,
            ttft_target_s=self.ttft_target_s,
            target_occupancy=self.target_occupancy,
            scale_in_occupancy=self.scale_in_occupancy,
            slots_per_unit=slots_per_unit,
            schedule=self.scheduled,
        )


def section_type(annotation: Any) -> type[BaseModel]:
    """The section class of a config field's annotation; an optional section (X | None) has X's keys."""
    return next((a for a in get_args(annotation) if a is not type(None)), annotation)  # type: ignore[no-any-return]


def check_scaling(cfg: FlotillaConfig) -> None:
    """Refuse a scaling section that cannot work with this layout, in the config's one wording."""
    from stacks.config import ConfigError  # noqa: PLC0415 - config imports this module

    s = cfg.scaling
    if s is None:
        return
    if s.floor > cfg.units:
        raise ConfigError("scaling.floor", s.floor, f"at most units ({cfg.units}), the ceiling with scaling set")
    if not s.scale_in_occupancy < s.target_occupancy:
        raise ConfigError(
            "scaling.scale_in_occupancy",
            s.scale_in_occupancy,
            f"below scaling.target_occupancy ({s.target_occupancy}): the gap keeps a removal from calling for "
            "a unit back",
        )
    over = [e for e in s.scheduled if e.units > cfg.units]
    if over:
        raise ConfigError(
            f"scaling.scheduled[{over[0].name}].units",
            over[0].units,
            f"at most units ({cfg.units}): raise units (the ceiling) to book more",
        )
    if len(s.scheduled) > scaling.MAX_SCHEDULED:
        raise ConfigError("scaling.scheduled", len(s.scheduled), f"at most {scaling.MAX_SCHEDULED} booked peaks")
    pinned = [u for u in cfg.drained_units if u in floor_units(cfg)]
    if pinned:
        raise ConfigError(
            "drained_units", list(cfg.drained_units), f"units above the floor ({pinned[0]} is one of the floor's)"
        )
    stack = SCALER_FIXED_RESOURCES + cfg.cells
    if stack > MAX_RESOURCES_PER_STACK:
        raise ConfigError(
            "units",
            cfg.units,
            f"at most {(MAX_RESOURCES_PER_STACK - SCALER_FIXED_RESOURCES) * cfg.units_per_cell} with scaling "
            f"(the Scaler stack holds one parameter per cell; CloudFormation allows {MAX_RESOURCES_PER_STACK})",
        )


def floor_units(cfg: FlotillaConfig) -> list[str]:
    """The units that always serve: the first `floor` of the layout (units fill cells in order)."""
    floor = cfg.scaling.floor if cfg.scaling is not None else cfg.units
    return [p.unit_id for c in range(cfg.cells) for p in cfg.units_in_cell(c) if p.global_index < floor]


def fixed_units(cfg: FlotillaConfig) -> list[str]:
    """Units whose desired count the template states: the floor's and the config's drained ones."""
    return sorted(set(floor_units(cfg)) | set(cfg.drained_units))


def floor_per_cell(cfg: FlotillaConfig) -> dict[str, int]:
    """Units of each cell that always serve (none: the cell has no ready-units alarm of its own)."""
    out: dict[str, int] = {}
    for unit_id in floor_units(cfg):
        if unit_id in cfg.drained_units:
            continue
        cell = unit_id.split("-")[0]
        out[cell] = out.get(cell, 0) + 1
    return out


def start_timeout_s(cfg: FlotillaConfig) -> float:
    """How long a started unit may take to serve before it is given back: three cold starts."""
    assert cfg.scaling is not None
    return math.ceil(3 * cfg.scaling.cold_start_s)
