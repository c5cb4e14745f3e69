"""The short-term rate prediction: a trend through the recent rates, read a cold start (or a hold)
ahead. A line, not a seasonal model: over the ten minutes it sees, a day's curve is nearly straight.
A trend counts only as far as both halves of the window show it (the smaller of their two slopes):
a ramp shows in both, while a step (a surge that began a few minutes ago, already in what the units
report) or noise shows in one at most, and a line through a step would predict the step again every
cold start. What a trend cannot foresee (a surge nobody announced) is caught by measuring the queues
and the refusals instead; surges that are known are booked as scheduled minimums."""

from __future__ import annotations

from collections.abc import Sequence


def _fit(points: Sequence[tuple[float, float]]) -> tuple[float, float, float] | None:
    """(mean time, mean rate, slope) of the least-squares line through the points."""
    n = len(points)
    if n < 2:
        return None
    mean_t = sum(t for t, _ in points) / n
    mean_r = sum(r for _, r in points) / n
    spread = sum((t - mean_t) ** 2 for t, _ in points)
    if spread <= 0:
        return None
    return mean_t, mean_r, sum((t - mean_t) * (r - mean_r) for t, r in points) / spread


def trend(history: Sequence[tuple[float, float]], window_s: float) -> tuple[float, float] | None:
    """(rate at the newest sample, slope per second) over the last window_s: the least-squares line's
    level, and the smaller of the two halves' slopes when both rise (else 0). None with fewer than
    four samples."""
    if not history:
        return None
    newest = history[-1][0]
    points = [(t, r) for t, r in history if t >= newest - window_s]
    whole = _fit(points) if len(points) >= 4 else None
    if whole is None:
        return None
    mid = len(points) // 2
    early, late = _fit(points[: mid + 1]), _fit(points[mid:])
    slope = min(early[2], late[2]) if early and late and early[2] > 0 and late[2] > 0 else 0.0
    mean_t, mean_r, whole_slope = whole
    return mean_r + whole_slope * (newest - mean_t), slope


def growth(history: Sequence[tuple[float, float]], window_s: float, ahead_s: float, cap: float) -> float:
    """How many times today's rate the line predicts `ahead_s` from now: at least 1 (a falling line
    never lowers what is measured now: a prediction may only add caution), at most `cap`."""
    fit = trend(history, window_s)
    if fit is None:
        return 1.0
    level, slope = fit
    if level <= 0 or slope <= 0:
        return 1.0
    return min(cap, (level + slope * ahead_s) / level)
