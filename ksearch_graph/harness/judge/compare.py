"""The judge's output comparison: shape, dtype, device, NaN/Inf pattern, elementwise tolerance and relative L2."""

from __future__ import annotations

import math

from ksearch_graph.harness._torch import load_torch
from ksearch_graph.harness.tensors import as_tensors

TRIVIAL_REL_L2 = 0.5  # an output this far from the reference in L2 fails even if every element is within atol
COMPARE_CHUNK = 1 << 26  # elements compared at a time in float64 (bounds the comparison's extra memory)


def index_of(flat_index: int, shape: tuple) -> list[int]:
    idx = []
    for size in reversed(shape):
        idx.append(flat_index % size)
        flat_index //= size
    return idx[::-1]



def same(a, b) -> bool:
    torch = load_torch()
    if isinstance(a, torch.Tensor):
        if not isinstance(b, torch.Tensor) or a.shape != b.shape or a.dtype != b.dtype:
            return False
        if a.device != b.device:
            b = b.to(a.device)
        if a.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            a, b = a.view(torch.uint8), b.view(torch.uint8)  # compare the bits; fp8 has few ops
        if torch.equal(a, b):
            return True
        if not (a.is_floating_point() or a.is_complex()):
            return False
        return bool(((a == b) | (a.isnan() & b.isnan())).all())  # NaN where NaN was is unchanged
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


def compare(out, expected: list, tol: dict, as_dtype: str | None = None) -> tuple[str | None, str, float, float]:
    """Check one output against the expected tensors: (failure status or None, message, max abs, max rel error).
    ``as_dtype`` (task.json "compare_dtype", e.g. "float32"): floating outputs and references cast to it and compared
    by value, the output's dtype not checked (GPU MODE's checker)."""
    torch = load_torch()
    if isinstance(out, str):  # the runner sends the type name of anything that is not a tensor or tensors
        return "incorrect_shape", f"returned {out}, expected a torch.Tensor", math.inf, math.inf
    got = as_tensors(out)
    if got is None:
        return "incorrect_shape", f"returned {type(out).__name__}, expected a torch.Tensor", math.inf, math.inf
    if len(got) != len(expected):
        return "incorrect_shape", f"returned {len(got)} tensors, expected {len(expected)}", math.inf, math.inf
    worst = worst_rel = 0.0
    for k, (o, r) in enumerate(zip(got, expected)):
        name = "output" if len(got) == 1 else f"output[{k}]"
        if tuple(o.shape) != tuple(r.shape):
            return ("incorrect_shape", f"{name} has shape {tuple(o.shape)}, expected {tuple(r.shape)}", math.inf,
                    math.inf)
        if as_dtype and o.is_floating_point() and r.is_floating_point():
            o, r = o.to(getattr(torch, as_dtype)), r.to(getattr(torch, as_dtype))
        if o.dtype != r.dtype:
            return "incorrect_dtype", f"{name} has dtype {o.dtype}, expected {r.dtype}", math.inf, math.inf
        if o.device != r.device:
            return "incorrect_dtype", f"{name} is on {o.device}, expected {r.device}", math.inf, math.inf
        if o.is_complex():  # real and imaginary parts each held to the tolerance
            o, r = torch.view_as_real(o), torch.view_as_real(r)
        failure, max_err, max_rel = _compare_values(name, o.reshape(-1), r.reshape(-1), tuple(o.shape), tol)
        if failure:
            return "incorrect_numerical", failure, max_err, max_rel
        worst, worst_rel = max(worst, max_err), max(worst_rel, max_rel)
    return None, "", worst, worst_rel


def _compare_values(name: str, o, r, shape: tuple, tol: dict) -> tuple[str | None, float, float]:
    """Elementwise tolerance on the device, a chunk at a time: (failure, max abs, max rel error).

    Floats of 32 bits and fewer are compared in float32 (exact for bf16/fp16/fp8 values; the rounding of a
    difference is far below any tolerance), everything else in float64. The statistics stay on the device until
    the end: a 3 GB output costs one wait for the device and about ten passes over its memory, not ten waits.
    """
    torch = load_torch()
    n = o.numel()
    if n == 0:
        return None, 0.0, 0.0
    narrow = (torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2)
    work = torch.float32 if o.dtype in narrow and r.dtype in narrow else torch.float64
    exact = not o.is_floating_point()  # integers and bools: differences taken in int64, exactly
    # bad, non-finite, sum err^2, sum ref^2, max rel, max |ref|
    stats = torch.zeros(6, dtype=torch.float64, device=o.device)
    max_err = torch.full((1,), -1.0, dtype=work, device=o.device)
    max_at = torch.zeros(1, dtype=torch.int64, device=o.device)
    for lo in range(0, n, COMPARE_CHUNK):
        if exact:
            oi, ri = o[lo:lo + COMPARE_CHUNK].to(torch.int64), r[lo:lo + COMPARE_CHUNK].to(torch.int64)
            err, rc = torch.sub(oi, ri).abs_().to(work), ri.to(work)
            nonfinite = torch.zeros(err.shape, dtype=torch.bool, device=o.device)
        else:
            oc, rc = o[lo:lo + COMPARE_CHUNK].to(work), r[lo:lo + COMPARE_CHUNK].to(work)
            nonfinite = torch.isfinite(oc).logical_and_(torch.isfinite(rc)).logical_not_()
            stats[1] += nonfinite.sum()
            err = torch.sub(oc, rc).abs_().masked_fill_(nonfinite, 0.0)  # where either is NaN/Inf: checked apart
        abs_ref = rc.abs()
        stats[0] += (err > abs_ref * tol["rtol"] + tol["atol"]).sum()
        chunk_max, at = err.max(dim=0)
        better = chunk_max > max_err
        max_err = torch.where(better, chunk_max, max_err)
        max_at = torch.where(better, at + lo, max_at)
        # Relative error where the reference is not tiny (elsewhere only atol is meaningful).
        rel = err / torch.where(abs_ref >= 1e-6, abs_ref, torch.inf)
        stats[4] = torch.maximum(stats[4], rel.max().to(torch.float64))
        stats[2] += torch.dot(err, err)
        abs_ref.masked_fill_(nonfinite, 0.0)
        stats[5] = torch.maximum(stats[5], abs_ref.max().to(torch.float64))
        stats[3] += torch.dot(abs_ref, abs_ref)
    bad, nonfinite_count, diff2, ref2, max_rel, max_ref = stats.tolist()
    max_err, max_at = float(max_err), int(max_at)
    # float32 squares overflow above ~1e19 and vanish below ~1e-19: then the sums are redone in float64.
    if work == torch.float32 and not (math.isfinite(diff2) and math.isfinite(ref2) and max_ref > 1e-15):
        diff2 = ref2 = 0.0
        for lo in range(0, n, COMPARE_CHUNK):
            oc, rc = o[lo:lo + COMPARE_CHUNK].to(torch.float64), r[lo:lo + COMPARE_CHUNK].to(torch.float64)
            finite = oc.isfinite() & rc.isfinite()
            diff2 += float(torch.where(finite, oc - rc, 0.0).square().sum())
            ref2 += float(torch.where(finite, rc, 0.0).square().sum())

    def show(i: int) -> str:
        return f"{index_of(i, shape)} (got {o[i].item():.6g}, expected {r[i].item():.6g})"

    if nonfinite_count:
        failure = _special_mismatch(name, o, r, show)
        if failure:
            return failure, math.inf, math.inf
    if 1.0 - bad / n < tol["matched_ratio"]:
        return (f"{name}: {int(bad)} of {n} elements outside atol={tol['atol']:g}, rtol={tol['rtol']:g}; "
                f"max abs error {max_err:.4g} at {show(max_at)}"), max_err, max_rel
    if ref2 > 0 and math.sqrt(diff2 / ref2) > TRIVIAL_REL_L2:
        # Every element is within atol only because the reference's values are small against it (zeros pass).
        return (f"{name}: within the elementwise tolerance, but its relative L2 error is "
                f"{math.sqrt(diff2 / ref2):.3g}: the output does not follow the reference"), max_err, max_rel
    return None, max_err, max_rel


def _special_mismatch(name: str, o, r, show) -> str | None:
    """Where output or reference is NaN or Inf, both must be: the same infinity, or both NaN."""
    torch = load_torch()
    special, first = 0, None
    for lo in range(0, o.numel(), COMPARE_CHUNK):
        oc, rc = o[lo:lo + COMPARE_CHUNK], r[lo:lo + COMPARE_CHUNK]
        if oc.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            oc, rc = oc.float(), rc.float()
        differs = (oc.isnan() != rc.isnan()) | (oc.isposinf() != rc.isposinf()) | (oc.isneginf() != rc.isneginf())
        count = int(differs.sum())
        if count:
            special += count
            if first is None:
                first = lo + int(differs.nonzero()[0])
    if special:
        return (f"{name}: NaN/Inf pattern differs from the reference at {special} of {o.numel()} elements "
                f"(first at {show(first)})")
    return None

