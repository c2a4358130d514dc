"""Statistics over seeds, one rule for every report: the mean, its standard error, and one seed; and when a
learning curve first reaches a level."""

from __future__ import annotations

import math
from collections.abc import Iterable


def mean_se(values: list[float]) -> tuple[float, float]:
    """Mean and standard error of the mean (sample standard deviation / sqrt(n)) of ``values`` (at least
    one). One value gives no estimate of the spread: its s.e. is NaN, never 0."""
    if not values:
        raise ValueError("mean_se needs at least one value")
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, float("nan")
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)


def format_mean_se(mean: float, se: float, digits: int = 2) -> str:
    """``"m +- se"``, or ``"m"`` alone when the s.e. is unknown (one seed)."""
    return f"{mean:.{digits}f}" if math.isnan(se) else f"{mean:.{digits}f} +- {se:.{digits}f}"


def first_reaching(curve: Iterable[tuple[int, float]], level: float) -> int | None:
    """The smallest step of the ``(step, value)`` pairs (any order) whose value is at least ``level``; None if
    no value reaches it. NaN never reaches a level."""
    return min((step for step, value in curve if value >= level), default=None)
