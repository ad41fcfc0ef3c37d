"""MLA paged decode (16 heads, compressed KV 512, rope key 64, page size 1), parameterised for the offline search
(render_template fills in the placeholders).

VARIANT picks the algorithm:
- single: one program per sequence handles all 16 heads, walks the whole sequence with an online softmax (base 2)
  and accumulates P Kc into a [16, 512] fp32 tile. Only `batch` programs: a batch of one runs on one SM.
- split_kv: flash-decoding. Each sequence's pages are cut into NUM_SPLITS chunks (each a multiple of BLOCK_N, so
  short sequences leave later chunks empty), one program per (sequence, chunk) writes normalised partial outputs and
  their base-2 lse for the 16 heads, and a second kernel merges the chunks per (sequence, head). More parallelism for
  small batches and long sequences, at the cost of a second launch and a round trip of the partials through memory.

DOT_DTYPE: "float32" gives the dots fp32 operands (bf16 inputs are exact in fp32 and TF32; P is rounded to TF32 on
the GPU); "bfloat16" keeps q and the cache tiles in bf16 and rounds P to bf16 (as FlashInfer's MLA kernels do),
halving register and shared-memory use for the tiles. Triton's CPU interpreter mishandles bf16 tl.dot (it multiplies
the raw bits), so under TRITON_INTERPRET=1 the kernel always uses fp32 operands.
"""

import math
import os

import torch
import triton
import triton.language as tl

VARIANT = "{{VARIANT}}"
BLOCK_N = {{BLOCK_N}}
NUM_SPLITS = {{NUM_SPLITS}}
NUM_WARPS = {{NUM_WARPS}}
NUM_STAGES = {{NUM_STAGES}}
DOT_DTYPE = "{{DOT_DTYPE}}"

_BF16_DOT = DOT_DTYPE == "bfloat16" and os.environ.get("TRITON_INTERPRET") != "1"
_INV_LN2 = 1.0 / math.log(2.0)
_MERGE_D = 128  # the merge kernel walks the 512 output columns in slices of this width


@triton.jit
def _attend(qn_ptr, qp_ptr, ckv_ptr, kpe_ptr, indices_ptr, b, lo, hi, qk_scale,
            stride_qnb, stride_qnh, stride_qpb, stride_qph, stride_ckv, stride_kpe,
            NUM_HEADS: tl.constexpr, CKV_DIM: tl.constexpr, KPE_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
            BF16_DOT: tl.constexpr):
    """Online softmax over the tokens at kv_indices[lo:hi]: (running max, running sum, unnormalised output)."""
    h = tl.arange(0, NUM_HEADS)
    dc = tl.arange(0, CKV_DIM)
    dp = tl.arange(0, KPE_DIM)
    n = tl.arange(0, BLOCK_N)
    qn = tl.load(qn_ptr + b * stride_qnb + h[:, None] * stride_qnh + dc[None, :])
    qp = tl.load(qp_ptr + b * stride_qpb + h[:, None] * stride_qph + dp[None, :])
    if not BF16_DOT:
        qn = qn.to(tl.float32)
        qp = qp.to(tl.float32)
    m = tl.full([NUM_HEADS], -float("inf"), tl.float32)
    l = tl.zeros([NUM_HEADS], tl.float32)
    acc = tl.zeros([NUM_HEADS, CKV_DIM], tl.float32)
    for off in range(lo, hi, BLOCK_N):
        idx = off + n
        nmask = idx < hi
        page = tl.load(indices_ptr + idx, mask=nmask, other=0).to(tl.int64)
        kc = tl.load(ckv_ptr + page[:, None] * stride_ckv + dc[None, :], mask=nmask[:, None], other=0.0)
        kp = tl.load(kpe_ptr + page[:, None] * stride_kpe + dp[None, :], mask=nmask[:, None], other=0.0)
        if not BF16_DOT:
            kc = kc.to(tl.float32)
            kp = kp.to(tl.float32)
        s = (tl.dot(qn, tl.trans(kc)) + tl.dot(qp, tl.trans(kp))) * qk_scale  # [H, BLOCK_N], base-2 units
        s = tl.where(nmask[None, :], s, -float("inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))  # finite: every block has at least one real token
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(kc.dtype), kc)
        m = m_new
    return m, l, acc


@triton.jit
def _single(qn_ptr, qp_ptr, ckv_ptr, kpe_ptr, indptr_ptr, indices_ptr, o_ptr, lse_ptr, qk_scale,
            stride_qnb, stride_qnh, stride_qpb, stride_qph, stride_ckv, stride_kpe, stride_ob, stride_oh, stride_lb,
            NUM_HEADS: tl.constexpr, CKV_DIM: tl.constexpr, KPE_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
            BF16_DOT: tl.constexpr):
    b = tl.program_id(0)
    start = tl.load(indptr_ptr + b)
    end = tl.load(indptr_ptr + b + 1)
    m, l, acc = _attend(qn_ptr, qp_ptr, ckv_ptr, kpe_ptr, indices_ptr, b, start, end, qk_scale,
                        stride_qnb, stride_qnh, stride_qpb, stride_qph, stride_ckv, stride_kpe,
                        NUM_HEADS, CKV_DIM, KPE_DIM, BLOCK_N, BF16_DOT)
    nonempty = l > 0.0
    safe_l = tl.where(nonempty, l, 1.0)
    h = tl.arange(0, NUM_HEADS)
    dc = tl.arange(0, CKV_DIM)
    tl.store(o_ptr + b * stride_ob + h[:, None] * stride_oh + dc[None, :], (acc / safe_l[:, None]).to(tl.bfloat16))
    tl.store(lse_ptr + b * stride_lb + h, tl.where(nonempty, m + tl.log2(safe_l), -float("inf")))


@triton.jit
def _split(qn_ptr, qp_ptr, ckv_ptr, kpe_ptr, indptr_ptr, indices_ptr, mo_ptr, mlse_ptr, qk_scale,
           stride_qnb, stride_qnh, stride_qpb, stride_qph, stride_ckv, stride_kpe,
           NUM_HEADS: tl.constexpr, CKV_DIM: tl.constexpr, KPE_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
           NUM_SPLITS: tl.constexpr, BF16_DOT: tl.constexpr):
    """Partials: mo [B, H, NUM_SPLITS, 512] (normalised chunk outputs), mlse [B, H, NUM_SPLITS] (chunk lse, base 2)."""
    b = tl.program_id(0)
    split = tl.program_id(1)
    start = tl.load(indptr_ptr + b)
    end = tl.load(indptr_ptr + b + 1)
    chunk = tl.cdiv(tl.cdiv(end - start, NUM_SPLITS), BLOCK_N) * BLOCK_N
    lo = tl.minimum(start + split * chunk, end)
    hi = tl.minimum(lo + chunk, end)
    m, l, acc = _attend(qn_ptr, qp_ptr, ckv_ptr, kpe_ptr, indices_ptr, b, lo, hi, qk_scale,
                        stride_qnb, stride_qnh, stride_qpb, stride_qph, stride_ckv, stride_kpe,
                        NUM_HEADS, CKV_DIM, KPE_DIM, BLOCK_N, BF16_DOT)
    nonempty = l > 0.0
    safe_l = tl.where(nonempty, l, 1.0)
    h = tl.arange(0, NUM_HEADS)
    dc = tl.arange(0, CKV_DIM)
    row = (b * NUM_HEADS + h) * NUM_SPLITS + split
    tl.store(mo_ptr + row[:, None].to(tl.int64) * CKV_DIM + dc[None, :], acc / safe_l[:, None])
    tl.store(mlse_ptr + row, tl.where(nonempty, m + tl.log2(safe_l), -float("inf")))


@triton.jit
def _merge(mo_ptr, mlse_ptr, o_ptr, lse_ptr, stride_ob, stride_oh, stride_lb,
           CKV_DIM: tl.constexpr, NUM_HEADS: tl.constexpr, NUM_SPLITS: tl.constexpr, MERGE_D: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.arange(0, NUM_SPLITS)
    d = tl.arange(0, MERGE_D)
    row = (b * NUM_HEADS + h) * NUM_SPLITS + s
    part_lse = tl.load(mlse_ptr + row)
    top = tl.max(part_lse, axis=0)
    top = tl.where(top == -float("inf"), 0.0, top)  # all chunks empty: every weight below is 0, not NaN
    w = tl.exp2(part_lse - top)
    total = tl.sum(w, axis=0)
    nonempty = total > 0.0
    safe = tl.where(nonempty, total, 1.0)
    for d0 in tl.static_range(0, CKV_DIM, MERGE_D):
        part_o = tl.load(mo_ptr + row[:, None].to(tl.int64) * CKV_DIM + d0 + d[None, :])
        out = tl.sum(w[:, None] * part_o, axis=0) / safe
        tl.store(o_ptr + b * stride_ob + h * stride_oh + d0 + d, out.to(tl.bfloat16))
    tl.store(lse_ptr + b * stride_lb + h, tl.where(nonempty, top + tl.log2(safe), -float("inf")))


def run(q_nope, q_pe, ckv_cache, kpe_cache, kv_indptr, kv_indices, sm_scale):
    q_nope = q_nope.contiguous()
    q_pe = q_pe.contiguous()
    batch, num_heads, ckv_dim = q_nope.shape
    kpe_dim = q_pe.shape[-1]
    ckv = ckv_cache.contiguous().view(-1, ckv_dim)  # page size 1: page id = token row
    kpe = kpe_cache.contiguous().view(-1, kpe_dim)
    output = torch.empty(batch, num_heads, ckv_dim, dtype=torch.bfloat16, device=q_nope.device)
    lse = torch.empty(batch, num_heads, dtype=torch.float32, device=q_nope.device)
    qk_scale = float(sm_scale) * _INV_LN2
    strides = (q_nope.stride(0), q_nope.stride(1), q_pe.stride(0), q_pe.stride(1), ckv.stride(0), kpe.stride(0))
    dims = dict(NUM_HEADS=num_heads, CKV_DIM=ckv_dim, KPE_DIM=kpe_dim, BLOCK_N=BLOCK_N, BF16_DOT=_BF16_DOT)
    if VARIANT == "single":
        _single[(batch,)](
            q_nope, q_pe, ckv, kpe, kv_indptr, kv_indices, output, lse, qk_scale, *strides,
            output.stride(0), output.stride(1), lse.stride(0), **dims, num_warps=NUM_WARPS, num_stages=NUM_STAGES,
        )
        return output, lse
    mid_o = torch.empty(batch, num_heads, NUM_SPLITS, ckv_dim, dtype=torch.float32, device=q_nope.device)
    mid_lse = torch.empty(batch, num_heads, NUM_SPLITS, dtype=torch.float32, device=q_nope.device)
    _split[(batch, NUM_SPLITS)](
        q_nope, q_pe, ckv, kpe, kv_indptr, kv_indices, mid_o, mid_lse, qk_scale, *strides, **dims,
        NUM_SPLITS=NUM_SPLITS, num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )
    _merge[(batch, num_heads)](
        mid_o, mid_lse, output, lse, output.stride(0), output.stride(1), lse.stride(0),
        CKV_DIM=ckv_dim, NUM_HEADS=num_heads, NUM_SPLITS=NUM_SPLITS, MERGE_D=_MERGE_D, num_warps=4,
    )
    return output, lse
