"""Row softmax, parameterised for the offline search (render_template fills in the placeholders).

VARIANT picks the algorithm:
- single_pass: one block holds the whole row (one read, one write). Only correct when BLOCK_N >= cols;
  deliberately not guarded, so the search has to learn that constraint from failures.
- online: one sweep keeps a running max and a rescaled running sum, a second sweep writes (two reads).
- two_pass: a statistics pass (a max sweep, then a sum sweep with that max), then a write pass (three reads);
  the simplest exact tiling, used as a safe baseline.
Each program handles ROWS_PER_PROGRAM consecutive rows.
"""

import torch
import triton
import triton.language as tl

VARIANT = "{{VARIANT}}"
BLOCK_N = {{BLOCK_N}}
ROWS_PER_PROGRAM = {{ROWS_PER_PROGRAM}}
NUM_WARPS = {{NUM_WARPS}}


@triton.jit
def _single_pass(x_ptr, y_ptr, n_rows, n_cols, stride_x, stride_y, BLOCK_N: tl.constexpr, ROWS: tl.constexpr):
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    for r in tl.static_range(ROWS):
        row = tl.program_id(0) * ROWS + r
        if row < n_rows:
            x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=-float("inf"))
            e = tl.exp(x - tl.max(x, axis=0))
            tl.store(y_ptr + row * stride_y + cols, e / tl.sum(e, axis=0), mask=mask)


@triton.jit
def _online(x_ptr, y_ptr, n_rows, n_cols, stride_x, stride_y, BLOCK_N: tl.constexpr, ROWS: tl.constexpr):
    cols = tl.arange(0, BLOCK_N)
    for r in tl.static_range(ROWS):
        row = tl.program_id(0) * ROWS + r
        if row < n_rows:
            # Every tile has at least one real column, so m is finite after the first tile and
            # exp(m - m_new) is never exp(-inf - -inf) = nan.
            m = tl.max(tl.full([BLOCK_N], -float("inf"), tl.float32), axis=0)
            s = tl.sum(tl.zeros([BLOCK_N], tl.float32), axis=0)
            for start in range(0, n_cols, BLOCK_N):
                mask = start + cols < n_cols
                x = tl.load(x_ptr + row * stride_x + start + cols, mask=mask, other=-float("inf"))
                m_new = tl.maximum(m, tl.max(x, axis=0))
                s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
                m = m_new
            for start in range(0, n_cols, BLOCK_N):
                mask = start + cols < n_cols
                x = tl.load(x_ptr + row * stride_x + start + cols, mask=mask, other=-float("inf"))
                tl.store(y_ptr + row * stride_y + start + cols, tl.exp(x - m) / s, mask=mask)


@triton.jit
def _two_pass(x_ptr, y_ptr, n_rows, n_cols, stride_x, stride_y, BLOCK_N: tl.constexpr, ROWS: tl.constexpr):
    cols = tl.arange(0, BLOCK_N)
    for r in tl.static_range(ROWS):
        row = tl.program_id(0) * ROWS + r
        if row < n_rows:
            # Lane-wise accumulators, reduced once after each sweep.
            m_lanes = tl.full([BLOCK_N], -float("inf"), tl.float32)
            for start in range(0, n_cols, BLOCK_N):
                mask = start + cols < n_cols
                x = tl.load(x_ptr + row * stride_x + start + cols, mask=mask, other=-float("inf"))
                m_lanes = tl.maximum(m_lanes, x)
            m = tl.max(m_lanes, axis=0)
            s_lanes = tl.zeros([BLOCK_N], tl.float32)
            for start in range(0, n_cols, BLOCK_N):
                mask = start + cols < n_cols
                x = tl.load(x_ptr + row * stride_x + start + cols, mask=mask, other=-float("inf"))
                s_lanes += tl.exp(x - m)
            s = tl.sum(s_lanes, axis=0)
            for start in range(0, n_cols, BLOCK_N):
                mask = start + cols < n_cols
                x = tl.load(x_ptr + row * stride_x + start + cols, mask=mask, other=-float("inf"))
                tl.store(y_ptr + row * stride_y + start + cols, tl.exp(x - m) / s, mask=mask)


_KERNELS = {"single_pass": _single_pass, "online": _online, "two_pass": _two_pass}


def softmax(x: torch.Tensor) -> torch.Tensor:
    x = x.contiguous()
    rows, cols = x.shape
    y = torch.empty_like(x)
    grid = (triton.cdiv(rows, ROWS_PER_PROGRAM),)
    _KERNELS[VARIANT][grid](
        x, y, rows, cols, x.stride(0), y.stride(0),
        BLOCK_N=BLOCK_N, ROWS=ROWS_PER_PROGRAM, num_warps=NUM_WARPS,
    )
    return y
