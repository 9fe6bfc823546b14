"""The one comparison helper used by every parity test.

A check passes when, element by element, |actual - expected| <= rtol * |expected| + atol, where
atol defaults to rtol * max|expected| (a floor at the tensor's own scale, so entries that happen to
be near zero are not judged by a meaningless relative error). On failure the message gives the
largest absolute and relative errors, the worst index, and both values there.

Non-finite values fail, on either side, even where both sides agree (NaN vs NaN, -inf vs -inf): a
parity test that compares two NaNs has proven nothing. A Tolerance with `nonfinite=True` opts in
for tensors where infinities are the expected result (a masked logit); then the two non-finite masks
must be identical, every infinity must have the same sign on both sides, and NaN matches only NaN.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import numpy as np

from models.state_dict import to_numpy


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """A named bound. `why` says where the number comes from; it is printed on failure."""

    name: str
    rtol: float
    atol: float | None = None  # None: rtol * max|expected|
    why: str = ""
    nonfinite: bool = False  # True: identical NaN/inf masks (same-signed infinities) may pass


# The project-wide bounds. Tests may define narrower ones beside them, never wider ones without a
# measured reason written in `why`.
FLOAT64 = Tolerance("float64", 1e-12, why="float64 round-off of the same formula, ~1e-16 per op")
FLOAT32 = Tolerance(
    "float32", 1e-5, why="float32 round-off; torch flash vs manual attention differ by 1.2e-6"
)
BFLOAT16 = Tolerance(
    "bfloat16", 1e-2, why="bfloat16 has an 8-bit mantissa (2^-8 = 3.9e-3 per rounding)"
)
TRAJECTORY_F64 = Tolerance(
    "trajectory-float64", 1e-10, why="20 optimizer steps in float64; round-off accumulates per step"
)
EXACT = Tolerance("exact", 0.0, 0.0, why="the same bits: a copy, a permutation or integer logic")


@dataclasses.dataclass
class Comparison:
    name: str
    shape: tuple
    max_abs: float
    max_rel: float
    worst_index: tuple
    actual_at_worst: float
    expected_at_worst: float
    tolerance: Tolerance
    passed: bool
    scale: float = 0.0  # max|expected|
    nonfinite: int = 0  # elements that are NaN or inf on either side

    @property
    def scale_rel(self) -> float:
        """max|actual - expected| / max|expected|: the error the default bound limits to rtol."""
        return self.max_abs / self.scale if self.scale > 0 else self.max_abs

    def message(self) -> str:
        status = "ok" if self.passed else "MISMATCH"
        return (
            f"{status} {self.name} shape={self.shape} tol={self.tolerance.name}"
            f"(rtol={self.tolerance.rtol:g}, atol={'scale' if self.tolerance.atol is None else self.tolerance.atol})"
            f" max_abs={self.max_abs:.3e} rel_to_scale={self.scale_rel:.3e} max_rel={self.max_rel:.3e}"
            f" worst_index={self.worst_index}"
            f" actual={self.actual_at_worst!r} expected={self.expected_at_worst!r}"
            + (f" nonfinite={self.nonfinite}" if self.nonfinite else "")
            + (f"  [{self.tolerance.why}]" if self.tolerance.why and not self.passed else "")
        )


def compare(name: str, actual, expected, tol: Tolerance) -> Comparison:
    """Compare two arrays (numpy, JAX or torch) and return the full report without raising."""
    a = to_numpy(actual)
    e = to_numpy(expected)
    if a.shape != e.shape:
        raise AssertionError(f"{name}: shape mismatch, actual {a.shape} vs expected {e.shape}")
    if a.dtype == bool or np.issubdtype(a.dtype, np.integer):
        a64, e64 = a.astype(np.float64), e.astype(np.float64)
    else:
        a64 = a.astype(np.float64)
        e64 = e.astype(np.float64)
    if a64.size == 0:
        return Comparison(name, a.shape, 0.0, 0.0, (), 0.0, 0.0, tol, True)
    a_fin, e_fin = np.isfinite(a64), np.isfinite(e64)
    if not (a_fin.all() and e_fin.all()):
        # same_nonfinite: NaN where the other side has NaN, +inf where +inf, -inf where -inf
        same_nonfinite = (a_fin == e_fin) & (a_fin | (np.isnan(a64) & np.isnan(e64)) | (a64 == e64))
        bad_mask = ~same_nonfinite if tol.nonfinite else ~(a_fin & e_fin)
        if bad_mask.any():
            idx = tuple(int(i) for i in np.argwhere(bad_mask)[0])
            return Comparison(
                name,
                a.shape,
                float("inf"),
                float("inf"),
                idx,
                float(a64[idx]),
                float(e64[idx]),
                tol,
                False,
                nonfinite=int((~(a_fin & e_fin)).sum()),
            )
        a64, e64 = np.where(e_fin, a64, 0.0), np.where(e_fin, e64, 0.0)
    diff = np.abs(a64 - e64)
    scale = float(np.max(np.abs(e64)))
    atol = tol.rtol * scale if tol.atol is None else tol.atol
    bound = tol.rtol * np.abs(e64) + atol
    excess = diff - bound
    worst = np.unravel_index(int(np.argmax(excess)), diff.shape) if diff.ndim else ()
    rel = diff / np.maximum(np.abs(e64), np.finfo(np.float64).tiny)
    passed = bool(np.all(diff <= bound))
    return Comparison(
        name=name,
        shape=tuple(a.shape),
        max_abs=float(diff.max()),
        max_rel=float(rel.max()),
        worst_index=tuple(int(i) for i in worst),
        actual_at_worst=float(a64[worst]),
        expected_at_worst=float(e64[worst]),
        tolerance=tol,
        passed=passed,
        scale=scale,
    )


def assert_close(name: str, actual, expected, tol: Tolerance) -> Comparison:
    """compare() and raise AssertionError with the full report on mismatch."""
    c = compare(name, actual, expected, tol)
    if not c.passed:
        raise AssertionError(c.message())
    return c


def assert_all_close(
    pairs: Iterable[tuple[str, object, object]], tol: Tolerance
) -> list[Comparison]:
    """Compare many named pairs; the error lists every mismatch, not just the first."""
    results = [compare(n, a, e, tol) for n, a, e in pairs]
    bad = [c for c in results if not c.passed]
    if bad:
        raise AssertionError(
            f"{len(bad)} of {len(results)} tensors differ:\n" + "\n".join(c.message() for c in bad)
        )
    return results


def format_table(rows: list[Comparison]) -> str:
    """A fixed-width table for the `python -m parity` reports.

    `rel/scale` is max|a - e| / max|e|, the quantity the default bound limits to `tol`;
    `max rel` is the largest element-wise relative error, large wherever an entry is near zero.
    """
    head = (
        f"{'tensor':<48} {'shape':<18} {'max abs':>10} {'rel/scale':>10} {'max rel':>10}"
        f" {'tol':>10}  result"
    )
    lines = [head, "-" * len(head)]
    for c in rows:
        lines.append(
            f"{c.name:<48} {str(c.shape):<18} {c.max_abs:>10.2e} {c.scale_rel:>10.2e} {c.max_rel:>10.2e} "
            f"{c.tolerance.rtol:>10.0e}  {'pass' if c.passed else 'FAIL'}"
        )
    n_bad = sum(not c.passed for c in rows)
    lines.append(f"{len(rows) - n_bad} passed, {n_bad} failed")
    return "\n".join(lines)
