"""The comparison helper must fail loudly and say where: every parity test relies on it."""

import numpy as np
import pytest

from parity.compare import EXACT, FLOAT32, Tolerance, assert_all_close, assert_close, compare


def test_passes_within_tolerance():
    e = np.linspace(-1, 1, 101)
    assert_close("x", e * (1 + 5e-6), e, FLOAT32)


def test_failure_names_tensor_index_and_values():
    e = np.zeros((3, 4))
    a = e.copy()
    a[2, 1] = 1e-3
    e[0, 0] = a[0, 0] = 1.0
    with pytest.raises(AssertionError) as info:
        assert_close("blocks.0.attn", a, e, FLOAT32)
    msg = str(info.value)
    assert "blocks.0.attn" in msg and "(2, 1)" in msg and "max_abs=1.000e-03" in msg


def test_scale_floor_and_explicit_atol():
    e = np.array([1.0, 1e-9])
    a = np.array([1.0, 2e-9])  # relative error 1 at a near-zero entry, tiny versus the scale
    assert compare("x", a, e, FLOAT32).passed
    assert not compare("x", a, e, Tolerance("strict", 1e-5, atol=0.0)).passed


def test_nan_mismatch_fails_and_exact_requires_equality():
    assert not compare("x", np.array([np.nan, 1.0]), np.array([0.0, 1.0]), FLOAT32).passed
    assert not compare("x", np.array([1, 2]), np.array([1, 3]), EXACT).passed
    with pytest.raises(AssertionError, match="2 of 3"):
        assert_all_close([("a", [1.0], [2.0]), ("b", [1.0], [1.0]), ("c", [3.0], [1.0])], FLOAT32)


def test_shape_mismatch_is_an_error():
    with pytest.raises(AssertionError, match="shape mismatch"):
        compare("x", np.zeros(3), np.zeros(4), FLOAT32)


NAN, INF = np.nan, np.inf
# (actual, expected) pairs whose non-finite entries agree in kind and sign
MATCHING_NONFINITE = [
    ([NAN, 1.0], [NAN, 1.0]),
    ([INF, 1.0], [INF, 1.0]),
    ([-INF, 1.0], [-INF, 1.0]),
    ([NAN, -INF, INF, 2.0], [NAN, -INF, INF, 2.0]),
]
# pairs that differ in a non-finite entry: mask, kind or sign
DIFFERING_NONFINITE = [
    ([NAN, 1.0], [INF, 1.0]),  # NaN vs inf
    ([INF, 1.0], [NAN, 1.0]),
    ([-INF, 1.0], [INF, 1.0]),  # opposite infinities
    ([NAN, 1.0], [1.0, 1.0]),  # non-finite on one side only
    ([1.0, 1.0], [-INF, 1.0]),
]


@pytest.mark.parametrize("tol", [EXACT, FLOAT32, Tolerance("loose", 1.0)], ids=lambda t: t.name)
@pytest.mark.parametrize("pair", MATCHING_NONFINITE + DIFFERING_NONFINITE)
def test_nonfinite_values_fail_by_default(pair, tol):
    """NaN vs NaN proves nothing: any non-finite value fails unless the Tolerance opts in."""
    c = compare("x", np.array(pair[0]), np.array(pair[1]), tol)
    assert not c.passed and c.nonfinite >= 1
    assert "nonfinite=" in c.message()


@pytest.mark.parametrize("pair", MATCHING_NONFINITE)
def test_opted_in_nonfinite_passes_identical_masks(pair):
    tol = Tolerance("masked-exact", 0.0, 0.0, nonfinite=True)
    assert compare("x", np.array(pair[0]), np.array(pair[1]), tol).passed


@pytest.mark.parametrize("pair", DIFFERING_NONFINITE)
def test_opted_in_nonfinite_still_fails_different_masks_or_signs(pair):
    tol = Tolerance("masked-loose", 1.0, nonfinite=True)
    c = compare("x", np.array(pair[0]), np.array(pair[1]), tol)
    assert not c.passed and c.worst_index == (0,)


def test_opted_in_nonfinite_still_checks_the_finite_entries():
    tol = Tolerance("masked-exact", 0.0, 0.0, nonfinite=True)
    assert not compare("x", np.array([-INF, 1.0]), np.array([-INF, 1.5]), tol).passed
    # a float32 infinity against a float64 one is the same infinity
    a = np.array([-INF, 1.0], np.float32)
    assert compare("x", a, a.astype(np.float64), tol).passed


def test_reference_bound_is_relative_to_the_reference_implementations_error():
    from parity.compare import ReferenceBound, compare_to_reference

    exact = np.linspace(-1.0, 1.0, 201)
    ref = exact + 1e-4 * np.sin(np.arange(201))  # the reference implementation's own error: 1e-4
    bound = ReferenceBound("test", factor=2.0, floor=1e-6, metric="max")
    more_accurate = compare_to_reference("x", exact + 1e-5, ref, exact, bound)
    assert more_accurate.passed and abs(more_accurate.reference_error - 1e-4) < 1e-6
    assert more_accurate.direct > 8e-5  # far from the reference implementation, close to exact
    # 2.5 x the reference's error: over 2 x 1e-4 + 1e-6, wherever the reference happens to be
    wrong = compare_to_reference("x", exact + 2.5e-4, ref, exact, bound)
    assert not wrong.passed and "x" in wrong.message() and "MISMATCH" in wrong.message()
    # the floor stands where the reference implementation is exact
    assert not compare_to_reference("x", exact + 2e-6, exact, exact, bound).passed
    assert compare_to_reference("x", exact + 5e-7, exact, exact, bound).passed
    rms = ReferenceBound("test", factor=1.0, floor=0.0, metric="rms")
    assert abs(compare_to_reference("x", 2 * exact, exact, exact, rms).error - 1.0) < 1e-12
    with pytest.raises(ValueError, match="metric"):
        compare_to_reference("x", exact, exact, exact, ReferenceBound("t", 1.0, 0.0, "mean"))
