"""The fleet-wide admission limit: what `flotilla shed set` writes to an SSM parameter and every
router reads while it runs, so an operator can protect the ready units during an incident without a
redeploy. One JSON object; the format is checked identically on both sides.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

# The parameter's name for a deployment (an SSM String parameter; the router's task role may read
# exactly this one). Not created by the stacks: a `cdk deploy` must never reset an incident's limit.
PARAMETER_PREFIX = "/flotilla/"


def parameter_name(deployment: str) -> str:
    return f"{PARAMETER_PREFIX}{deployment}/admission"


MAX_LIMIT = 100_000  # the router's own upper bounds for the two per-unit caps


class AdmissionError(ValueError):
    """The parameter's value is not an admission limit; the message names the field and the fix."""


@dataclass(frozen=True)
class AdmissionLimit:
    """All fields optional; each only ever lowers what the router's own settings allow.

    admit_percent: share of new requests the router takes at all (the rest get 429 + Retry-After
    before any unit is chosen). max_queue_depth: a unit reporting this queue depth takes nothing new
    (reported by the unit, so the same for every router). max_outstanding_per_unit: requests one
    router keeps in flight to one unit.
    """

    admit_percent: int = 100
    max_queue_depth: int | None = None
    max_outstanding_per_unit: int | None = None
    reason: str = ""  # who set it and why, shown by `flotilla shed show` and in router logs

    def __post_init__(self) -> None:
        percent = self.admit_percent
        if not isinstance(percent, int) or isinstance(percent, bool) or not 0 <= percent <= 100:
            raise AdmissionError(f"admit_percent={self.admit_percent!r}: a whole number from 0 to 100")
        for name in ("max_queue_depth", "max_outstanding_per_unit"):
            value = getattr(self, name)
            if value is not None and (
                not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_LIMIT
            ):
                raise AdmissionError(f"{name}={value!r}: a whole number from 1 to {MAX_LIMIT}, or absent")
        if not isinstance(self.reason, str) or len(self.reason) > 256:
            raise AdmissionError("reason: text of at most 256 characters")

    @property
    def limits_anything(self) -> bool:
        return self.admit_percent < 100 or self.max_queue_depth is not None or self.max_outstanding_per_unit is not None

    def caps(self, max_outstanding_per_unit: int, max_queue_depth: int) -> tuple[int, int]:
        """The router's per-unit caps with this limit applied (never raised)."""
        out = min(max_outstanding_per_unit, self.max_outstanding_per_unit or max_outstanding_per_unit)
        queue = min(max_queue_depth, self.max_queue_depth or max_queue_depth)
        return out, queue

    def dumps(self) -> str:
        return json.dumps({k: v for k, v in asdict(self).items() if v not in (None, "")}, sort_keys=True)

    @classmethod
    def loads(cls, text: str) -> AdmissionLimit:
        try:
            doc: Any = json.loads(text)
        except json.JSONDecodeError as err:
            raise AdmissionError(f'not JSON ({err.msg}): write an object such as {{"admit_percent": 80}}') from None
        if not isinstance(doc, dict):
            raise AdmissionError('not a JSON object: write an object such as {"admit_percent": 80}')
        known = {"admit_percent", "max_queue_depth", "max_outstanding_per_unit", "reason"}
        unknown = sorted(set(doc) - known)
        if unknown:
            raise AdmissionError(f"unknown field(s) {', '.join(unknown)}: allowed {', '.join(sorted(known))}")
        return cls(**doc)
