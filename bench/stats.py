"""Summary statistics of per-step times: median, quartiles, range, and ratios taken pairwise."""

from __future__ import annotations

import statistics


def summarize(values: list[float]) -> dict:
    """Median, quartiles and range of a list of per-step times (seconds)."""
    if not values:
        return {}
    v = sorted(values)
    if len(v) >= 2:
        q1, _, q3 = statistics.quantiles(v, n=4, method="inclusive")
    else:
        q1 = q3 = v[0]
    return {
        "median": statistics.median(v),
        "q1": q1,
        "q3": q3,
        "min": v[0],
        "max": v[-1],
        "n": len(v),
    }


def paired_ratios(a: list[float], b: list[float]) -> dict:
    """summarize() of a[r] / b[r] round by round: drift of the machine between rounds cancels."""
    return summarize([x / y for x, y in zip(a, b) if y > 0])
