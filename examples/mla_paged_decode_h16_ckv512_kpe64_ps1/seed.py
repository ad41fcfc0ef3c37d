"""MLA paged decode (16 heads, compressed KV 512, rope key 64, page size 1): a plain Triton kernel, the seed.

One program per sequence handles all 16 heads: it walks the sequence's pages BLOCK_N at a time (gathering one
compressed-KV row and one rope-key row per page id), computes logits = q_nope Kc^T + q_pe Kp^T, keeps an online
softmax in base 2 and accumulates P Kc into a [16, 512] fp32 tile. Dots take fp32 operands (bf16 values are exact
in fp32 and TF32). No split over the KV length: a batch of one long sequence runs on one SM, which is the obvious
thing to improve; the [16, 512] accumulator and the [BLOCK_N, 512] tile also make register pressure the limit.
"""

import math

import torch
import triton
import triton.language as tl

BLOCK_N = 16
NUM_WARPS = 8


@triton.jit
def _mla_decode(qn_ptr, qp_ptr, ckv_ptr, kpe_ptr, indptr_ptr, indices_ptr, o_ptr, lse_ptr, qk_scale,
                stride_qnb, stride_qnh, stride_qpb, stride_qph, stride_ckv, stride_kpe, stride_ob, stride_oh, stride_lb,
                NUM_HEADS: tl.constexpr, CKV_DIM: tl.constexpr, KPE_DIM: tl.constexpr, BLOCK_N: tl.constexpr):
    b = tl.program_id(0)
    start = tl.load(indptr_ptr + b)
    end = tl.load(indptr_ptr + b + 1)
    h = tl.arange(0, NUM_HEADS)
    dc = tl.arange(0, CKV_DIM)
    dp = tl.arange(0, KPE_DIM)
    n = tl.arange(0, BLOCK_N)
    qn = tl.load(qn_ptr + b * stride_qnb + h[:, None] * stride_qnh + dc[None, :]).to(tl.float32)
    qp = tl.load(qp_ptr + b * stride_qpb + h[:, None] * stride_qph + dp[None, :]).to(tl.float32)
    m = tl.full([NUM_HEADS], -float("inf"), tl.float32)
    l = tl.zeros([NUM_HEADS], tl.float32)
    acc = tl.zeros([NUM_HEADS, CKV_DIM], tl.float32)
    for off in range(start, end, BLOCK_N):
        idx = off + n
        nmask = idx < end
        page = tl.load(indices_ptr + idx, mask=nmask, other=0).to(tl.int64)
        kc = tl.load(ckv_ptr + page[:, None] * stride_ckv + dc[None, :], mask=nmask[:, None], other=0.0).to(tl.float32)
        kp = tl.load(kpe_ptr + page[:, None] * stride_kpe + dp[None, :], mask=nmask[:, None], other=0.0).to(tl.float32)
        s = (tl.dot(qn, tl.trans(kc)) + tl.dot(qp, tl.trans(kp))) * qk_scale  # [H, BLOCK_N], base-2 units
        s = tl.where(nmask[None, :], s, -float("inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))  # finite: every block has at least one real token
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p, kc)
        m = m_new
    nonempty = l > 0.0
    safe_l = tl.where(nonempty, l, 1.0)
    out = acc / safe_l[:, None]  # an empty sequence: acc = 0, so output 0
    tl.store(o_ptr + b * stride_ob + h[:, None] * stride_oh + dc[None, :], out.to(tl.bfloat16))
    tl.store(lse_ptr + b * stride_lb + h, tl.where(nonempty, m + tl.log2(safe_l), -float("inf")))


def run(q_nope, q_pe, ckv_cache, kpe_cache, kv_indptr, kv_indices, sm_scale):
    q_nope = q_nope.contiguous()
    q_pe = q_pe.contiguous()
    batch, num_heads, ckv_dim = q_nope.shape
    kpe_dim = q_pe.shape[-1]
    ckv = ckv_cache.contiguous().view(-1, ckv_dim)  # page size 1: page id = token row
    kpe = kpe_cache.contiguous().view(-1, kpe_dim)
    output = torch.empty(batch, num_heads, ckv_dim, dtype=torch.bfloat16, device=q_nope.device)
    lse = torch.empty(batch, num_heads, dtype=torch.float32, device=q_nope.device)
    _mla_decode[(batch,)](
        q_nope, q_pe, ckv, kpe, kv_indptr, kv_indices, output, lse, float(sm_scale) / math.log(2.0),
        q_nope.stride(0), q_nope.stride(1), q_pe.stride(0), q_pe.stride(1), ckv.stride(0), kpe.stride(0),
        output.stride(0), output.stride(1), lse.stride(0),
        NUM_HEADS=num_heads, CKV_DIM=ckv_dim, KPE_DIM=kpe_dim, BLOCK_N=BLOCK_N, num_warps=NUM_WARPS,
    )
    return output, lse
