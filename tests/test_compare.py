"""The judge's output comparison (``harness.compare``), on CPU tensors: what passes and what fails, the error
figures it reports, and its edges (NaN/Inf positions, float32 overflow, integers beyond float32, chunk borders).

The harness tests reach it end to end; these pin down the rules themselves, which run on every correctness call.
"""

from __future__ import annotations

import math

import pytest
import torch

from ksearch_graph.harness.judge import compare

TOL = {"atol": 1e-3, "rtol": 1e-3, "matched_ratio": 1.0}


@pytest.fixture(params=[1 << 26, 7], ids=["one-chunk", "chunks-of-7"])
def chunk(request, monkeypatch):
    monkeypatch.setattr(compare, "COMPARE_CHUNK", request.param)


def test_equal_outputs_pass_with_zero_error(chunk):
    x = torch.randn(100)
    assert compare.compare(x, [x.clone()], TOL) == (None, "", 0.0, 0.0)


def test_one_element_off_fails_and_is_located(chunk):
    ref = torch.arange(1.0, 101.0).reshape(10, 10)
    out = ref.clone()
    out[7, 3] += 0.5
    status, message, max_abs, max_rel = compare.compare(out, [ref], TOL)
    assert status == "incorrect_numerical"
    assert "1 of 100 elements" in message and "[7, 3]" in message and "expected 74" in message
    assert max_abs == pytest.approx(0.5) and max_rel == pytest.approx(0.5 / 74)


def test_matched_ratio_allows_a_share_of_misses(chunk):
    ref = torch.ones(100)
    out = ref.clone()
    out[:5] = 2.0
    assert compare.compare(out, [ref], TOL | {"matched_ratio": 0.95})[0] is None
    assert compare.compare(out, [ref], TOL | {"matched_ratio": 0.96})[0] == "incorrect_numerical"


def test_errors_within_tolerance_are_reported(chunk):
    ref = torch.full((50,), 2.0)
    out = ref + 1e-3
    status, _, max_abs, max_rel = compare.compare(out, [ref], TOL)
    assert status is None
    assert max_abs == pytest.approx(1e-3, rel=1e-3) and max_rel == pytest.approx(5e-4, rel=1e-3)


@pytest.mark.parametrize("got, want, ok", [
    (math.nan, math.nan, True),
    (math.inf, math.inf, True),
    (-math.inf, -math.inf, True),
    (math.nan, 1.0, False),
    (1.0, math.nan, False),
    (math.inf, -math.inf, False),
    (math.inf, 1.0, False),
    (3.0e38, math.inf, False),
])
def test_nan_and_inf_must_sit_where_the_reference_has_them(chunk, got, want, ok):
    ref = torch.arange(20, dtype=torch.float32)
    out = ref.clone()
    ref[11], out[11] = want, got
    status, message, _, _ = compare.compare(out, [ref], TOL)
    if ok:
        assert status is None, message
    else:
        assert status == "incorrect_numerical" and "NaN/Inf pattern" in message and "[11]" in message


def test_huge_finite_values_do_not_overflow_the_verdict(chunk):
    # float32 squares of 1e20 overflow: the L2 rule is recomputed in float64 and the close output passes.
    ref = torch.full((30,), 1e20)
    assert compare.compare(ref * (1 + 1e-4), [ref], TOL)[0] is None
    # A difference that overflows float32 is still an error, not a NaN that slips through.
    ref = torch.full((30,), -3e38)
    status, _, max_abs, _ = compare.compare(-ref, [ref], TOL)
    assert status == "incorrect_numerical" and max_abs == math.inf


def test_tiny_values_do_not_vanish_from_the_l2_rule(chunk):
    # Squares of 1e-23 underflow float32: the sums are redone in float64, and 0.3x the reference still fails.
    ref = torch.full((100,), 1e-23)
    status, message, _, _ = compare.compare(ref * 0.3, [ref], TOL)
    assert status == "incorrect_numerical" and "relative L2 error" in message


def test_outputs_near_zero_fail_the_relative_l2_rule(chunk):
    ref = torch.randn(1000) * 1e-4  # every element below atol
    status, message, _, _ = compare.compare(torch.zeros(1000), [ref], TOL)
    assert status == "incorrect_numerical" and "relative L2 error" in message


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_other_float_dtypes(chunk, dtype):
    ref = torch.randn(64).to(dtype)
    assert compare.compare(ref.clone(), [ref], TOL)[0] is None
    out = ref.clone()
    out[5] += 1
    assert compare.compare(out, [ref], TOL)[0] == "incorrect_numerical"


def test_integers_are_compared_exactly_beyond_float64(chunk):
    ref = torch.full((10,), 2**60, dtype=torch.int64)
    out = ref.clone()
    out[3] += 1  # the same number in float64
    status, _, max_abs, _ = compare.compare(out, [ref], {"atol": 0.0, "rtol": 0.0, "matched_ratio": 1.0})
    assert status == "incorrect_numerical" and max_abs == 1.0


def test_complex_outputs_are_checked_in_both_parts(chunk):
    ref = torch.randn(16, dtype=torch.complex64)
    assert compare.compare(ref.clone(), [ref], TOL)[0] is None
    out = ref.clone()
    out[4] += 1j  # only the imaginary part is wrong
    assert compare.compare(out, [ref], TOL)[0] == "incorrect_numerical"


def test_shape_dtype_and_count_mismatches(chunk):
    ref = torch.zeros(4, 4)
    assert compare.compare(torch.zeros(16), [ref], TOL)[0] == "incorrect_shape"
    assert compare.compare(torch.zeros(4, 4, dtype=torch.float64), [ref], TOL)[0] == "incorrect_dtype"
    assert compare.compare((ref, ref), [ref], TOL)[0] == "incorrect_shape"
    assert compare.compare("dict", [ref], TOL)[0] == "incorrect_shape"


def test_same_treats_nan_as_equal_to_nan():
    a = torch.tensor([1.0, math.nan])
    assert compare.same(a, a.clone())
    assert not compare.same(a, torch.tensor([1.0, 2.0]))
    assert compare.same((a, {"k": 3}), (a.clone(), {"k": 3}))
    assert not compare.same(torch.tensor([1, 2]), torch.tensor([1, 3]))


def test_as_dtype_compares_values_and_ignores_the_outputs_dtype():
    """task.json "compare_dtype" (GPU MODE's checker): both sides cast to it, the output's dtype not checked."""
    ref = torch.randn(64, 32)
    tol = {"atol": 1e-2, "rtol": 1e-2, "matched_ratio": 1.0}
    assert compare.compare(ref.half(), [ref], tol)[0] == "incorrect_dtype"
    assert compare.compare(ref.half(), [ref], tol, "float32")[0] is None
    assert compare.compare(ref.half() + 1, [ref], tol, "float32")[0] == "incorrect_numerical"
    assert compare.compare(ref.half()[:8], [ref], tol, "float32")[0] == "incorrect_shape"
    assert compare.compare(torch.ones(3, dtype=torch.int32), [torch.ones(3)], tol, "float32")[0] == "incorrect_dtype"
