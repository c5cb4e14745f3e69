"""The short-term rate prediction: a least-squares line through the recent rates, read a cold start
(or a hold) ahead. A line, not a seasonal model: over the ten minutes it sees, a day's curve is
nearly straight, and what a line cannot foresee (a surge nobody announced) is caught by measuring
the queue and the refusals instead; surges that are known are booked as scheduled minimums."""

from __future__ import annotations

from collections.abc import Sequence


def trend(history: Sequence[tuple[float, float]], window_s: float) -> tuple[float, float] | None:
    """(rate at the newest sample, slope per second) of the least-squares line through the samples
    of the last window_s; None with fewer than three samples or no spread in time."""
    if not history:
        return None
    newest = history[-1][0]
    points = [(t, r) for t, r in history if t >= newest - window_s]
    if len(points) < 3:
        return None
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_r = sum(r for _, r in points) / n
    spread = sum((t - mean_t) ** 2 for t, _ in points)
    if spread <= 0:
        return None
    slope = sum((t - mean_t) * (r - mean_r) for t, r in points) / spread
    return mean_r + slope * (newest - mean_t), slope


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
